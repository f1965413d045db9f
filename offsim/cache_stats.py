"""Per-cache statistics of a run (steady state), and bounds on the bytes any policy must move.

Computed from the cache events the engine records (:class:`~offsim.trace.CacheEvent`) and, for
the GPU parameter buffer's stall, from the GPU's "waits for params" spans.

``offline_plan_bytes_fetched`` is what the **offline plan** of
:func:`offsim.policies.opt.optimal_plan` fetches on the same access sequence within the same
budget (the cache's capacity, or, for an unbounded cache, the most it ever held): Belady's rule
with a search over the tensors of odd sizes, complete only when ``offline_plan_exact``. It is a
reference, not the optimum and not a bound (a heuristic can fetch less; it was called
``opt_bytes_fetched`` until the goldens were re-recorded for the name); reports name it
"belady (heuristic)". ``bytes_over_offline_plan`` is what the policy fetched beyond it (negative
where the policy fetched less).

Every figure is read from the held records and the repeats of the steady-state shortcut
(:class:`CacheEvents`): a stretch of records is summed once however many copies the run holds,
a cache emptied every iteration is planned once per distinct iteration, and a persistent cache's
plan covers the run's start and its first :data:`PERSISTENT_PLAN_ITERATIONS` steady iterations,
so the cost stays constant past the steady state.

:func:`cache_bound` bounds the bytes any policy must move in a cache from below and the best
schedule found from above (:mod:`offsim.policies.bounds`: the min-cost-flow bound for tensors of
several sizes); it is a bound whatever the sizes, and what ``offsim compare`` and the run table
score against. It is not part of :class:`CacheStats` (the run metrics are unchanged).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING

from pydantic import BaseModel

from offsim.policies.opt import optimal_plan
from offsim.trace import CacheEvent, Recorder, RecordLog

if TYPE_CHECKING:  # the bounds need SciPy: imported where a bound is computed, not by every run
    from offsim.policies.bounds import CacheBound, Problem


class CacheStats(BaseModel):
    """One cache's counts per iteration (averaged over the steady iterations).

    Attributes:
        tier: memory tier the cache lives in (``gpu``, ``host``).
        policy: the eviction policy.
        fetch_links / writeback_links: links a miss / a write-back moves bytes over.
        capacity_bytes: the budget (None: unbounded).
        peak_bytes: most bytes held at once.
        hits / misses: accesses that found / did not find their tensor.
        hit_rate: hits / accesses.
        bytes_fetched: bytes brought in by misses.
        bytes_evicted: bytes dropped for room or released after use.
        bytes_written_back: dirty bytes written to the tier below.
        stall_s: seconds the consumer (GPU for parameters, CPU optimizer for sub-groups) waited.
        offline_plan_bytes_fetched: bytes the offline plan (:func:`~offsim.policies.opt.optimal_plan`,
            a heuristic unless ``offline_plan_exact``; not a bound) fetches on the same sequence and budget.
        bytes_over_offline_plan: ``bytes_fetched - offline_plan_bytes_fetched`` (against that plan,
            not a bound: negative where the policy fetched less; the regret against the lower bound
            is ``offsim compare``'s ``regret_bytes``).
        offline_plan_exact: the plan's search over odd-sized tensors was complete.
    """

    tier: str
    policy: str
    fetch_links: list[str] = []
    writeback_links: list[str] = []
    capacity_bytes: float | None = None
    peak_bytes: float = 0.0
    hits: float = 0.0
    misses: float = 0.0
    hit_rate: float | None = None
    bytes_fetched: float = 0.0
    bytes_evicted: float = 0.0
    bytes_written_back: float = 0.0
    stall_s: float = 0.0
    offline_plan_bytes_fetched: float = 0.0
    bytes_over_offline_plan: float = 0.0
    offline_plan_exact: bool = True


PARAM_STALL_SUFFIX = "waits for params"  # names of the GPU's stall spans for parameters (engine)

#: A persistent cache's offline plan covers the run from its start through this many steady
#: iterations (all of them when there are fewer); its figure is their average. Later steady
#: iterations repeat them, so the figure does not depend on how many iterations were run, and its
#: cost stays constant past the steady state (issue 16).
PERSISTENT_PLAN_ITERATIONS = 2


@dataclass
class _Piece:
    """One cache's events of one iteration within one stretch of held records."""

    counts: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    sums: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    accesses: list[tuple[int, float]] = field(default_factory=list)  # (tensor, bytes) of hits and misses


@dataclass
class _Stretch:
    """The held records ``items[first:last]``, per cache: its pieces by iteration, and its
    accesses in record order with their iterations (for sequences over several iterations)."""

    pieces: dict[tuple[str, int], _Piece]
    ordered: dict[str, list[tuple[int, int, float]]]  # cache -> (iteration, tensor, bytes)


def _stretch(items: list[CacheEvent]) -> _Stretch:
    out = _Stretch({}, defaultdict(list))
    for e in items:
        piece = out.pieces.get((e.cache, e.iteration))
        if piece is None:
            piece = out.pieces[(e.cache, e.iteration)] = _Piece()
        piece.counts[e.kind] += 1
        piece.sums[e.kind] += e.bytes
        piece.sums["stall"] += e.seconds
        if e.kind in ("hit", "miss"):
            piece.accesses.append((e.tensor, e.bytes))
            out.ordered[e.cache].append((e.iteration, e.tensor, e.bytes))
    return out


@dataclass
class CacheEvents:
    """A run's cache events read from the held records and the repeats the steady-state shortcut
    left (:meth:`offsim.trace.RecordLog.runs`): each stretch of held records is read once, however
    many copies of it the run holds. ``iterations[cache][it]`` are the pieces iteration ``it``
    is made of, in order: two iterations made of the same pieces saw the same events.

    Attributes:
        iterations: per cache, per iteration, (stretch key, piece) in record order.
        runs: every run of the records: (stretch, iteration shift).
    """

    iterations: dict[str, dict[int, list[tuple[tuple[int, int, int], _Piece]]]]
    runs: list[tuple[_Stretch, int]]

    @classmethod
    def of(cls, rec: Recorder) -> CacheEvents:
        """The recorder's cache events, indexed once until more is recorded."""
        out = rec.cache_events.derived("cache_stats", _index)
        assert isinstance(out, CacheEvents)
        return out

    def accesses(self, cache: str, wanted: Callable[[int], bool]) -> list[tuple[int, int, float]]:
        """(iteration, tensor, bytes) of every hit and miss of ``cache`` in the iterations
        ``wanted`` accepts, in the engine's order."""
        return [(it + d_iteration, tensor, nbytes) for stretch, d_iteration in self.runs
                for it, tensor, nbytes in stretch.ordered.get(cache, ()) if wanted(it + d_iteration)]

    def sequence(self, cache: str, wanted: Callable[[int], bool]) -> tuple[list[int], dict[int, float]]:
        """The tensors ``cache`` was asked for in the iterations ``wanted`` accepts, in the
        engine's order, and their bytes."""
        accesses = self.accesses(cache, wanted)
        return [t for _it, t, _b in accesses], {t: b for _it, t, b in accesses}


def _index(log: RecordLog[CacheEvent]) -> CacheEvents:
    items = log.window()
    stretches: dict[tuple[int, int], _Stretch] = {}
    out = CacheEvents(defaultdict(lambda: defaultdict(list)), [])
    for first, last, _dt_s, d_iteration in log.runs():
        stretch = stretches.get((first, last))
        if stretch is None:
            stretch = stretches[(first, last)] = _stretch(items[first:last])
        out.runs.append((stretch, d_iteration))
        for (cache, it), piece in stretch.pieces.items():
            out.iterations[cache][it + d_iteration].append(((first, last, it), piece))
    return out


def _stall_per_iteration(rec: Recorder) -> dict[int, float]:
    """Seconds the GPU waited for parameters in each iteration (its "waits for params" spans),
    each stretch of held spans read once."""
    items = rec.spans.window()
    stretches: dict[tuple[int, int], dict[int, float]] = {}
    out: dict[int, float] = defaultdict(float)
    for first, last, _dt_s, d_iteration in rec.spans.runs():
        part = stretches.get((first, last))
        if part is None:
            part = stretches[(first, last)] = defaultdict(float)
            for s in items[first:last]:
                if s.resource == "gpu_stall" and s.name.endswith(PARAM_STALL_SUFFIX):
                    part[s.iteration] += s.end_s - s.start_s
        for it, seconds in part.items():
            out[it + d_iteration] += seconds
    return out


def _plan_bytes(events: CacheEvents, name: str, info: dict, steady: list[int]) -> tuple[float, bool]:
    """Bytes per steady iteration the offline plan fetches, and whether its search was complete.

    A cache emptied every iteration: one plan per distinct iteration (the same pieces, the same
    sequence). A persistent cache: one plan over the run from its start through the first
    :data:`PERSISTENT_PLAN_ITERATIONS` steady iterations, averaged over those."""
    capacity = info["capacity_bytes"]
    if capacity is None:
        capacity = info["peak_bytes"]
    if info["persistent"]:
        window = steady[:PERSISTENT_PLAN_ITERATIONS]
        accesses = events.accesses(name, lambda it: it <= window[-1])
        plan = optimal_plan([t for _it, t, _b in accesses], {t: b for _it, t, b in accesses}, capacity)
        wanted = set(window)
        fetched = sum(b for (it, _t, _s), b in zip(accesses, plan.fetched_bytes, strict=True) if it in wanted)
        return fetched / len(window), plan.exact
    per_iteration = events.iterations[name]
    sizes = {t: b for pieces in per_iteration.values() for _key, piece in pieces for t, b in piece.accesses}
    plans: dict[tuple[tuple[int, int, int], ...], tuple[float, bool]] = {}
    total, exact = 0.0, True
    for it in steady:
        pieces = per_iteration.get(it, [])
        key = tuple(k for k, _piece in pieces)
        if key not in plans:
            plan = optimal_plan([t for _k, piece in pieces for t, _b in piece.accesses], sizes, capacity)
            plans[key] = (plan.total_bytes, plan.exact)
        total, exact = total + plans[key][0], exact and plans[key][1]
    return total / len(steady), exact


def _one_cache(rec: Recorder, events: CacheEvents, name: str, info: dict, steady: list[int]) -> CacheStats:
    n = len(steady)
    counts: dict[str, float] = defaultdict(float)
    sums: dict[str, float] = defaultdict(float)
    per_iteration = events.iterations.get(name, {})
    for it in steady:
        for _key, piece in per_iteration.get(it, []):
            for kind, k in piece.counts.items():
                counts[kind] += k
            for kind, x in piece.sums.items():
                sums[kind] += x
    if name == "gpu_params":
        stall = _stall_per_iteration(rec)
        sums["stall"] = sum(stall.get(it, 0.0) for it in steady)
    plan_bytes, exact = _plan_bytes(events, name, info, steady) if per_iteration else (0.0, True)
    accesses = counts["hit"] + counts["miss"]
    over = sums["miss"] / n - plan_bytes
    if abs(over) <= 1e-9 * max(plan_bytes, 1.0):  # the same bytes summed in another order
        over = 0.0
    return CacheStats(
        tier=info["tier"], policy=info["policy"], fetch_links=info["fetch_links"],
        writeback_links=info["writeback_links"], capacity_bytes=info["capacity_bytes"],
        peak_bytes=info["peak_bytes"], hits=counts["hit"] / n, misses=counts["miss"] / n,
        hit_rate=counts["hit"] / accesses if accesses else None, bytes_fetched=sums["miss"] / n,
        bytes_evicted=(sums["evict"] + sums["release"]) / n, bytes_written_back=sums["writeback"] / n,
        stall_s=sums["stall"] / n, offline_plan_bytes_fetched=plan_bytes,
        bytes_over_offline_plan=over, offline_plan_exact=exact,
    )


def cache_stats(rec: Recorder, steady: list[int]) -> dict[str, CacheStats]:
    """Statistics of every cache the run had, averaged over the ``steady`` iterations."""
    if not steady:
        return {}
    events = CacheEvents.of(rec)
    return {name: _one_cache(rec, events, name, info, steady) for name, info in rec.cache_info.items()}


# ---------------------------------------------------------------- bounds (offsim.policies.bounds)
def access_sequence(rec: Recorder, cache: str,
                    iterations: Iterable[int]) -> tuple[list[int], dict[int, float]]:
    """The tensors ``cache`` was asked for in ``iterations`` (in the engine's order), and their
    bytes: the same sequence the engine's cache served, read from its hit and miss events."""
    wanted = set(iterations)
    return CacheEvents.of(rec).sequence(cache, wanted.__contains__)


def _replays(problem: Problem, sequence: list[int], sizes: dict[int, float],
             capacity_bytes: float) -> list[list[int]]:
    """Schedules of Belady's rule and Belady-Size on the bare sequence (fetch on demand), as kept
    intervals: candidates for the upper bound."""
    from offsim.engine.cache import Cache
    from offsim.policies.belady import Belady
    from offsim.policies.belady_size import BeladySize
    from offsim.policies.bounds import kept_intervals

    out = []
    for policy in (Belady(), BeladySize()):
        cache = Cache("bound", policy, sequence, sizes, capacity_bytes)
        hits = []
        for k in range(len(sequence)):
            served = cache.serve(k)  # a due access is served or raises, never None
            hits.append(served is not None and served.hit)
            cache.done(k)
        out.append(kept_intervals(problem, hits, cache.resident))
    return out


Pairs = tuple[tuple[int, float], ...]  # a mapping, hashable (for the cache of bounds)


@lru_cache(maxsize=256)
def _bound(sequence: tuple[int, ...], sizes: Pairs, capacity_bytes: float, read: Pairs, write: Pairs,
           warm_start: bool) -> CacheBound:
    """One window's bounds (memoised: every policy of a comparison sees the same sequence)."""
    from offsim.policies.bounds import bound, build_problem

    seq, size = list(sequence), dict(sizes)
    problem = build_problem(seq, size, capacity_bytes, dict(read), dict(write), warm_start)
    return bound(problem, _replays(problem, seq, size, capacity_bytes))


def _items(mapping: Mapping[int, float]) -> Pairs:
    return tuple(sorted(mapping.items()))


def cache_bound(rec: Recorder, cache: str, steady: list[int],
                read_bytes_per_byte: Mapping[int, float] | None = None) -> CacheBound:
    """Lower and upper bound on the bytes ``cache`` moves per steady iteration, any policy.

    A cache emptied every iteration (the GPU parameter buffer) is bounded iteration by
    iteration from empty; a cache that persists (the DRAM cache over optimizer state, a
    write-back cache) over the window of steady iterations, its first contents free and its
    dirty tensors written back (:func:`offsim.policies.bounds.build_problem`). The budget is the
    cache's capacity (unbounded: ``inf``; no DRAM cache: 0, every sub-group read and written).

    Args:
        read_bytes_per_byte: per tensor, bytes a miss moves over all links per byte of the tensor
            (default 1: the cache's own bytes).
    """
    from offsim.policies.bounds import BoundMethod, CacheBound

    info = rec.cache_info[cache]
    capacity = math.inf if info["capacity_bytes"] is None else float(info["capacity_bytes"])
    windows = [steady] if info["persistent"] else [[it] for it in steady]
    parts = []
    for window in windows:
        sequence, sizes = access_sequence(rec, cache, window)
        factor = read_bytes_per_byte or {}
        read = {t: s * factor.get(t, 1.0) for t, s in sizes.items()}
        write = sizes if info["writeback_links"] else dict.fromkeys(sizes, 0.0)
        parts.append(_bound(tuple(sequence), _items(sizes), capacity, _items(read), _items(write),
                            bool(info["persistent"])))
    n = len(steady)
    method = parts[0].method if all(p.method == parts[0].method for p in parts) else BoundMethod.AVERAGE
    return CacheBound(sum(p.lower_bytes for p in parts) / n, sum(p.upper_bytes for p in parts) / n, method,
                      sum(p.solve_s for p in parts))
