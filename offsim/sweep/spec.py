"""Sweep specs: a base configuration plus axes, validated at load time, expanded into points.

A spec is a YAML file::

    schema_version: 1
    name: dram-vs-nvme
    base: {hardware: rtx4090-pcie4-ws, workload: llama2-70b, strategy: zero-infinity-nvme}
    grid:                          # cartesian product of every axis
      dram_gib: [64, 128, 256]
      nvme_drives: {start: 1, stop: 4, step: 1}     # inclusive range
      strategy.prefetch_depth: [1, 2, 4]
    points:                        # optional explicit list (crossed with the grid when both exist)
      - {gpu: rtx4090-pcie4-ws}
      - {gpu: h100-sxm5-gen5, hardware.gpu.price_usd: 25000}
    set:                           # fixed overrides applied to the base of every point
      hardware.dram.price_usd_per_gib: 3.0
    cost: {lifetime_years: 3, utilisation: 1.0, usd_per_kwh: 0.15}

Axis keys are aliases or dotted paths (see :mod:`offsim.sweep.overrides`). What is refused at
load time, with the axis named: an unknown alias or field, two axes writing the same field, a
value of the wrong type or out of range for its field (each value is applied to the base alone
and validated with the same Pydantic models as the data files), a file that does not load, and a
sweep of more than :data:`MAX_POINTS` points unless ``yes=True``. A rule that only a *combination*
of values breaks (e.g. a strategy that needs NVMe on a profile without it) is not known until the
point is built; that point is then recorded with its error and the sweep goes on.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator

from offsim import __version__
from offsim.config.base import Frozen
from offsim.config.errors import format_validation_error
from offsim.config.loading import (
    load_profile,
    load_strategy,
    load_workload,
    read_strategy,
    read_yaml,
)
from offsim.config.reading import Reading
from offsim.config.workload import Workload
from offsim.errors import ConfigError
from offsim.sweep.overrides import (
    SECTION_MODELS,
    Axis,
    Library,
    OverrideError,
    apply_overrides,
    build_section,
    library_refs,
    resolve_axis,
)

#: Largest sweep run without ``--yes``.
MAX_POINTS = 1_000_000

_LOADERS = {"hardware": load_profile, "workload": load_workload, "strategy": load_strategy}


class BaseConfig(Frozen):
    """The configuration every point starts from (names of shipped files or YAML paths)."""

    hardware: str
    workload: str
    strategy: str
    iterations: int = Field(default=3, ge=1, le=1000)
    warmup_iterations: int = Field(default=1, ge=0)


class CostAssumptions(Frozen):
    """Assumptions behind the cost columns (see :mod:`offsim.sweep.cost`).

    Attributes:
        lifetime_years: years over which a machine's purchase price is amortised.
        utilisation: fraction of those hours it trains (idle hours still cost capex).
        usd_per_kwh: electricity price applied to the components' rated power.
    """

    lifetime_years: float = Field(default=3.0, gt=0)
    utilisation: float = Field(default=1.0, gt=0, le=1)
    usd_per_kwh: float = Field(default=0.15, ge=0)


class SweepSpec(Frozen):
    """A sweep file: base configuration, axes as a grid and/or a list of points, cost assumptions."""

    schema_version: Literal[1] = 1
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9._-]*$")
    description: str = ""
    base: BaseConfig
    grid: dict[str, list[Any]] = Field(default_factory=dict)
    points: list[dict[str, Any]] = Field(default_factory=list)
    set: dict[str, Any] = Field(default_factory=dict)
    cost: CostAssumptions = CostAssumptions()

    @field_validator("grid", mode="before")
    @classmethod
    def _grid_lists(cls, grid: Any) -> Any:
        if not isinstance(grid, dict):
            return grid
        out = {}
        for key, values in grid.items():
            vals = expand_range(key, values) if isinstance(values, dict) else values
            if isinstance(vals, list) and not vals:
                raise ValueError(f"axis '{key}' has no values")
            out[key] = vals
        return out

    @field_validator("points")
    @classmethod
    def _points_nonempty(cls, points: list[dict[str, Any]]) -> list[dict[str, Any]]:
        if any(not p for p in points):
            raise ValueError("a point must set at least one axis")
        return points


def expand_range(key: str, spec: Mapping[str, float]) -> list[float]:
    """``{start, stop, step}`` (arithmetic) or ``{start, stop, factor}`` (geometric), stop included."""
    keys = set(spec)
    if keys not in ({"start", "stop", "step"}, {"start", "stop", "factor"}):
        raise ValueError(
            f"axis '{key}': a range is {{start, stop, step}} or {{start, stop, factor}}, got {sorted(keys)}"
        )
    start, stop = spec["start"], spec["stop"]
    integer = all(isinstance(v, int) and not isinstance(v, bool) for v in spec.values())
    out: list[float] = []
    if "step" in spec:
        step = spec["step"]
        if step <= 0:
            raise ValueError(f"axis '{key}': step must be > 0")
        n = math.floor((stop - start) / step + 1e-9) + 1
        out = [start + i * step for i in range(max(0, n))]
    else:
        factor = spec["factor"]
        if factor <= 1 or start <= 0:
            raise ValueError(f"axis '{key}': a geometric range needs start > 0 and factor > 1")
        v = start
        while v <= stop * (1 + 1e-9):
            out.append(v)
            v = v * factor
    if len(out) > MAX_POINTS:
        raise ValueError(f"axis '{key}': range has more than {MAX_POINTS:,} values")
    return [round(v) for v in out] if integer else out


@dataclass(frozen=True)
class Point:
    """One configuration of the sweep.

    Attributes:
        index: position in the spec's expansion order (grid in axis order, then the list).
        point_id: stable hash of the overrides (and of the content of any file they name).
        overrides: axis key -> value.
    """

    index: int
    point_id: str
    overrides: dict[str, Any]


@dataclass
class SweepPlan:
    """A loaded, validated sweep: what the executor needs, in plain data."""

    name: str
    base: dict[str, dict[str, Any]]
    library: Library
    axes: list[Axis]
    points: list[Point]
    cost: CostAssumptions = field(default_factory=CostAssumptions)
    source: str = "<spec>"

    @property
    def axis_keys(self) -> list[str]:
        """Axis keys in spec order (the result table's axis columns)."""
        return [a.key for a in self.axes]

    def fingerprint(self) -> str:
        """Hash of what every point's result depends on besides its overrides."""
        return _digest({"base": self.base, "cost": self.cost.model_dump(), "offsim": __version__})

    def point_set_digest(self) -> str:
        """Hash of the set of point ids (changes when axes or values change)."""
        return _digest(sorted(p.point_id for p in self.points))


def canonical_json(obj: Any) -> str:
    """JSON with sorted keys and no spaces: equal data gives equal text."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)


def _digest(obj: Any, n: int = 16) -> str:
    return hashlib.sha256(canonical_json(obj).encode()).hexdigest()[:n]


def point_id(overrides: Mapping[str, Any], lib: Library) -> str:
    """Stable id of a point: its overrides plus the content of the files they name."""
    refs = {}
    for key, value in overrides.items():
        for kind, name in library_refs(resolve_axis(key), value):
            refs[f"{kind}:{name}"] = _digest([lib.items[kind][name], lib.workload_sets.get(name, {})]
                                             if kind == "strategy" else lib.items[kind][name])
    return _digest({"overrides": dict(overrides), "refs": refs})


# ----------------------------------------------------------------------------- loading
def _resolve_name(name: str, base_dir: Path | None) -> str:
    """A relative path in a spec is read relative to the spec's folder when it exists there."""
    if base_dir is not None and ("/" in name or name.endswith((".yaml", ".yml", ".json"))):
        p = Path(name)
        if not p.is_absolute() and (base_dir / p).exists():
            return str(base_dir / p)
    return name


def _load_section(kind: str, name: str, base_dir: Path | None, what: str) -> dict[str, Any]:
    try:
        return _LOADERS[kind](_resolve_name(name, base_dir)).model_dump()
    except ConfigError as exc:
        raise ConfigError(f"{what}: {exc}") from None


def _read_strategy_file(name: str, base_dir: Path | None, workload: Workload, what: str) -> Reading:
    """A strategy read as ``offsim run`` reads it: a DeepSpeed, Accelerate or Megatron-Core file
    with the workload (``"auto"`` from the model, the batch keys checked against its data
    parallelism)."""
    try:
        return read_strategy(_resolve_name(name, base_dir), workload)
    except ConfigError as exc:
        raise ConfigError(f"{what}: {exc}") from None


def _file_sets(reading: Reading) -> dict[str, dict[str, Any]]:
    """The workload fields a foreign strategy file sets (none for an offsim strategy)."""
    if reading.fmt == "offsim":
        return {}
    return {part: dict(fields) for part, fields in (("training", reading.training),
                                                    ("precision", reading.precision)) if fields}


def _strategy_files(strategies: list[tuple[str, str]], workloads: list[str], base_dir: Path | None,
                    base_wl: Workload) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, dict[str, Any]]]]:
    """Each strategy ``(name, what)`` as a section dict and the workload fields its file sets,
    read with the base workload. A file whose reading depends on the workload (its ``"auto"``
    values, its batch keys against the data parallelism) is refused beside a workload axis whose
    values read it differently: the sweep would apply one reading to every workload."""
    items: dict[str, dict[str, Any]] = {}
    sets: dict[str, dict[str, dict[str, Any]]] = {}
    for name, what in strategies:
        reading = _read_strategy_file(name, base_dir, base_wl, what)
        items[name] = reading.strategy.model_dump()
        if reading.fmt == "offsim":
            continue
        sets[name] = _file_sets(reading)
        for wl_name in workloads:
            other = _read_strategy_file(name, base_dir, load_workload(_resolve_name(wl_name, base_dir)), what)
            if other.strategy.model_dump() != items[name] or _file_sets(other) != sets[name]:
                raise ConfigError(
                    f"{what}: {name} is read differently with workload {wl_name!r} than with the base workload "
                    "(its \"auto\" values or batch keys depend on the model); sweep one workload with it, or "
                    "write numbers in the file")
    return items, sets


def _check_conflicts(axes: list[Axis]) -> None:
    for a, b in itertools.combinations(axes, 2):
        if a.priority != b.priority:
            continue
        wa, wb = a.writes, b.writes
        if wa[: len(wb)] == wb or wb[: len(wa)] == wa:
            raise ConfigError(f"axes '{a.key}' and '{b.key}' both set {'.'.join(wa if len(wa) <= len(wb) else wb)}")


def count_points(grid: Mapping[str, list[Any]], points: list[Any]) -> int:
    """Points a grid crossed with a list expands to."""
    return math.prod(len(v) for v in grid.values()) * max(1, len(points))


def _distinct(values: Iterable[Any]) -> list[Any]:
    seen: dict[str, Any] = {}
    for v in values:
        seen.setdefault(canonical_json(v), v)
    return list(seen.values())


def _field_errors(section: str, exc: ValidationError, axis: Axis) -> list[str]:
    """Errors of a type or range at or under the field the axis writes (not cross-field rules)."""
    out = []
    for err in exc.errors():
        loc = (section, *(str(x) for x in err["loc"]))
        if err["type"] != "value_error" and loc[: len(axis.writes)] == axis.writes:
            msg = "unknown field" if err["type"] == "extra_forbidden" else err["msg"]
            out.append(f"{'.'.join(loc)}: {msg}")
    return out


def _check_value(
    plan_base: dict[str, dict[str, Any]], lib: Library, axis: Axis, value: Any, axes: list[Axis]
) -> None:
    """Apply one value to the base alone; refuse what is wrong whatever the other axes say."""
    try:
        sections = apply_overrides(plan_base, {axis.key: value}, lib)
    except OverrideError as exc:
        earlier = [a for a in axes if a.section == axis.section and a.priority < axis.priority]
        if earlier and ("has no" in str(exc) or "is not set" in str(exc)):
            return  # the block may come from a swap axis in combination
        raise ConfigError(str(exc)) from None
    if axis.section == "run":
        if (
            isinstance(value, bool)
            or not isinstance(value, int)
            or value < (1 if axis.path[0] == "iterations" else 0)
        ):
            raise ConfigError(f"axis '{axis.key}': expected a non-negative integer, got {value!r}")
        return
    try:
        SECTION_MODELS[axis.section].model_validate(sections[axis.section])
    except ValidationError as exc:
        problems = _field_errors(axis.section, exc, axis)
        if problems:
            raise ConfigError(f"axis '{axis.key}' = {value!r}: {'; '.join(problems)}") from None


def _apply_fixed(
    base: dict[str, dict[str, Any]], fixed: Mapping[str, Any], lib: Library, source: str
) -> dict[str, dict[str, Any]]:
    """Bake the spec's ``set`` overrides into the base and validate the sections they touch."""
    if not fixed:
        return base
    try:
        out = apply_overrides(base, fixed, lib)
        for section in {resolve_axis(k).section for k in fixed} - {"run"}:
            build_section(section, out[section], fixed)
    except OverrideError as exc:
        raise ConfigError(f"{source}: set: {exc}") from None
    return out


def _expand(grid: Mapping[str, list[Any]], listed: list[dict[str, Any]], lib: Library) -> list[Point]:
    keys = list(grid)
    out: list[Point] = []
    for combo in itertools.product(*(grid[k] for k in keys)):
        for extra in listed or [{}]:
            overrides = {**dict(zip(keys, combo, strict=True)), **extra}
            out.append(Point(len(out), point_id(overrides, lib), overrides))
    return out


def build_plan(
    spec: SweepSpec, *, base_dir: Path | None = None, yes: bool = False, source: str = "<spec>"
) -> SweepPlan:
    """Validate ``spec`` against the models and expand it into points."""
    b = spec.base
    base = {k: _load_section(k, getattr(b, k), base_dir, f"{source}: base.{k}") for k in SECTION_MODELS
            if k != "strategy"}
    base["run"] = {"iterations": b.iterations, "warmup_iterations": b.warmup_iterations}
    keys = list(spec.grid)
    for p in spec.points:
        keys += [k for k in p if k not in keys]
    dup = set(spec.grid) & {k for p in spec.points for k in p}
    if dup:
        raise ConfigError(f"{source}: axis {sorted(dup)[0]!r} is both in grid and in points")
    try:
        axes = [resolve_axis(k) for k in keys]
        _check_conflicts(axes)
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None
    n = count_points(spec.grid, spec.points)
    if n > MAX_POINTS and not yes:
        raise ConfigError(
            f"{source}: the sweep has {n:,} points, more than {MAX_POINTS:,}; "
            "pass --yes (yes=True) to run it anyway"
        )
    values = {k: _distinct([*spec.grid.get(k, []), *(p[k] for p in spec.points if k in p)]) for k in keys}
    try:
        fixed = [resolve_axis(k) for k in spec.set]
        _check_conflicts(fixed)
    except ConfigError as exc:
        raise ConfigError(f"{source}: set: {exc}") from None
    items: dict[str, dict[str, dict[str, Any]]] = {k: {} for k in SECTION_MODELS}
    wanted = [(a, v) for a in axes for v in values[a.key]] + [(a, spec.set[a.key]) for a in fixed]
    strategies = [(b.strategy, f"{source}: base.strategy")]
    for axis, value in wanted:
        for kind, name in library_refs(axis, value):
            what = f"{source}: axis '{axis.key}' = {name!r}"
            if kind == "strategy":
                strategies.append((name, what))
            elif name not in items[kind]:
                items[kind][name] = _load_section(kind, name, base_dir, what)
    base_wl = load_workload(_resolve_name(b.workload, base_dir))
    swapped_workloads = [name for kind, name in
                         (ref for a, v in wanted for ref in library_refs(a, v)) if kind == "workload"]
    strategy_items, sets = _strategy_files(list(dict.fromkeys(strategies)), swapped_workloads, base_dir, base_wl)
    base["strategy"] = dict(strategy_items[b.strategy])
    items["strategy"].update(strategy_items)
    base_sets = sets.get(b.strategy, {})
    unset = {part: {k: base["workload"][part][k] for k in fields} for part, fields in base_sets.items()}
    for part, fields in base_sets.items():
        base["workload"] = {**base["workload"], part: {**base["workload"][part], **fields}}
    lib = Library(items, workload_sets=sets, base_strategy=b.strategy, base_workload_unset=unset)
    base = _apply_fixed(base, spec.set, lib, source)
    for axis in axes:
        for value in values[axis.key]:
            try:
                _check_value(base, lib, axis, value, axes)
            except ConfigError as exc:
                raise ConfigError(f"{source}: {exc}") from None
    return SweepPlan(spec.name, base, lib, axes, _expand(spec.grid, spec.points, lib), spec.cost, source)


def load_spec(path: str | Path, *, yes: bool = False) -> SweepPlan:
    """Read, validate and expand a sweep YAML file; problems are :class:`ConfigError`."""
    p = Path(path)
    if not p.exists():
        raise ConfigError(f"{p}: no such sweep spec")
    data = read_yaml(p)
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: expected a mapping with base and grid/points")
    try:
        spec = SweepSpec.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(str(p), exc)) from None
    return build_plan(spec, base_dir=p.parent, yes=yes, source=str(p))


def make_plan(
    hardware: str,
    workload: str,
    strategy: str,
    *,
    grid: Mapping[str, list[Any]] | None = None,
    points: list[dict[str, Any]] | None = None,
    iterations: int = 3,
    warmup_iterations: int = 1,
    cost: CostAssumptions | None = None,
    fixed: Mapping[str, Any] | None = None,
    name: str = "adhoc",
    yes: bool = False,
) -> SweepPlan:
    """Build a plan in Python, without a YAML file (``fixed`` is the spec's ``set`` block)."""
    spec = SweepSpec(
        name=name,
        base=BaseConfig(
            hardware=hardware,
            workload=workload,
            strategy=strategy,
            iterations=iterations,
            warmup_iterations=warmup_iterations,
        ),
        grid=dict(grid or {}),
        points=list(points or []),
        set=dict(fixed or {}),
        cost=cost or CostAssumptions(),
    )
    return build_plan(spec, yes=yes)
