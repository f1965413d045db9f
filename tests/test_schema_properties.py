"""Properties of the input schemas (issue 20): a non-finite number anywhere, or a number outside
a field's declared range, is refused at load time with the file and the field named.

The fields come from every shipped hardware profile, workload and strategy file (so every numeric
field those files use, nested policy configs and curve points included); the range of a field
comes from its Pydantic constraints (``gt``, ``ge``, ``lt``, ``le``).
"""

from __future__ import annotations

import math
from functools import cache
from typing import Any, get_args

import annotated_types as at
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from offsim.config.hardware import HardwareProfile
from offsim.config.loading import read_yaml, shipped_files, validate_data
from offsim.config.strategy import Strategy
from offsim.config.workload import Workload
from offsim.errors import ConfigError

MODELS: dict[str, type[BaseModel]] = {"hardware": HardwareProfile, "workload": Workload, "strategy": Strategy}
Path_ = tuple[str | int, ...]


def _numeric_paths(doc: Any, path: Path_ = ()) -> list[Path_]:
    """Paths of every int or float leaf (bools aside) in a loaded document."""
    if isinstance(doc, dict):
        return [p for k, v in doc.items() for p in _numeric_paths(v, (*path, k))]
    if isinstance(doc, list):
        return [p for i, v in enumerate(doc) for p in _numeric_paths(v, (*path, i))]
    return [path] if isinstance(doc, int | float) and not isinstance(doc, bool) else []


@cache
def _documents() -> list[tuple[str, str, dict[str, Any]]]:
    return [(kind, name, read_yaml(path)) for kind in MODELS for name, path in shipped_files(kind).items()]


@cache
def _leaves() -> list[tuple[str, str, Path_]]:
    return [(kind, name, p) for kind, name, doc in _documents() for p in _numeric_paths(doc)]


def _replace(doc: Any, path: Path_, value: Any) -> Any:
    if not path:
        return value
    head, rest = path[0], path[1:]
    if isinstance(doc, dict):
        return {**doc, head: _replace(doc[head], rest, value)}
    return [_replace(v, rest, value) if i == head else v for i, v in enumerate(doc)]


def _doc(kind: str, name: str) -> dict[str, Any]:
    return next(d for k, n, d in _documents() if k == kind and n == name)


def test_the_shipped_files_have_many_numeric_fields() -> None:
    kinds = {kind for kind, _, _ in _leaves()}
    assert kinds == set(MODELS) and len(_leaves()) > 500


@settings(max_examples=300, deadline=None)
@given(leaf=st.sampled_from(_leaves()), value=st.sampled_from([math.nan, math.inf, -math.inf]))
def test_a_non_finite_number_in_any_field_is_refused(leaf: tuple[str, str, Path_], value: float) -> None:
    kind, name, path = leaf
    bad = _replace(_doc(kind, name), path, value)
    with pytest.raises(ConfigError) as err:
        validate_data(MODELS[kind], bad, f"{name}.yaml")
    message = str(err.value)
    assert message.startswith(f"{name}.yaml: ")
    loc = message.split(": ")[1].split(".")  # a tagged union adds its tag (policies.eviction.static...)
    # a key may itself hold dots (an `assumed:` block's "gpu.peak_tflops.bf16"): compare dot-parts
    want = [part for p in path for part in str(p).split(".")]
    assert [part for part in loc if part in set(want)] == want, message


def _field_info(model: type[BaseModel], doc: dict[str, Any], path: Path_) -> Any:
    """The Pydantic FieldInfo of ``path`` (None inside lists, dicts of numbers, or unknown unions)."""
    info = None
    for i, key in enumerate(path):
        if not isinstance(key, str) or model is None or key not in model.model_fields:
            return None
        info = model.model_fields[key]
        if i < len(path) - 1:
            model = _submodel(info.annotation, _at(doc, path[: i + 1]))
    return info


def _submodel(annotation: Any, value: Any) -> Any:
    """The model class a nested mapping validates against (a tagged union by its ``kind``)."""
    candidates = [a for a in (get_args(annotation) or (annotation,)) if isinstance(a, type)]
    for arg in get_args(annotation):
        candidates += [a for a in get_args(arg) if isinstance(a, type)]
    models = [c for c in candidates if issubclass(c, BaseModel)]
    if isinstance(value, dict) and "kind" in value and len(models) > 1:
        models = [m for m in models if m.model_fields.get("kind") and m.model_fields["kind"].default == value["kind"]]
    return models[0] if len(models) == 1 else None


def _at(doc: Any, path: Path_) -> Any:
    for key in path:
        doc = doc[key]
    return doc


def _outside(meta: list[Any]) -> list[float]:
    """Values just outside the declared bounds."""
    out: list[float] = []
    for m in meta:
        if isinstance(m, at.Gt):
            out += [float(m.gt), float(m.gt) - 1.0]
        elif isinstance(m, at.Ge):
            out.append(float(m.ge) - 1.0)
        elif isinstance(m, at.Lt):
            out += [float(m.lt), float(m.lt) + 1.0]
        elif isinstance(m, at.Le):
            out.append(float(m.le) + 1.0)
    return out


@cache
def _bounded() -> list[tuple[str, str, Path_, float]]:
    """Every (file, field, value just outside its range) over the shipped files."""
    rows = []
    for kind, name, path in _leaves():
        info = _field_info(MODELS[kind], _doc(kind, name), path)
        if info is None:
            continue
        for value in _outside(info.metadata):
            rows.append((kind, name, path, value))
    return rows


def test_many_fields_declare_a_range() -> None:
    assert len({(k, p) for k, _, p, _ in _bounded()}) > 50


@settings(max_examples=300, deadline=None)
@given(case=st.sampled_from(_bounded()))
def test_a_number_outside_a_fields_range_is_refused(case: tuple[str, str, Path_, float]) -> None:
    kind, name, path, value = case
    current = _at(_doc(kind, name), path)
    bad = _replace(_doc(kind, name), path, int(value) if isinstance(current, int) and value.is_integer() else value)
    with pytest.raises(ConfigError) as err:
        validate_data(MODELS[kind], bad, f"{name}.yaml")
    message = str(err.value)
    loc = message.split(": ")[1].split(".")  # a tagged union adds its tag (policies.eviction.static...)
    assert message.startswith(f"{name}.yaml: ")
    assert [part for part in loc if part in {str(p) for p in path}] == [str(p) for p in path], message
