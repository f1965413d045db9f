"""Inputs a validation case's own source leaves unknown, with the range they may take (issue 23
part 3): the ``assumed`` block of a case in ``validation/cases.yaml``.

A profile or workload marks its own assumed values (:mod:`offsim.config.assumed`); what only one
case leaves open (its micro-batch, the DeepSpeed release of its source's era, a buffer count no
log prints) is marked on the case, with a dotted path into the case's run (``hardware.``,
``workload.`` or ``strategy.``, after the case's overrides)::

    assumed:
      workload.training.micro_batch: {choices: [8, 16, 32, 64], why: "..."}
      strategy.z3_host_grads: {choices: [flat_gpu_check, flat_host_check], weights: [12, 23], why: "..."}
      hardware.nvme.read_gb_per_s: {range: [3.0, 6.0], why: "..."}

``range`` is ``[low, high]`` in the field's units and must hold the case's value; ``scale`` is
``[low, high]`` as factors of it (holding 1); both are drawn log-uniformly (a whole number is
rounded, at least 1). ``choices`` is a discrete range, drawn with ``weights`` (uniform when none):
each choice is the field's value, or, under a key that is a name rather than a path, a mapping of
several paths to their values (one DeepSpeed release sets several switches, each a field of
:class:`~offsim.config.strategy.Strategy` named in :mod:`offsim.plan.deepspeed_versions`). Every
draw is re-validated by its file's schema, so a choice the field does not allow is an error of the
draw (it does not fit), and :func:`check_case_assumed` rejects it when the cases are loaded.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import Field, model_validator

from offsim.config.base import Frozen

#: The parts of a run a path may start with.
PARTS = ("hardware", "workload", "strategy")


def is_path(dotted: str) -> bool:
    """``dotted`` starts with ``hardware.``, ``workload.`` or ``strategy.`` and names a field."""
    return dotted.split(".")[0] in PARTS and "." in dotted


def check_choices(choices: Sequence[Any], weights: Sequence[float] | None, paths: Sequence[str]) -> None:
    """``weights`` (when given) match ``choices`` one to one and are positive; a mapping choice
    sets exactly ``paths``; raises ValueError saying which rule is broken."""
    if weights is not None and (len(weights) != len(choices) or any(w <= 0 for w in weights)):
        raise ValueError(f"weights {list(weights)} must be one positive number per choice ({len(choices)})")
    for c in choices:
        if isinstance(c, dict) and set(c) != set(paths):
            raise ValueError(f"choice {c} must set exactly {sorted(paths)}")
        if isinstance(c, list):
            raise ValueError(f"choice {c}: a choice is one value or a mapping of path to value")


class CaseAssumed(Frozen):
    """The range of one input a case's source leaves unknown: in its units (``range``), as
    factors (``scale``) or as a discrete choice (``choices``, with optional ``weights``)."""

    range: tuple[float, float] | None = Field(
        default=None, strict=False, description="[low, high] in the field's own units, holding the case's value")
    scale: tuple[float, float] | None = Field(
        default=None, strict=False, description="[low, high] as factors of the case's value (1 inside)")
    choices: list[Any] | None = Field(
        default=None, min_length=1, description="the values the source allows (or mappings of path to value)")
    weights: list[float] | None = Field(default=None, description="one per choice, e.g. releases per behaviour")
    why: str = Field(min_length=1, description="where the range comes from")

    @model_validator(mode="after")
    def _one_form(self) -> CaseAssumed:
        forms = [f for f in (self.range, self.scale, self.choices) if f is not None]
        if len(forms) != 1:
            raise ValueError("give exactly one of range, scale and choices")
        if self.weights is not None and self.choices is None:
            raise ValueError("weights go with choices")
        for pair, name in ((self.range, "range"), (self.scale, "scale")):
            if pair is not None and not 0 < pair[0] <= pair[1]:
                raise ValueError(f"{name} [{pair[0]}, {pair[1]}] must have 0 < low <= high")
        if self.scale is not None and not self.scale[0] <= 1 <= self.scale[1]:
            raise ValueError(f"scale [{self.scale[0]}, {self.scale[1]}] must hold 1")
        return self

    def paths(self, key: str) -> list[str]:
        """The fields this entry draws: ``key``, or the keys of its mapping choices."""
        first = (self.choices or [None])[0]
        return list(first) if isinstance(first, dict) else [key]


def check_keys(assumed: Mapping[str, CaseAssumed]) -> None:
    """Each key is a path (or names an entry of mapping choices whose keys are paths), and the
    choices are consistent; raises ValueError naming ``assumed.<key>``."""
    for key, r in assumed.items():
        paths = r.paths(key)
        bad = [p for p in paths if not is_path(p)]
        if bad:
            raise ValueError(f"assumed.{key}: '{bad[0]}' must start with hardware., workload. or strategy.")
        if r.choices is not None:
            try:
                check_choices(r.choices, r.weights, paths)
            except ValueError as exc:
                raise ValueError(f"assumed.{key}: {exc}") from None
        elif paths != [key]:
            raise ValueError(f"assumed.{key}: range and scale take a path as the key")


def field_of(models: Mapping[str, Any], dotted: str) -> tuple[bool, Any]:
    """Whether ``dotted`` names a field of ``models`` (or a key of a dict field), and its value."""
    part, *keys = dotted.split(".")
    node: Any = models.get(part)
    for k in keys:
        if isinstance(node, dict) and k in node:
            node = node[k]
        elif not isinstance(node, dict) and k in getattr(type(node), "model_fields", {}):
            node = getattr(node, k)
        else:
            return False, None
    return True, node


def check_case_assumed(assumed: Mapping[str, CaseAssumed], models: Mapping[str, Any]) -> None:
    """Against the case's run (``models``: its profile, workload and strategy after the overrides):
    each path names a field; a ``range`` or ``scale`` one a number and a ``range`` holds it; a
    ``choices`` entry only values the field's schema accepts. Raises ValueError naming
    ``assumed.<key>``."""
    for key, r in assumed.items():
        for path in r.paths(key):
            found, value = field_of(models, path)
            if not found:
                raise ValueError(f"assumed.{key}: '{path}' is no field of the case's {path.split('.')[0]}")
            if r.choices is not None:
                _check_choice_values(key, r, path, models)
            elif isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError(f"assumed.{key}: {value!r} is not a number (range and scale need one)")
            elif r.range is not None and not r.range[0] <= value <= r.range[1]:
                raise ValueError(f"assumed.{key}: range {list(r.range)} does not hold the case's value {value}")


def _check_choice_values(key: str, r: CaseAssumed, path: str, models: Mapping[str, Any]) -> None:
    """Each choice's value at ``path`` passes the schema of the file it goes into."""
    from pydantic import ValidationError

    part, *keys = path.split(".")
    model = models[part]
    for choice in r.choices or []:
        value = choice[path] if isinstance(choice, dict) else choice
        data = model.model_dump()
        data.pop("assumed", None)
        node = data
        for k in keys[:-1]:
            node = node[k]
        node[keys[-1]] = value
        try:
            type(model).model_validate(data)
        except ValidationError as exc:
            msg = str(exc.errors()[0]["msg"]).removeprefix("Value error, ")
            raise ValueError(f"assumed.{key}: choice {value!r} is not allowed for {path}: {msg}") from None
