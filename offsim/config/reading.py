"""What offsim understood from a user's strategy file (DeepSpeed, Accelerate, Megatron-Core).

A foreign file is read into a :class:`Reading`: the :class:`~offsim.config.strategy.Strategy` it
maps onto, every input value with where it came from (the file, the library's default, ``"auto"``
resolved from the workload), the keys offsim does not model, the places where the mapping is an
approximation, and the workload fields (batch, precision) the file sets. ``offsim strategies
--explain`` prints it; :func:`~offsim.config.run.make_run_config` applies the workload fields and
keeps the notes on the run.
"""

from __future__ import annotations

import datetime as dt
import difflib
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from offsim.config.errors import format_validation_error
from offsim.config.strategy import Strategy
from offsim.errors import ConfigError


@dataclass(frozen=True)
class Setting:
    """One resolved input value.

    Attributes:
        key: the key as the file's format spells it (dotted for nested keys).
        value: the value offsim uses.
        origin: ``file``, ``default`` (the library's own, with the source file), ``auto`` (how
            it was resolved) or ``derived`` (computed from other keys).
        detail: the source file of a default, or the rule that resolved an ``auto``.
    """

    key: str
    value: Any
    origin: str
    detail: str = ""


@dataclass(frozen=True)
class Reading:
    """A user's strategy file as offsim understood it.

    Attributes:
        source: the file.
        fmt: ``ds_config``, ``accelerate``, ``megatron`` or ``offsim``.
        strategy: the strategy simulated.
        settings: every input value the mapping read, with its origin.
        ignored: ``key: why`` for each key offsim does not model (listed once each).
        approximations: where the mapping is not exact, and how.
        training: ``workload.training`` fields the file sets (``micro_batch``,
            ``grad_accumulation``).
        precision: ``workload.precision`` fields the file sets.
    """

    source: str
    fmt: str
    strategy: Strategy
    settings: tuple[Setting, ...] = ()
    ignored: tuple[str, ...] = ()
    approximations: tuple[str, ...] = ()
    training: dict[str, int] = field(default_factory=dict)
    precision: dict[str, str] = field(default_factory=dict)

    def notes(self) -> tuple[str, ...]:
        """One line per ignored key and per approximation, naming the file."""
        name = Path(self.source).name
        return (tuple(f"{name}: ignored: {line}" for line in self.ignored)
                + tuple(f"{name}: approximated: {line}" for line in self.approximations))


def nearest(word: str, known: Iterable[str]) -> str | None:
    """The known key closest to ``word`` (difflib), or ``None`` when nothing is close."""
    found = difflib.get_close_matches(word, list(known), n=1, cutoff=0.5)
    return found[0] if found else None


def unknown_key_error(source: str, key: str, known: Iterable[str], what: str) -> ConfigError:
    """The error for a key offsim does not know: the file, the key and the nearest known key."""
    leaf = key.rsplit(".", 1)[-1]
    prefix = key[: -len(leaf)]
    best = nearest(leaf, [k.rsplit(".", 1)[-1] for k in known if k.startswith(prefix)
                          and "." not in k[len(prefix):]])
    hint = f"; did you mean '{prefix}{best}'?" if best else ""
    return ConfigError(f"{source}: unknown {what} key '{key}'{hint}")


def strategy_name(path: Path, fallback: str) -> str:
    """A strategy name from a file name: lowercased, other characters turned into hyphens."""
    name = re.sub(r"[^a-z0-9._-]+", "-", path.stem.lower()).lstrip("._-")
    return name or fallback


def build_strategy(fields: dict[str, Any], source: str, fmt_words: str, notes: str) -> Strategy:
    """Validate the mapped ``fields`` into a :class:`Strategy` with a ``derived`` provenance.

    A mapping the schema refuses (e.g. a combination offsim cannot simulate) is a
    :class:`ConfigError` naming the file.
    """
    data = {
        "name": strategy_name(Path(source), "user-strategy"),
        "description": f"{fmt_words} read from {source}",
        "provenance": {"kind": "derived", "source": source, "date": dt.date.today().isoformat(),
                       "notes": notes or None},
        **fields,
    }
    try:
        return Strategy.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"{source}: maps onto a strategy offsim refuses:\n"
                          + format_validation_error(source, exc)) from None
