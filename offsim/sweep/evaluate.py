"""The point function: build one point's configuration, pre-filter it, simulate it, flatten the result.

Everything a worker needs travels as plain data (:class:`Payload`, the point's overrides and a
:class:`~offsim.sweep.prefilter.Frontier`), so :func:`run_chunk` runs unchanged in this process,
in a local process pool or on a Dask worker, and reads no file.

A result row is a flat dict: ``point_index``, ``point_id``, one column per axis (its value;
mappings and lists as JSON text), ``status`` (``ok``, ``infeasible``, ``dominated`` or
``error``), ``error``, ``prefilter`` (what the pre-filter decided: ``infeasible``, ``dominated``,
``passed``; None when it was off), the metrics of :meth:`offsim.RunResult.to_dict` with nested
ones flattened (``phases_s.forward``, ``peak_bytes.gpu``, ``traffic_bytes.h2d``,
``footprint_need_bytes.gpu`` ...), the time bound, and the cost columns of
:mod:`offsim.sweep.cost`.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from offsim.api import resolve
from offsim.engine import reuse
from offsim.errors import OffsimError
from offsim.plan.time_bound import time_lower_bound
from offsim.simulation import Composed, compose_run, simulate_resolved
from offsim.sweep import compose_memo
from offsim.sweep.cost import cost_columns, usd_per_hour
from offsim.sweep.overrides import Library, OverrideError, apply_overrides, build_run_config
from offsim.sweep.prefilter import Frontier
from offsim.sweep.spec import CostAssumptions, SweepPlan, _digest, canonical_json

#: Columns that vary from run to run (kept out of the result table, stored beside it).
TIMING_KEYS = ("wall_s",)
_DROP = ("iteration_times_s", "wall_time_s", "hardware", "workload", "strategy", "footprint_bytes")


@dataclass(frozen=True)
class Payload:
    """What every point of a sweep shares: base sections, resolved files, options."""

    base: dict[str, dict[str, Any]]
    library: Library
    axis_keys: tuple[str, ...]
    cost: CostAssumptions
    prefilter: bool
    fingerprint: str

    @classmethod
    def from_plan(cls, plan: SweepPlan, prefilter: bool = True) -> Payload:
        """The payload of a loaded sweep."""
        return cls(plan.base, plan.library, tuple(plan.axis_keys), plan.cost, prefilter, plan.fingerprint())


#: Validated base sections per payload fingerprint (a worker validates each base once).
_MODEL_CACHE: dict[str, dict[tuple[str, int], BaseModel]] = {}


def column_value(value: Any) -> Any:
    """An axis value as a table cell: scalars as they are, mappings and lists as JSON text."""
    if isinstance(value, dict | list):
        return canonical_json(value)
    return value


def flatten(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested dicts to dotted keys; lists are dropped (per-iteration detail)."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, Mapping):
            out.update(flatten(v, f"{prefix}{k}."))
        elif not isinstance(v, list):
            out[f"{prefix}{k}"] = v
    return out


def _result_columns(result: Any) -> dict[str, Any]:
    d = result.to_dict()
    row = flatten({k: v for k, v in d.items() if k not in _DROP})
    fp = d.get("footprint_bytes") or {}
    row.update(
        flatten(
            {"footprint_need_bytes": fp.get("need", {}), "footprint_capacity_bytes": fp.get("capacity", {})}
        )
    )
    row["status"] = "ok" if result.feasible else "infeasible"
    return row


@dataclass(frozen=True)
class Goal:
    """A performance target: points whose time bound already misses it are not simulated."""

    max_iteration_s: float | None = None
    min_tokens_per_s: float | None = None

    def bound_misses(self, bound_s: float, tokens_per_iteration: float) -> bool:
        """True when even the lower bound on time misses the target."""
        if bound_s <= 0:
            return False
        if self.max_iteration_s is not None and bound_s > self.max_iteration_s:
            return True
        return self.min_tokens_per_s is not None and tokens_per_iteration / bound_s < self.min_tokens_per_s

    def met(self, row: Mapping[str, Any]) -> bool:
        """True when a simulated row meets the target."""
        if row.get("status") != "ok":
            return False
        if self.max_iteration_s is not None and not row["iteration_time_s"] <= self.max_iteration_s:
            return False
        return self.min_tokens_per_s is None or row["tokens_per_s"] >= self.min_tokens_per_s


def evaluate_point(
    payload: Payload,
    index: int,
    pid: str,
    overrides: Mapping[str, Any],
    frontier: Frontier | None = None,
    goal: Goal | None = None,
) -> dict[str, Any]:
    """One result row for one point; an exception becomes ``status='error'`` with its text.

    With the pre-filter on, a ``goal`` whose target the time bound already misses gives
    ``status='too_slow'`` without simulating (used by reverse sizing).
    """
    t0 = time.perf_counter()
    row: dict[str, Any] = {"point_index": index, "point_id": pid}
    row.update({k: column_value(overrides[k]) if k in overrides else None for k in payload.axis_keys})
    row.update(status="error", error=None, prefilter=None)
    try:
        _evaluate(payload, overrides, frontier, goal, row)
    except (OverrideError, OffsimError) as exc:
        row.update(status="error", error=str(exc))
    except Exception as exc:  # a failing point is recorded and the sweep goes on
        frames = traceback.extract_tb(exc.__traceback__)
        last = next((f for f in reversed(frames) if "offsim" in f.filename), frames[-1])
        where = last.filename.rsplit("/offsim/", 1)[-1]  # the same text on every machine
        row.update(status="error", error=f"{type(exc).__name__}: {exc} (at {where}:{last.lineno})")
    row["wall_s"] = time.perf_counter() - t0
    return row


def _evaluate(
    payload: Payload,
    overrides: Mapping[str, Any],
    frontier: Frontier | None,
    goal: Goal | None,
    row: dict[str, Any],
) -> None:
    cache = _MODEL_CACHE.setdefault(payload.fingerprint, {})
    sections = apply_overrides(payload.base, overrides, payload.library)
    cfg = resolve(build_run_config(sections, overrides, cache))  # searched values chosen once
    wl = cfg.workload
    row.update(
        hardware_name=cfg.hardware.name,
        workload_name=wl.name,
        strategy_name=cfg.strategy.name,
        workload_id=_digest(sections["workload"], 12),
        tokens_per_iteration=wl.tokens_per_iteration,
    )
    # once: the pre-filter and the simulation share it; where runs are reused (a sweep's worker),
    # composed once per distinct composition input (offsim.sweep.compose_memo)
    runs = reuse.active()
    memo = None if runs is None else compose_memo.memo_for(runs)
    composed = compose_run(cfg) if memo is None else memo.compose(cfg)
    point = _prefilter(payload, composed, frontier, goal, row, memo) if payload.prefilter else composed
    if point is None:
        return
    result = simulate_resolved(cfg, composed=point)
    row.update(_result_columns(result))
    row.update(
        cost_columns(cfg.hardware, payload.cost, wl.tokens_per_iteration, result.metrics.iteration_time_s)
    )


def _prefilter(payload: Payload, point: Composed, frontier: Frontier | None, goal: Goal | None,
               row: dict[str, Any], memo: compose_memo.ComposeMemo | None = None) -> Composed | None:
    """Fill the pre-filter's columns; None when the point is settled without simulating it, else
    the point as the simulation takes it (compiled, when it fits).

    A point that does not fit is not compiled (the simulator stops at the same check, before any
    event). One that fits is compiled for its time bound (:func:`time_lower_bound` of the
    schedule), and that schedule is the one simulated (issue 16: compiled once, not twice)."""
    point = point.footprint()  # worked out once: the simulation reads it too
    cfg, sz, wl, fit = point.cfg, point.sz, point.cfg.workload, point.fit
    if fit is not None and fit.first_overflow() is not None:
        row["prefilter"] = "infeasible"
        return point
    point = point.compiled() if memo is None else memo.compiled(point)
    bound = time_lower_bound(cfg, sz, point.schedule)
    row.update(time_lower_bound_s=bound.seconds, bound_binding=bound.binding)
    row["prefilter"] = "passed"
    settled = None
    if goal is not None and goal.bound_misses(bound.seconds, wl.tokens_per_iteration):
        settled = {"status": "too_slow", "prefilter": "too_slow"}
    elif frontier is not None and len(frontier) and bound.seconds > 0:
        hourly, _ = usd_per_hour(cfg.hardware, payload.cost)
        by = None if hourly is None else frontier.dominated_by(
            row["workload_id"], hourly, wl.tokens_per_iteration / bound.seconds)
        if by is not None:
            settled = {"status": "dominated", "prefilter": "dominated", "dominated_by": by}
    if settled is None:
        return point
    row.update(settled)
    row.update(cost_columns(cfg.hardware, payload.cost, wl.tokens_per_iteration, None))
    return None


def run_chunk(
    payload: Payload, items: list[tuple[int, str, dict[str, Any]]], frontier: Frontier | None = None
) -> list[dict[str, Any]]:
    """Rows of a chunk of points ``(index, point_id, overrides)``: the unit of work sent to a worker."""
    return [evaluate_point(payload, i, pid, ov, frontier) for i, pid, ov in items]


def point_usd_per_hour(
    plan: SweepPlan, overrides: Mapping[str, Any], cache: dict[str, float | None]
) -> float | None:
    """Hourly price of a point's machine (None when unknown or invalid), from its hardware axes only."""
    hw_over = {k: v for k, v in overrides.items() if k in _hardware_keys(plan)}
    key = canonical_json(hw_over)
    if key not in cache:
        try:
            sections = apply_overrides({"hardware": plan.base["hardware"]}, hw_over, plan.library)
            from offsim.config.hardware import HardwareProfile

            cache[key] = usd_per_hour(HardwareProfile.model_validate(sections["hardware"]), plan.cost)[0]
        except (ValueError, OffsimError):
            cache[key] = None
    return cache[key]


def _hardware_keys(plan: SweepPlan) -> set[str]:
    return {a.key for a in plan.axes if a.section == "hardware"}
