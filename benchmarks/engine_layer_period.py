"""How periodic a run is by layer (and by optimizer sub-group) inside an iteration: the measure
a layer-periodic shortcut (issue 16) would stand on. Nothing in the engine reads it.

Run: ``python benchmarks/engine_layer_period.py [HARDWARE WORKLOAD STRATEGY]`` (default: the
175B zero-infinity-nvme case of the speed table); with ``--scaling``, the cost of composing,
compiling and running the case at 8, 24, 48 and 96 layers instead. Two figures per phase of each
block:

* the schedule's: each block cut into runs of ops with one (phase, layer) tag, or in the
  optimizer one sub-group (``Tag.group``); a run is *equal* to the one ``p`` runs before when its
  ops are, field by field, with layer and sub-group numbers taken relative to the run's,
  ``after`` ids relative to its first op, and gradient-buffer groups renumbered in order of
  first use (they are numbered across the whole backward); labels (display text) left out;
* the run's: the spans of each layer (or sub-group) of iteration 1, relative to the start of
  its first span on the GPU, the CPU or an NVMe read; a unit *matches* the one ``p`` before when
  the same spans (resource, kind, name with numbers blanked, bytes) lie at the same relative
  times, and the spacing of the starts is the same, to ``1e-13`` of the time since the run's
  start (the steady-state shortcut's :data:`~offsim.engine.steady.TIME_TOLERANCE`).

A unit can be skipped by a shortcut of period ``p`` only where both hold; the runs' figure is a
necessary condition only (the state at a unit's start holds more than its spans: flows in
progress, caches, the memory ledger).
"""

# ruff: noqa: T201 - a benchmark prints its figures

from __future__ import annotations

import dataclasses
import gc
import math
import re
import sys
import time
from collections.abc import Sequence
from typing import Any

from offsim import make_run_config, simulate
from offsim.config.loading import load_workload
from offsim.schedule.ops import Block, Op, TensorRef
from offsim.simulation import compose_run, make_executor
from offsim.trace import Span

CASE = ("dgx2-v100", "gpt3-175b", "zero-infinity-nvme")
PERIODS = (1, 2, 3, 4, 6, 8)
TOLERANCE = 1e-13
_NUMBER = re.compile(r"\d+")
_SUB_GROUP = re.compile(r"sub-group (\d+)")


def _rel(value: int, origin: int) -> int:
    return value - origin if value >= 0 else value


def _canon(op: Op, unit: int, first_id: int, groups: dict[int, int]) -> tuple[Any, ...]:
    """``op`` relative to its run (``unit``: the run's layer or sub-group)."""
    def ref(r: TensorRef) -> tuple[Any, ...]:
        return (r.kind, _rel(r.unit, unit), groups.setdefault(r.group, len(groups)) if r.group >= 0 else -1, r.mb)

    fields: list[Any] = []
    for f in dataclasses.fields(op.body):
        v = getattr(op.body, f.name)
        if f.name == "unit":
            v = _rel(v, unit)
        elif f.name == "units":
            v = tuple(_rel(x, unit) for x in v)
        elif isinstance(v, TensorRef):
            v = ref(v)
        fields.append((f.name, v))
    t = op.tag
    return (type(op.body).__name__, tuple(fields), t.activity, t.mechanism, t.phase, _rel(t.layer, unit),
            _rel(t.group, unit), op.stream, tuple(a - first_id for a in op.after),
            tuple(map(ref, op.reads)), tuple(map(ref, op.writes)), op.stall)


def _runs(block: Block) -> list[tuple[str, int, list[Op]]]:
    """The block's runs of ops with one (phase, unit): the unit is the layer, or the sub-group."""
    runs: list[tuple[str, int, list[Op]]] = []
    for op in block.ops:
        unit = op.tag.layer if op.tag.layer >= 0 else op.tag.group
        if not runs or runs[-1][0] != str(op.tag.phase) or runs[-1][1] != unit:
            runs.append((str(op.tag.phase), unit, []))
        runs[-1][2].append(op)
    return runs


def _equal_counts(items: Sequence[Any], periods: Sequence[int]) -> dict[int, int]:
    """Per period p, how many items equal the one p before."""
    return {p: sum(1 for a, b in zip(items, items[p:], strict=False) if a == b) for p in periods}


def schedule_periods(case: tuple[str, str, str]) -> None:
    """Print, per block and phase, the runs and how many equal the one p before."""
    schedule = compose_run(make_run_config(*case, iterations=3)).compiled().schedule
    assert schedule is not None, "compiled() compiles"
    for block in schedule.blocks():
        by_phase: dict[str, list[tuple[int, int, tuple[Any, ...]]]] = {}
        for phase, unit, ops in _runs(block):
            canon = tuple(_canon(op, unit, ops[0].id, {}) for op in ops)
            by_phase.setdefault(phase, []).append((unit, len(ops), canon))
        for phase, runs in by_phase.items():
            counts = _equal_counts([r[2] for r in runs], PERIODS)
            p_best = max(PERIODS, key=lambda p: (counts[p], -p))
            ops_equal = sum(b[1] for a, b in zip(runs, runs[p_best:], strict=False) if a[2] == b[2])
            print(f"schedule {block.name!r} {phase}: {len(runs)} runs, {sum(r[1] for r in runs)} ops; "
                  f"equal to the run p before, p={', '.join(f'{p}: {n}' for p, n in counts.items())} "
                  f"(p={p_best}: {ops_equal} ops)")


def _unit_of(span: Span) -> int:
    if span.phase in ("forward", "backward"):
        return span.layer
    m = _SUB_GROUP.search(span.name)
    return int(m.group(1)) if m else -1


def _patterns(spans: list[Span], iteration: int, phase: str) -> list[tuple[float, list[tuple[Any, ...]]]]:
    """Per unit in order of first span: its anchor (s) and its spans relative to it."""
    units: dict[int, list[Span]] = {}
    for s in spans:
        if s.iteration == iteration and s.phase == phase and _unit_of(s) >= 0:
            units.setdefault(_unit_of(s), []).append(s)
    out = []
    for ss in units.values():
        anchors = [x.start_s for x in ss if x.resource in ("gpu", "cpu", "nvme_read")] or [x.start_s for x in ss]
        anchor = min(anchors)
        out.append((anchor, sorted((x.resource, x.kind, _NUMBER.sub("#", x.name), x.bytes, x.start_s - anchor,
                                    x.end_s - anchor) for x in ss)))
    return out


def _matches(units: list[tuple[float, list[tuple[Any, ...]]]], i: int, p: int) -> bool:
    """Does unit ``i`` repeat unit ``i - p`` (spans and starts' spacing, to TOLERANCE)?"""
    if i < p + 1:
        return False
    (a0, s0), (a1, s1) = units[i - p], units[i]
    tol_s = TOLERANCE * max(abs(a1), 1.0)
    if [x[:4] for x in s0] != [x[:4] for x in s1]:
        return False
    if abs((a1 - a0) - (units[i - 1][0] - units[i - 1 - p][0])) > tol_s:
        return False
    return all(abs(x[4] - y[4]) <= tol_s and abs(x[5] - y[5]) <= tol_s for x, y in zip(s0, s1, strict=True))


def run_periods(case: tuple[str, str, str], iteration: int = 1) -> None:
    """Print, per phase of ``iteration``, how many units' spans repeat the unit p before."""
    result = simulate(make_run_config(*case, iterations=3))
    if not result.feasible:
        print(f"run: infeasible ({result.metrics.infeasible_reason})")
        return
    spans = list(result.recorder.spans)
    for phase in ("forward", "backward", "optimizer"):
        units = _patterns(spans, iteration, phase)
        counts = {p: sum(_matches(units, i, p) for i in range(len(units))) for p in PERIODS}
        first = next((i for i in range(len(units)) if _matches(units, i, 1)), None)
        print(f"run iteration {iteration} {phase}: {len(units)} units; repeating the unit p before, "
              f"p={', '.join(f'{p}: {n}' for p, n in counts.items())}; the first with p=1: {first}")


def layer_scaling(case: tuple[str, str, str], layers: Sequence[int] = (8, 24, 48, 96), repeats: int = 5) -> None:
    """Print the CPU seconds of composing and compiling, and of the executor's run, of ``case``
    (3 iterations) with its workload cut to each count of ``layers`` (best of ``repeats``): what a
    run that simulates only a few layers could cost at best."""
    base = load_workload(case[1])
    print("layers  compose+compile_s  executor_s  events  ops")
    for n in layers:
        wl = base.model_copy(update={"model": base.model.model_copy(update={"layers": n})})
        cfg = make_run_config(case[0], wl, case[2], iterations=3)
        best_compose_s = best_run_s = math.inf
        for _ in range(repeats):
            gc.collect()
            t0 = time.process_time()
            composed = compose_run(cfg).compiled()
            best_compose_s = min(best_compose_s, time.process_time() - t0)
            schedule = composed.schedule
            assert schedule is not None, "compiled() compiles"
            ex = make_executor(composed.cfg, composed.sz, schedule=schedule)
            t0 = time.process_time()
            events = ex.run()
            best_run_s = min(best_run_s, time.process_time() - t0)
            op_count = sum([len(block.ops) for block in schedule.blocks()])
        print(f"{n:6d}  {best_compose_s:17.4f}  {best_run_s:10.4f}  {events:6d}  {op_count}")


def main() -> None:
    if "--scaling" in sys.argv:
        sys.argv.remove("--scaling")
        layer_scaling(tuple(sys.argv[1:4]) if len(sys.argv) >= 4 else CASE)  # type: ignore[arg-type]
        return
    case = tuple(sys.argv[1:4]) if len(sys.argv) >= 4 else CASE
    print(" ".join(case))
    schedule_periods(case)  # type: ignore[arg-type]
    run_periods(case)  # type: ignore[arg-type]


if __name__ == "__main__":
    main()
