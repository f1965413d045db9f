"""Load profiles, workloads and strategies by shipped name or by path.

A *name* is a file stem under the shipped data folders (``hardware_profiles/``, ``workloads/``,
``strategies/``; searched recursively, so ``measured/<name>`` works too); anything that looks like
a path (has a suffix or a separator, or exists) is read as a file. Errors name the file, the
field and what was expected, and are :class:`~offsim.errors.ConfigError`.
"""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from offsim.config.errors import format_validation_error
from offsim.config.hardware import HardwareProfile
from offsim.config.strategy import Strategy
from offsim.config.workload import Workload
from offsim.errors import ConfigError

__all__ = [
    "format_validation_error",  # re-exported: it lives in offsim.config.errors
    "load_profile",
    "load_strategy",
    "load_workload",
    "read_yaml",
    "resolve_path",
    "shipped_files",
    "validate_data",
]

M = TypeVar("M", bound=BaseModel)

KIND_DIRS = {"hardware": "hardware_profiles", "workload": "workloads", "strategy": "strategies"}


class _Loader(yaml.SafeLoader):
    """SafeLoader that also reads ``1e9`` and ``5e-3`` as floats (YAML 1.2 behaviour)."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(
        r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
        |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
        |\.[0-9_]+(?:[eE][-+][0-9]+)?
        |[-+]?\.(?:inf|Inf|INF)
        |\.(?:nan|NaN|NAN))$""",
        re.X,
    ),
    list("-+0123456789."),
)


def data_roots() -> list[Path]:
    """Folders that hold the shipped data: the installed copy, then a source checkout."""
    here = Path(__file__).resolve().parent.parent
    return [here / "_data", here.parent]


def data_dir(kind: str) -> Path:
    """The shipped folder for ``kind`` (``hardware``, ``workload`` or ``strategy``)."""
    sub = KIND_DIRS[kind]
    for root in data_roots():
        if (root / sub).is_dir():
            return root / sub
    raise ConfigError(f"shipped {sub}/ folder not found (looked in {[str(r) for r in data_roots()]})")


def shipped_files(kind: str) -> dict[str, Path]:
    """Shipped files of ``kind`` by name (file stem)."""
    base = data_dir(kind)
    return {p.stem: p for p in sorted(base.rglob("*.yaml"))}


def read_yaml(path: Path) -> Any:
    """Parse a YAML or JSON file; a syntax error is a :class:`ConfigError` naming the file."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read ({exc.strerror})") from exc
    try:
        if path.suffix == ".json":
            return json.loads(text)
        return yaml.load(text, Loader=_Loader)
    except (yaml.YAMLError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{path}: not valid YAML/JSON: {exc}") from exc


def validate_data(model: type[M], data: Any, source: str) -> M:
    """Validate ``data`` into ``model``; errors become a :class:`ConfigError` naming ``source``."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping of fields, got {type(data).__name__}")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(source, exc)) from None


def resolve_path(kind: str, name_or_path: str | Path) -> Path:
    """The file a name or path refers to."""
    text = str(name_or_path)
    p = Path(text)
    if p.suffix in (".yaml", ".yml", ".json") or "/" in text or p.exists():
        if not p.exists():
            raise ConfigError(f"{text}: no such file")
        return p
    files = shipped_files(kind)
    if text not in files:
        raise ConfigError(
            f"unknown {kind} '{text}'. Shipped: {', '.join(sorted(files))} (or give a path to a YAML file)"
        )
    return files[text]


def _load(kind: str, model: type[M], name_or_path: str | Path) -> M:
    path = resolve_path(kind, name_or_path)
    data = read_yaml(path)
    if kind == "workload" and path.suffix == ".json" and isinstance(data, dict) and "name" not in data:
        from offsim.config.hf import workload_from_hf_config

        return workload_from_hf_config(data, path)  # type: ignore[return-value]
    obj = validate_data(model, data, str(path))
    if path.stem != getattr(obj, "name", path.stem) and path.parent.resolve() == data_dir(kind).resolve():
        raise ConfigError(f"{path}: name: '{obj.name}' must equal the file stem '{path.stem}'")  # type: ignore[attr-defined]
    return obj


@cache
def load_profile(name_or_path: str | Path) -> HardwareProfile:
    """Load a hardware profile by shipped name or path."""
    return _load("hardware", HardwareProfile, name_or_path)


@cache
def load_workload(name_or_path: str | Path) -> Workload:
    """Load a workload by shipped name or path (a Hugging Face ``config.json`` works too)."""
    return _load("workload", Workload, name_or_path)


@cache
def load_strategy(name_or_path: str | Path) -> Strategy:
    """Load a strategy by shipped name or path."""
    return _load("strategy", Strategy, name_or_path)
