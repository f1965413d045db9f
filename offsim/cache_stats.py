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

:func:`cache_bound` bounds the bytes any policy must move in a cache from below and the best
schedule found from above (:mod:`offsim.policies.bounds`: the min-cost-flow bound for tensors of
several sizes); it is a bound whatever the sizes, and what ``offsim compare`` and the run table
score against. It is not part of :class:`CacheStats` (the run metrics are unchanged).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from functools import lru_cache
from typing import TYPE_CHECKING

from pydantic import BaseModel

from offsim.policies.opt import optimal_plan
from offsim.trace import CacheEvent, Recorder

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

    @property
    def opt_bytes_fetched(self) -> float:
        """The old name of :attr:`offline_plan_bytes_fetched`, for ``commands/_common.py`` until
        it reads the new one (not in the JSON); remove with that reader."""
        return self.offline_plan_bytes_fetched


PARAM_STALL_SUFFIX = "waits for params"  # names of the GPU's stall spans for parameters (engine)


def _plan_per_iteration(events: list[CacheEvent], info: dict,
                       steady: list[int]) -> tuple[dict[int, float], bool]:
    """Bytes the offline plan fetches in each steady iteration."""
    accesses = [e for e in events if e.kind in ("hit", "miss")]
    sizes = {e.tensor: e.bytes for e in accesses}
    capacity = info["capacity_bytes"]
    if capacity is None:
        capacity = info["peak_bytes"]
    out: dict[int, float] = {}
    exact = True
    if info["persistent"]:
        plan = optimal_plan([e.tensor for e in accesses], sizes, capacity)
        for e, b in zip(accesses, plan.fetched_bytes, strict=True):
            out[e.iteration] = out.get(e.iteration, 0.0) + b
        return out, plan.exact
    for it in steady:
        seq = [e.tensor for e in accesses if e.iteration == it]
        plan = optimal_plan(seq, sizes, capacity)
        out[it], exact = plan.total_bytes, exact and plan.exact
    return out, exact


def _one_cache(rec: Recorder, name: str, info: dict, steady: list[int]) -> CacheStats:
    n = len(steady)
    steady_set = set(steady)
    events = [e for e in rec.cache_events if e.cache == name]
    sums: dict[str, float] = defaultdict(float)
    for e in events:
        if e.iteration in steady_set:
            sums[e.kind + "_n"] += 1
            sums[e.kind] += e.bytes
            sums["stall"] += e.seconds
    if name == "gpu_params":
        sums["stall"] = sum(s.end_s - s.start_s for s in rec.spans
                            if s.resource == "gpu_stall" and s.iteration in steady_set
                            and s.name.endswith(PARAM_STALL_SUFFIX))
    plan, exact = _plan_per_iteration(events, info, steady) if events else ({}, True)
    plan_bytes = sum(plan.get(it, 0.0) for it in steady) / n
    accesses = sums["hit_n"] + sums["miss_n"]
    over = sums["miss"] / n - plan_bytes
    if abs(over) <= 1e-9 * max(plan_bytes, 1.0):  # the same bytes summed in another order
        over = 0.0
    return CacheStats(
        tier=info["tier"], policy=info["policy"], fetch_links=info["fetch_links"],
        writeback_links=info["writeback_links"], capacity_bytes=info["capacity_bytes"],
        peak_bytes=info["peak_bytes"], hits=sums["hit_n"] / n, misses=sums["miss_n"] / n,
        hit_rate=sums["hit_n"] / accesses if accesses else None, bytes_fetched=sums["miss"] / n,
        bytes_evicted=(sums["evict"] + sums["release"]) / n, bytes_written_back=sums["writeback"] / n,
        stall_s=sums["stall"] / n, offline_plan_bytes_fetched=plan_bytes,
        bytes_over_offline_plan=over, offline_plan_exact=exact,
    )


def cache_stats(rec: Recorder, steady: list[int]) -> dict[str, CacheStats]:
    """Statistics of every cache the run had, averaged over the ``steady`` iterations."""
    if not steady:
        return {}
    return {name: _one_cache(rec, name, info, steady) for name, info in rec.cache_info.items()}


# ---------------------------------------------------------------- bounds (offsim.policies.bounds)
def access_sequence(rec: Recorder, cache: str,
                    iterations: Iterable[int]) -> tuple[list[int], dict[int, float]]:
    """The tensors ``cache`` was asked for in ``iterations`` (in the engine's order), and their
    bytes: the same sequence the engine's cache served, read from its hit and miss events."""
    wanted = set(iterations)
    accesses = [e for e in rec.cache_events if e.cache == cache and e.kind in ("hit", "miss")
                and e.iteration in wanted]
    return [e.tensor for e in accesses], {e.tensor: e.bytes for e in accesses}


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
