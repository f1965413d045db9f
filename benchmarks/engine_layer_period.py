"""How periodic a run is by layer (and by optimizer sub-group) inside an iteration: the measure
a layer-periodic shortcut (issue 16) would stand on. Nothing in the engine reads it.

Run: ``python benchmarks/engine_layer_period.py [HARDWARE WORKLOAD STRATEGY]`` (default: the
175B zero-infinity-nvme case of the speed table); with ``--scaling``, the cost of composing,
compiling and running the case at 8, 24, 48 and 96 layers instead. Two figures per phase of each
block:

* the schedule's: each block cut into runs of ops with one (phase, layer) tag, or in the
  optimizer one sub-group (``Tag.group``); a run is *equal* to the one ``p`` runs before when its
  ops are, field by field, with layer and sub-group numbers taken relative to the run's,
  ``after`` ids relative to its first op, and the gradient buffers' groups relative to the run's
  first (they are numbered across the whole backward, 4 a layer) as are a step run's groups to
  its sub-group (:func:`_group`); labels (display text) left out;
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
import itertools
import math
import re
import sys
import time
from collections.abc import Sequence
from heapq import heappop
from typing import Any

from offsim import make_run_config, simulate
from offsim.config.loading import load_workload
from offsim.core.enums import TensorKind
from offsim.engine.execute import Executor
from offsim.engine.hooks import FetchTracker, PolicyCache
from offsim.engine.steady import (
    OpaqueStateError,
    Snapshot,
    _accesses,
    _Canon,
    _key,
    _memory,
    _queue,
    _resources,
    _writers,
)
from offsim.schedule.ops import Block, Op, TensorRef
from offsim.simulation import compose_run, make_executor
from offsim.trace import Span

CASE = ("dgx2-v100", "gpt3-175b", "zero-infinity-nvme")
PERIODS = (1, 2, 3, 4, 6, 8)
TOLERANCE = 1e-13
_NUMBER = re.compile(r"\d+")
#: a run's group origin: (the number its groups are taken relative to, or None; a sub-group's run)
Origin = tuple[int | None, bool]
#: groups further than this from a run's origin are other numbering (the static buffers, 1000 on)
GROUP_WINDOW = 64
#: a run, for ``--state``: (first op id, phase, unit, first op of the phase's periodic part, origin)
Boundary = tuple[int, str, int, int, Origin]
#: the state comparisons of ``--state``: (compare the residents' next uses, memory window in units)
VARIANTS: tuple[tuple[bool, int | None], ...] = ((True, None), (False, None), (True, 4), (False, 4))
VARIANT_NAMES = ("all", "without next uses", "memory within 4 units", "both")
_SUB_GROUP = re.compile(r"sub-group (\d+)")


def _rel(value: int, origin: int) -> int:
    return value - origin if value >= 0 else value


def _group(r: TensorRef, origin: Origin) -> int | tuple[str, int]:
    """``r.group``, relative to the run's ``origin`` (its first gradient buffer's number in a
    layer's run, its sub-group in the step's) where it is a buffer's number, or any group in a
    sub-group's run, within :data:`GROUP_WINDOW` of it; as it is otherwise."""
    first, sub_group = origin
    g = r.group
    if first is None or g < 0 or abs(g - first) > GROUP_WINDOW:
        return g
    if sub_group or r.kind == TensorKind.BUFFER:
        return ("g", g - first)
    return g


def _origin(unit: int, ops: Sequence[Op]) -> Origin:
    """A run's group origin: its sub-group (a step's run), or its lowest buffer number."""
    if ops and ops[0].tag.layer < 0:
        return (unit, True)
    buffers = [r.group for r in _refs(ops) if r.kind == TensorKind.BUFFER and r.group >= 0]
    return (min(buffers) if buffers else None, False)


def _refs(ops: Sequence[Op]) -> list[TensorRef]:
    """Every tensor the ops name (in their bodies, reads and writes)."""
    out: list[TensorRef] = []
    for op in ops:
        out += [v for f in dataclasses.fields(op.body) if isinstance(v := getattr(op.body, f.name), TensorRef)]
        out += [*op.reads, *op.writes]
    return out


def _canon(op: Op, unit: int, first_id: int, origin: Origin) -> tuple[Any, ...]:
    """``op`` relative to its run (``unit``: the run's layer or sub-group; ``origin``: its group
    origin, :func:`_origin`)."""
    def ref(r: TensorRef) -> tuple[Any, ...]:
        return (r.kind, _rel(r.unit, unit), _group(r, origin), r.mb)

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
            canon = tuple(_canon(op, unit, ops[0].id, _origin(unit, ops)) for op in ops)
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


class _UnitCanon(_Canon):
    """:class:`offsim.engine.steady._Canon` with layer or sub-group numbers taken relative to the
    unit ``unit`` whose run begins at op ``start`` of the block: units, tensor references, op
    identities, cache positions (relative to each cache's accesses so far) and flow names (numbers
    blanked). ``next_use``: compare the residents' next-use positions (as the shortcut does)."""

    def __init__(self, ex: Executor, run: Boundary, programs: dict[int, tuple[Any, ...]], next_use: bool) -> None:
        super().__init__(ex, ex.cursor.frames[-1], _accesses(ex, ex.cursor.frames[-1]))
        self.start, _, self.unit, self.segment, self.origin = run
        self.programs, self.next_use = programs, next_use

    def rel(self, unit: int) -> int | str:
        return unit - self.unit if unit >= 0 else f"fixed {unit}"

    def ref(self, ref: Any) -> Any:
        if isinstance(ref, TensorRef):
            return (str(ref.kind), self.rel(ref.unit), _group(ref, self.origin), self.micro_batch(ref.mb))
        return super().ref(ref)

    def op_id(self, op: Op) -> Any:
        program = self.programs.get(id(op))
        if program is not None:
            return (*program[:2], self.rel(program[2]), program[3])
        return ("block", op.id - self.start) if op.id >= self.segment else ("fixed", op.id)

    def pos(self, cache_id: Any, position: int) -> Any:
        cache = self.ex.caches[cache_id]
        if not isinstance(cache, PolicyCache):
            return position
        return position - cache.counters.get(_key(cache, self.frame), 0)

    def flow(self, f: Any) -> Any:
        described = super().flow(f)
        if described[0] == "flow" and len(described) > 2:
            return (described[0], _NUMBER.sub("#", described[1]), *described[2:])
        return described

    def describe_nodes(self) -> None:
        k = 0
        while k < len(self.nodes):
            n = self.nodes[k]
            self.t(n.head_s)
            self.t(n.start_s)
            position: Any = self.pos(n.op.body.cache, n.position) if n.position >= 0 else n.position  # type: ignore[union-attr]
            self.described.append((self.op_id(n.op), self.iteration(n.iteration), self.micro_batch(n.micro_batch),
                                   n.phase, n.pending, self.val(n.then), position, self.val(n.stream_pred),
                                   self.val(n.request), tuple(self.val(w) for w in n.waiters)))
            k += 1


def _unit_caches(c: _UnitCanon) -> Any:
    """The caches, units and positions relative (the steady shortcut's ``_caches``, by unit)."""
    out: list[Any] = []
    for cid, cache in c.ex.caches.items():
        if isinstance(cache, FetchTracker):
            out.append((str(cid), tuple(((c.iteration(it), c.micro_batch(mb), c.rel(u)), c.val(n))
                                        for (it, mb, u), n in cache.present.items())))
            continue
        present = tuple((c.rel(u), c.val(n)) for u, n in cache.present.items())
        open_ = tuple((c.rel(u), tuple(c.pos(cid, p) for p in q)) for u, q in cache.open.items() if q)
        resident: list[Any] = []
        inner = cache.cache
        if inner is not None:
            for t, r in inner.resident.items():
                nxt = inner._next[r.last_use]
                resident.append((c.rel(t), r.size_bytes, c.pos(cid, r.inserted_at), c.pos(cid, r.last_use),
                                 None if nxt is None or not c.next_use else c.pos(cid, nxt)))
            c.values.append(inner.used_bytes)
            pins = tuple((c.rel(t), n) for t, n in inner.pins.items() if n > 0)
        out.append((str(cid), c.pos(cid, cache.issued), present, open_, tuple(resident), pins if inner else None))
    return tuple(out)


def _held(c: _UnitCanon, window: int | None) -> Any:
    """The memory held, units relative; with ``window``, the tensors of units more than
    ``window`` units back (a stack that grows a unit a period: activations kept for backward)
    are left out, as they are not compared but would have to be added at a jump."""
    mem = c.ex.memory
    held = []
    for (tier, key), n in mem.held.items():
        ref = c.ref(key)
        if window is not None and isinstance(ref[1], int) and abs(ref[1]) > window:
            continue
        held.append((str(tier), ref, n))
    return tuple(sorted(held, key=repr))


def _unit_snapshot(ex: Executor, run: Boundary, programs: dict[int, tuple[Any, ...]],
                   next_use: bool, window: int | None) -> Snapshot:
    """The executor's state relative to the start of ``run``."""
    c = _UnitCanon(ex, run, programs, next_use)
    cur = ex.cursor
    counter = (id(cur.block), cur.op_index - c.start, tuple(c.val(n) for n in cur.nodes[c.start:]))
    totals = None if window is not None else _memory(c)
    shape = (counter, _queue(c), _resources(c), _held(c, window), totals, _writers(c), _unit_caches(c))
    c.describe_nodes()
    return Snapshot((shape, tuple(c.described)), c.times, c.values, c.nodes)


def _programs(schedule: Any) -> dict[int, tuple[Any, ...]]:
    """Each cache program's ops: (what, cache, unit, index)."""
    out: dict[int, tuple[Any, ...]] = {}
    for spec in schedule.caches:
        for what, programs in (("fetch", spec.fetch), ("evict", spec.evict)):
            for unit, block in programs.items():
                for op in block.ops:
                    out[id(op)] = (what, str(spec.id), unit, op.id)
    return out


def _boundaries(schedule: Any) -> dict[int, list[Boundary]]:
    """Per block (by id), its runs: first op id, phase, unit, the first op of the phase's
    periodic part (the first run equal, relative, to the run after it) and the group origin."""
    out: dict[int, list[Boundary]] = {}
    for b in schedule.blocks():
        runs = [r for r in _runs(b) if r[1] >= 0]
        canons = [tuple(_canon(op, unit, ops[0].id, _origin(unit, ops)) for op in ops) for _, unit, ops in runs]
        segment: dict[str, int] = {}
        for i, (phase, _, ops) in enumerate(runs[:-1]):
            if phase not in segment and runs[i + 1][0] == phase and canons[i] == canons[i + 1]:
                segment[phase] = ops[0].id
        out[id(b)] = [(ops[0].id, phase, unit, segment.get(phase, ops[0].id), _origin(unit, ops))
                      for phase, unit, ops in runs]
    return out


def state_periods(case: tuple[str, str, str], iteration: int = 1) -> None:
    """Run ``case`` without the shortcut, snapshot the whole state (relative to the unit) as each
    run of ``iteration`` begins, and count the boundaries whose state matches the one before, to
    the shortcut's tolerances: with the residents' next-use positions compared, and without."""
    composed = compose_run(make_run_config(*case, iterations=3)).compiled()
    schedule = composed.schedule
    assert schedule is not None, "compiled() compiles"
    ex = make_executor(composed.cfg, composed.sz, schedule=schedule)
    starts, programs = _boundaries(schedule), _programs(schedule)
    seen: dict[str, list[tuple[Any, ...]]] = {}
    snapshot_s: list[float] = []
    ex._walk_accesses()
    ex._advance()
    cursor, clock, queue = ex.cursor, ex.clock, ex.clock.queue
    block_id, todo = -1, list[Boundary]()
    while queue:
        clock.now_s, _, call, arg = heappop(queue)
        call(arg)
        if cursor.block is None or cursor.iteration != iteration:
            continue
        if id(cursor.block) != block_id:
            block_id, todo = id(cursor.block), list(starts.get(id(cursor.block), []))
        while todo and cursor.op_index > todo[0][0]:
            run = todo.pop(0)
            if todo and cursor.op_index > todo[0][0]:
                continue  # more than one run begun in one step: not a boundary of its own
            try:
                t0 = time.process_time()
                snaps = [_unit_snapshot(ex, run, programs, nu, w) for nu, w in VARIANTS]
                snapshot_s.append((time.process_time() - t0) / len(VARIANTS))
            except OpaqueStateError:
                continue
            seen.setdefault(run[1], []).append((run[2], clock.now_s, *snaps))
    for phase, rows in seen.items():
        counts = []
        for k in range(len(VARIANTS)):
            matched = [b[0] for a, b in itertools.pairwise(rows)
                       if b[2 + k].matches(a[2 + k], max(abs(b[1]), b[1] - a[1]))]
            counts.append(f"{len(matched)} (from unit {matched[0] if matched else None})")
        print(f"state iteration {iteration} {phase}: {len(rows)} boundaries; the state matches the one "
              f"before: {'; '.join(f'{name} {n}' for name, n in zip(VARIANT_NAMES, counts, strict=True))}")
    snapshot_s.sort()
    if snapshot_s:
        print(f"a snapshot: median {snapshot_s[len(snapshot_s) // 2] * 1e3:.2f} ms, "
              f"max {snapshot_s[-1] * 1e3:.2f} ms (CPU, {len(snapshot_s)} boundaries)")


def main() -> None:
    if "--state" in sys.argv:
        sys.argv.remove("--state")
        state_periods(tuple(sys.argv[1:4]) if len(sys.argv) >= 4 else CASE)  # type: ignore[arg-type]
        return
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
