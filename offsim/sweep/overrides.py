"""Axis overrides: how one sweep value changes a configuration.

A configuration is held as plain dicts, one per *section* (``hardware``, ``workload``,
``strategy``, ``run``), exactly as the shipped YAML files read (``model_dump()`` of the validated
models). An axis names what it changes in one of three ways:

* a **dotted path** into a section, e.g. ``hardware.dram.capacity_gib``,
  ``workload.training.micro_batch``, ``strategy.prefetch_depth``, ``run.iterations``; the value
  replaces the field (a mapping value replaces the whole sub-mapping);
* a **friendly alias** (:data:`ALIASES`): ``dram_gib``, ``nvme_drives``, ``pcie_gen``,
  ``cpu_cores``, ``micro_batch``, ``seq_len``, ``grad_accumulation``, ``prefetch_depth``,
  ``dram_cache_gib``, and the policies ``policy`` (the GPU parameter buffer's eviction policy),
  ``dram_policy``, ``prefetch_policy``, ``activation_policy``, ``optimizer_order``, whose
  value is a policy ``kind`` (``lru``) or a mapping with parameters (``{kind: window, ...}``);
* a **swap**: ``hardware``, ``workload`` or ``strategy`` (the whole section from another shipped
  file or a YAML path), ``gpu`` / ``cpu`` (that block from another hardware profile, or an
  inline mapping), ``nvme_model`` (the NVMe block of another profile, keeping the drive count).

Overrides apply in a fixed order whatever the order of the axes: whole-section swaps, then block
swaps, then ``pcie_gen``, then field values. So ``gpu: h100`` with ``dram_gib: 256`` means "the
H100's GPU block in the base machine with 256 GiB", and ``pcie_gen`` scales the link of the
machine chosen by a ``hardware`` axis.

Everything here is a pure function of dicts: the parent process validates axes with it and the
worker processes (local or on a Dask cluster) rebuild each point's configuration with it, without
reading any file (referenced files are resolved once into a :class:`Library`).
"""

from __future__ import annotations

import copy
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from pydantic import BaseModel, ValidationError

from offsim.config.hardware import HardwareProfile
from offsim.config.run import RunConfig
from offsim.config.strategy import Strategy
from offsim.config.workload import Workload
from offsim.errors import ConfigError
from offsim.plan.cpu_adam import RateOrigin

SECTIONS = ("hardware", "workload", "strategy", "run")
SECTION_MODELS: dict[str, type[BaseModel]] = {
    "hardware": HardwareProfile,
    "workload": Workload,
    "strategy": Strategy,
}
RUN_FIELDS = ("iterations", "warmup_iterations")

#: Friendly aliases that are plain field paths.
FIELD_ALIASES: dict[str, str] = {
    "nvme_drives": "hardware.nvme.drives",
    "micro_batch": "workload.training.micro_batch",
    "seq_len": "workload.training.seq_len",
    "grad_accumulation": "workload.training.grad_accumulation",
    "prefetch_depth": "strategy.prefetch_depth",
    "dram_cache_gib": "strategy.policies.dram_cache_gib",
}

#: Aliases for the policy unions: a value is a policy ``kind`` or a full mapping.
POLICY_ALIASES: dict[str, str] = {
    "policy": "eviction",
    "eviction_policy": "eviction",
    "dram_policy": "dram_eviction",
    "prefetch_policy": "prefetch",
    "activation_policy": "activations",
    "optimizer_order": "optimizer_order",
}

#: Every alias with what it does (shown by errors and ``offsim sweep --help``).
ALIASES: dict[str, str] = {
    "hardware": "swap the whole hardware profile (shipped name or YAML path)",
    "workload": "swap the workload (shipped name or YAML path)",
    "strategy": "swap the strategy (shipped name or YAML path)",
    "gpu": "take the gpu block of another hardware profile (name/path) or an inline mapping",
    "cpu": "take the cpu block of another hardware profile (name/path) or an inline mapping",
    "nvme_model": "take the nvme block of another hardware profile, keeping the drive count",
    "pcie_gen": "set host_link.generation and scale h2d/d2h rates by 2^(gen - base gen)",
    "dram_gib": "set dram.capacity_gib (dram.power_w, when given, scales with it)",
    "cpu_cores": "set cpu.cores and scale cpu.optimizer_params_per_s in proportion",
    **{k: f"= {v}" for k, v in FIELD_ALIASES.items()},
    **{
        k: f"= strategy.policies.{v} (a policy kind, or a mapping with its parameters)"
        for k, v in POLICY_ALIASES.items()
    },
}

_SWAP_SECTIONS = ("hardware", "workload", "strategy")
_BLOCKS = {"gpu": "gpu", "cpu": "cpu", "nvme_model": "nvme"}


@dataclass(frozen=True)
class Axis:
    """What one axis key does.

    Attributes:
        key: the key as written in the spec (``dram_gib``, ``hardware.nvme.drives``, ...).
        kind: ``swap`` (whole section), ``block`` (one hardware block), ``pcie_gen``,
            ``dram_gib``, ``cpu_cores`` or ``set`` (a field path).
        section: the section it changes.
        path: the field path inside the section that it writes (for ``block``: the block).
        priority: application order (lower first).
    """

    key: str
    kind: str
    section: str
    path: tuple[str, ...]
    priority: int

    @property
    def writes(self) -> tuple[str, ...]:
        """The dotted path this axis writes (for conflict checks and error messages)."""
        return (self.section, *self.path)


class OverrideError(ValueError):
    """A value cannot be applied (wrong type, missing block); the message names the axis."""


# ----------------------------------------------------------------------------- field paths
def _unwrap(annotation: Any) -> list[Any]:
    """The alternatives of an annotation (``X | None`` gives ``[X]``), Annotated stripped."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _unwrap(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        return [a for arg in typing.get_args(annotation) for a in _unwrap(arg) if a is not type(None)]
    return [annotation]


def _check_path(model: type[BaseModel], path: tuple[str, ...], key: str) -> None:
    """Refuse a path that does not name a field of ``model`` (dict fields accept any key)."""
    current: list[Any] = [model]
    for depth, part in enumerate(path):
        nxt: list[Any] = []
        for ann in current:
            if isinstance(ann, type) and issubclass(ann, BaseModel):
                if part in ann.model_fields:
                    nxt.extend(_unwrap(ann.model_fields[part].annotation))
            elif typing.get_origin(ann) is dict:
                nxt.extend(_unwrap(typing.get_args(ann)[1]))
        if not nxt:
            where = ".".join(path[:depth]) or "(top level)"
            fields = sorted(
                {
                    f
                    for ann in current
                    if isinstance(ann, type) and issubclass(ann, BaseModel)
                    for f in ann.model_fields
                }
            )
            hint = f"; fields there: {', '.join(fields)}" if fields else " (it has no sub-fields)"
            raise ConfigError(f"axis '{key}': unknown field '{part}' under {where}{hint}")
        current = nxt


@cache
def resolve_axis(key: str) -> Axis:
    """What the axis ``key`` does; an unknown alias or field is a :class:`ConfigError`."""
    if key in _SWAP_SECTIONS:
        return Axis(key, "swap", key, (), 0)
    if key in _BLOCKS:
        return Axis(key, "block", "hardware", (_BLOCKS[key],), 1)
    if key == "pcie_gen":
        return Axis(key, "pcie_gen", "hardware", ("host_link", "generation"), 2)
    if key == "dram_gib":
        return Axis(key, "dram_gib", "hardware", ("dram", "capacity_gib"), 3)
    if key == "cpu_cores":
        return Axis(key, "cpu_cores", "hardware", ("cpu", "cores"), 3)
    if key in POLICY_ALIASES:
        return Axis(key, "policy", "strategy", ("policies", POLICY_ALIASES[key]), 3)
    dotted = FIELD_ALIASES.get(key, key)
    section, _, rest = dotted.partition(".")
    if section not in SECTIONS or not rest:
        raise ConfigError(
            f"axis '{key}': not an alias ({', '.join(ALIASES)}) nor a dotted path starting with "
            f"{', '.join(s + '.' for s in SECTIONS)}"
        )
    path = tuple(rest.split("."))
    if section == "run":
        if path[0] not in RUN_FIELDS or len(path) > 1:
            raise ConfigError(f"axis '{key}': run fields are {', '.join(RUN_FIELDS)}")
    else:
        _check_path(SECTION_MODELS[section], path, key)
        if path in (("name",), ("schema_version",)):
            raise ConfigError(f"axis '{key}': use the '{section}' axis to swap the whole {section}")
    return Axis(key, "set", section, path, 3)


# ----------------------------------------------------------------------------- library
@dataclass(frozen=True)
class Library:
    """Sections referenced by swap axes, resolved to dicts once in the parent process.

    ``items[kind][name]`` is the ``model_dump()`` of the hardware profile, workload or strategy
    that the name or path ``name`` refers to.
    """

    items: Mapping[str, Mapping[str, dict[str, Any]]]
    #: Per strategy file of DeepSpeed, Accelerate or Megatron-Core (by name as written), the
    #: workload fields it sets (``{"training": {...}, "precision": {...}}``), as ``offsim run``
    #: applies them (:func:`offsim.config.run.apply_strategy_file`).
    workload_sets: Mapping[str, Mapping[str, Mapping[str, Any]]] = field(default_factory=dict)
    #: The base strategy's name as written in the spec (its workload fields are already in the
    #: base workload; they apply to a swapped-in workload too).
    base_strategy: str = ""
    #: The base workload's own values of the fields the base strategy's file sets (put back when
    #: a point swaps the strategy but not the workload).
    base_workload_unset: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    #: Workload dicts with a file's fields merged, by (the swapped-in workload's name, or "" for
    #: the base; the strategy's name): the same dict for every point, so that it is validated once.
    merged: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict, compare=False, repr=False)

    def get(self, kind: str, name: str, axis: str) -> dict[str, Any]:
        """The dict of ``name``; a name the parent did not resolve is an :class:`OverrideError`."""
        try:
            return self.items[kind][name]
        except KeyError:
            raise OverrideError(f"axis '{axis}': {kind} '{name}' was not resolved") from None


def library_refs(axis: Axis, value: Any) -> list[tuple[str, str]]:
    """The (kind, name) files an axis value refers to."""
    if axis.kind == "swap" and isinstance(value, str):
        return [(axis.section, value)]
    if axis.kind == "block" and isinstance(value, str):
        return [("hardware", value)]
    return []


# ----------------------------------------------------------------------------- applying
def _need_number(axis: Axis, value: Any, integer: bool = False) -> None:
    ok = isinstance(value, int) if integer else isinstance(value, int | float)
    if isinstance(value, bool) or not ok:
        what = "an integer" if integer else "a number"
        raise OverrideError(f"axis '{axis.key}': expected {what}, got {value!r}")


def _block(d: dict[str, Any], key: str, axis: Axis) -> dict[str, Any]:
    """A private copy of block ``key`` of ``d``, put back in ``d`` (for writing into)."""
    block = d.get(key)
    if not isinstance(block, dict):
        name = d.get("name", "?")
        raise OverrideError(f"axis '{axis.key}': hardware profile '{name}' has no {key} block")
    d[key] = copy.deepcopy(block)
    return d[key]


def _set_path(d: dict[str, Any], path: tuple[str, ...], value: Any, axis: Axis) -> None:
    """Set ``path`` in ``d``, copying each mapping on the way (the base is shared, never written)."""
    for depth, part in enumerate(path[:-1]):
        nxt = d.get(part)
        if nxt is None:
            where = ".".join((axis.section, *path[: depth + 1]))
            raise OverrideError(
                f"axis '{axis.key}': {where} is not set in this configuration, so "
                f"{'.'.join(path[depth + 1 :])} cannot be set inside it"
            )
        if not isinstance(nxt, dict):
            raise OverrideError(f"axis '{axis.key}': {part} is not a mapping")
        d[part] = dict(nxt)
        d = d[part]
    d[path[-1]] = copy.deepcopy(value)


def _scale_curve(curve: dict[str, Any], factor: float) -> None:
    curve["bandwidth_gb_per_s"] = curve["bandwidth_gb_per_s"] * factor
    if curve.get("points"):
        curve["points"] = [[x, y * factor] for x, y in curve["points"]]


def _apply_pcie_gen(hw: dict[str, Any], axis: Axis, value: Any) -> None:
    """Set the PCIe generation and scale both directions by ``2^(gen - base gen)``.

    Each PCIe generation doubles the per-lane rate (Gen3 8 GT/s, Gen4 16, Gen5 32); achieved
    copy rates scale the same way to first order, so pinned and pageable curves (and measured
    points) are all scaled by the same factor relative to the profile being modified.
    """
    _need_number(axis, value, integer=True)
    link = _block(hw, "host_link", axis)
    g0 = link.get("generation")
    if link.get("kind") != "pcie" or g0 is None:
        raise OverrideError(
            f"axis '{axis.key}': hardware profile '{hw.get('name')}' has no PCIe "
            "host_link.generation to scale from"
        )
    factor = 2.0 ** (value - g0)
    for direction in ("h2d", "d2h"):
        for memory in ("pinned", "pageable"):
            _scale_curve(link[direction][memory], factor)
    link["generation"] = value


def _apply_dram_gib(hw: dict[str, Any], axis: Axis, value: Any) -> None:
    """Set the DRAM capacity; a stated DRAM power scales with it (power per GiB is kept)."""
    _need_number(axis, value)
    dram = _block(hw, "dram", axis)
    if dram.get("power_w") is not None and isinstance(dram.get("capacity_gib"), int | float) and value > 0:
        dram["power_w"] = dram["power_w"] * value / dram["capacity_gib"]
    dram["capacity_gib"] = value


def _apply_cpu_cores(hw: dict[str, Any], axis: Axis, value: Any) -> None:
    """Set the core count. A measured CPU optimizer rate scales in proportion (DeepSpeed
    CPU-Adam is parallel over cores; the engine still caps it by DRAM bandwidth); a rate derived
    from the CPU's description (or none given) is derived again from the new count when the
    profile loads (:mod:`offsim.plan.cpu_adam`)."""
    _need_number(axis, value, integer=True)
    cpu = _block(hw, "cpu", axis)
    measured = RateOrigin(cpu.get("optimizer_rate_origin", RateOrigin.MEASURED)) is RateOrigin.MEASURED
    if value > 0 and cpu.get("cores") and measured and "optimizer_params_per_s" in cpu:
        cpu["optimizer_params_per_s"] = float(cpu["optimizer_params_per_s"]) * value / float(cpu["cores"])
    cpu["cores"] = value


def _apply_block(hw: dict[str, Any], axis: Axis, value: Any, lib: Library) -> None:
    block = axis.path[0]
    if isinstance(value, dict):
        new = copy.deepcopy(value)
    elif isinstance(value, str):
        new = copy.deepcopy(lib.get("hardware", value, axis.key).get(block))  # type: ignore[arg-type]
        if new is None:
            raise OverrideError(f"axis '{axis.key}': hardware profile '{value}' has no {block} block")
    else:
        raise OverrideError(
            f"axis '{axis.key}': expected a hardware profile name or a mapping, got {value!r}"
        )
    if axis.key == "nvme_model":
        new["drives"] = _block(hw, "nvme", axis)["drives"]
    hw[block] = new


def apply_one(sections: dict[str, dict[str, Any]], axis: Axis, value: Any, lib: Library) -> None:
    """Apply one axis value to ``sections`` in place."""
    if axis.kind == "swap":
        if not isinstance(value, str):
            raise OverrideError(f"axis '{axis.key}': expected a {axis.section} name or path, got {value!r}")
        sections[axis.section] = dict(lib.get(axis.section, value, axis.key))
        return
    target = sections[axis.section]
    if axis.kind == "block":
        _apply_block(target, axis, value, lib)
    elif axis.kind == "pcie_gen":
        _apply_pcie_gen(target, axis, value)
    elif axis.kind == "dram_gib":
        _apply_dram_gib(target, axis, value)
    elif axis.kind == "cpu_cores":
        _apply_cpu_cores(target, axis, value)
    elif axis.kind == "policy":
        _set_path(target, axis.path, {"kind": value} if isinstance(value, str) else value, axis)
    else:
        _set_path(target, axis.path, value, axis)


def apply_overrides(
    base: Mapping[str, dict[str, Any]], overrides: Mapping[str, Any], lib: Library
) -> dict[str, dict[str, Any]]:
    """A copy of ``base`` with every override applied, in :class:`Axis` priority order."""
    axes = sorted((resolve_axis(k) for k in overrides), key=lambda a: a.priority)
    touched = {a.section for a in axes}
    # copy-on-write: a touched section is a shallow copy, and every change copies the mappings on
    # its path, so the (shared) base and library dicts are never modified
    sections = {s: (dict(d) if s in touched else d) for s, d in base.items()}
    swapped = False
    for axis in axes:
        if axis.priority > 0 and not swapped:
            _apply_strategy_file(sections, overrides, lib)
            swapped = True
        apply_one(sections, axis, overrides[axis.key], lib)
    if not swapped:
        _apply_strategy_file(sections, overrides, lib)
    return sections


def _apply_strategy_file(sections: dict[str, dict[str, Any]], overrides: Mapping[str, Any], lib: Library) -> None:
    """After the swaps, before the field axes: the batch and precision the point's strategy file
    sets, written into its workload as ``offsim run`` does (a field axis on the workload still
    wins). The base workload already has the base strategy's; a point that swaps the strategy
    alone gets the base workload's own values back first."""
    if "strategy" not in overrides and "workload" not in overrides:
        return
    name = overrides.get("strategy", lib.base_strategy)
    if not isinstance(name, str):
        return
    sets = dict(lib.workload_sets.get(name, {}))
    if "workload" not in overrides and name != lib.base_strategy:
        sets = {part: {**lib.base_workload_unset.get(part, {}), **sets.get(part, {})}
                for part in {*sets, *lib.base_workload_unset}}
    if not any(sets.values()):
        return
    key = (str(overrides.get("workload", "")), name)
    if key not in lib.merged:
        workload = dict(sections["workload"])
        for part, fields in sets.items():
            workload[part] = {**workload[part], **fields}
        lib.merged[key] = workload
    sections["workload"] = lib.merged[key]


# ----------------------------------------------------------------------------- validating
def axis_for_loc(section: str, loc: tuple[Any, ...], axes: list[Axis]) -> Axis | None:
    """The axis whose written path is the longest prefix of ``section.loc`` (or a swap of it)."""
    full = (section, *(str(x) for x in loc))
    best: Axis | None = None
    for axis in axes:
        w = axis.writes
        if full[: len(w)] == w and (best is None or len(w) > len(best.writes)):
            best = axis
    return best


def axes_under(section: str, loc: tuple[Any, ...], axes: list[Axis]) -> list[Axis]:
    """Axes that write inside ``section.loc`` (a cross-field rule of that model failed)."""
    full = (section, *(str(x) for x in loc))
    return [a for a in axes if a.writes[: len(full)] == full and a.kind != "swap"]


def validation_message(section: str, exc: ValidationError, overrides: Mapping[str, Any]) -> str:
    """One line per problem, naming the axis (and its value) that caused it when one did."""
    axes = [resolve_axis(k) for k in overrides]
    lines = []
    for err in exc.errors():
        loc = tuple(err["loc"])
        field = ".".join([section, *(str(x) for x in loc)])
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown field"
        axis = axis_for_loc(section, loc, axes)
        inside = [axis] if axis is not None else axes_under(section, loc, axes)
        who = "".join(f"axis '{a.key}' = {overrides[a.key]!r}: " for a in inside)
        lines.append(f"{who}{field}: {msg}")
    return "; ".join(lines)


def build_section(section: str, data: dict[str, Any], overrides: Mapping[str, Any]) -> BaseModel:
    """Validate one section with its Pydantic model; errors name the axis and the field."""
    try:
        return SECTION_MODELS[section].model_validate(data)
    except ValidationError as exc:
        raise OverrideError(validation_message(section, exc, overrides)) from None


def build_run_config(
    sections: Mapping[str, dict[str, Any]],
    overrides: Mapping[str, Any],
    cache: dict[tuple[str, int], BaseModel] | None = None,
) -> RunConfig:
    """Validate every section and the cross-section rules into a :class:`RunConfig`.

    ``cache`` maps ``(section, id(dict))`` to an already validated model, so that a worker
    validates the unchanged base sections once, not once per point.
    """
    models: dict[str, BaseModel] = {}
    for section in SECTION_MODELS:
        data = sections[section]
        key = (section, id(data))
        if cache is not None and key in cache:
            models[section] = cache[key]
            continue
        models[section] = build_section(section, data, overrides)
        if cache is not None and section not in {resolve_axis(k).section for k in overrides}:
            cache[key] = models[section]
    run = dict(sections["run"])
    try:
        return RunConfig(**models, **run)  # type: ignore[arg-type]
    except ValidationError as exc:
        raise OverrideError(validation_message("run", exc, overrides)) from None
