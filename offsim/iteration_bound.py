"""A lower bound on the steady iteration time that any eviction policy can reach with given budgets.

The bytes bound of :mod:`offsim.policies.bounds` says how few bytes the policy-managed caches
must move. This module turns it into seconds. For one run (one policy, one budget), the bound is
the largest of these terms:

* **The schedule's terms** (:func:`offsim.plan.time_bound.time_lower_bound`): the least work
  of the compiled schedule on each resource and stream (the GPU compute stream, each PCIe
  direction, the NVMe array, host DRAM, the CPU optimizer...) over its capacity, the caches'
  misses counted at the least any policy makes from the cache sizes alone. They do not depend
  on which tensor is evicted.
* **The caches' terms, one per shared resource**, which replace the schedule's term of the same
  name when larger. "PCIe H2D" and "PCIe D2H" are the PCIe directions; "NVMe array" is the
  array, whose reads and writes share its time.
  * Each term is the bytes outside the caches plus the least bytes the caches must move over
    that resource, over the resource's peak rate.
  * The bytes outside the caches are what this run moved that no cache accounts for (gradients,
    optimizer reads of gradients, updated parameters). Every eviction policy of the same
    strategy and budgets moves the same bytes there. ``tests/test_iteration_bound.py`` checks
    this across policies.
  * For the caches' least bytes, each miss and write-back is priced at the bytes it moves on that
    resource. For the NVMe array, a write counts as ``read rate / write rate`` bytes of read.
    The lower bound of that flow is then taken per cache, on the access sequence the engine
    served. The caches are bounded separately, so their lower bounds add.

What is a bound and what is not:

* **A bound on the modelled machine.** No resource moves bytes faster than its peak rate. Within
  a steady iteration, no resource is busy longer than the iteration (averaged over the steady
  iterations, as the metrics are). So no eviction policy with these budgets runs faster than the
  largest term in this simulator.
* **Not a prediction.** It assumes that everything else overlaps perfectly with the binding
  resource. An eviction schedule that reaches the bytes bound can still be slower when its misses
  come at moments the GPU waits for them. The distance between a policy's time and the bound is
  therefore an upper limit on what a better eviction rule could gain, not an estimate of it.
* **Not a bound for other prefetch or activation policies.** Rows of one comparison that differ
  in those get their own bound; :mod:`offsim.compare` takes the smallest over a budget's rows.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache

from offsim.cache_stats import access_sequence
from offsim.core.enums import Res
from offsim.plan.footprint import state_sizes
from offsim.plan.time_bound import time_lower_bound
from offsim.policies import bounds
from offsim.policies.bounds import (
    average_lower_bound,
    build_problem,
    flow_lower_bound,
    split_lower_bound,
)
from offsim.results import RunResult
from offsim.schedule.bound import RES_NAMES

#: Spans that move a GPU parameter buffer miss (engine kinds).
PARAM_FETCH_KINDS = ("param_fetch", "param_allgather")
GPU_PARAMS = "gpu_params"


@dataclass(frozen=True)
class IterationBound:
    """A lower bound on the steady iteration time with the budgets of one run, any eviction policy.

    Attributes:
        seconds: the bound (the largest term).
        binding: the name of the largest term (:data:`offsim.schedule.bound.GPU_COMPUTE`, a
            resource of :data:`offsim.schedule.bound.RES_NAMES`, a stream; the cache-aware terms
            replace the schedule's for the same resource when they are larger).
        terms_s: every term, seconds.
    """

    seconds: float
    binding: str
    terms_s: dict[str, float]


def _resources(result: RunResult) -> dict[str, tuple[float, dict[str, float]]]:
    """Per shared resource: seconds per equivalent byte, and the links it carries with the
    equivalent bytes per byte on each (the NVMe array's writes at its read rate)."""
    cfg = result.config
    link = cfg.hardware.host_link
    out = {
        RES_NAMES[Res.H2D]: (1.0 / max(link.h2d.pinned.peak_bytes_per_s, link.h2d.pageable.peak_bytes_per_s),
                             {"h2d": 1.0}),
        RES_NAMES[Res.D2H]: (1.0 / max(link.d2h.pinned.peak_bytes_per_s, link.d2h.pageable.peak_bytes_per_s),
                             {"d2h": 1.0}),
    }
    nvme = cfg.hardware.nvme
    if nvme is not None:
        n = state_sizes(cfg).ranks_per_node  # ranks of a node share its array
        out[RES_NAMES[Res.NVME]] = (n / nvme.read_bytes_per_s,
                       {"nvme_read": 1.0, "nvme_write": nvme.read_bytes_per_s / nvme.write_bytes_per_s})
    return out


def _steady(result: RunResult) -> list[int]:
    from offsim.metrics import steady_iterations

    return steady_iterations(result.config, result.recorder)[0]


def cache_link_factors(result: RunResult, cache: str) -> tuple[dict[str, dict[int, float]], dict[str, float]]:
    """Per link: bytes one byte of each tensor's miss moves on it, and bytes one byte of a
    write-back moves on it.

    The GPU parameter buffer's misses are measured from the run's fetch spans (host reads, H2D
    copy, all-gather), per layer; a layer this run never missed is priced at 0 (a weaker bound,
    still a bound). Another cache moves one byte per byte on each of its fetch links
    (``offsim.engine.optimizer_cache``), and a write-back one byte per byte on each of its
    write-back links."""
    info = result.recorder.cache_info[cache]
    steady = set(_steady(result))
    missed: dict[int, float] = {}
    accessed: set[int] = set()
    for e in result.recorder.cache_events:
        if e.cache == cache and e.iteration in steady and e.kind in ("hit", "miss"):
            accessed.add(e.tensor)
            if e.kind == "miss":
                missed[e.tensor] = missed.get(e.tensor, 0.0) + e.bytes
    read: dict[str, dict[int, float]] = {}
    if cache == GPU_PARAMS:
        moved: dict[tuple[str, int], float] = {}
        for s in result.recorder.spans:
            if s.iteration in steady and s.kind in PARAM_FETCH_KINDS and s.bytes:
                moved[(s.resource, s.layer)] = moved.get((s.resource, s.layer), 0.0) + s.bytes
        for (res, layer), b in moved.items():
            if missed.get(layer):
                read.setdefault(res, {})[layer] = b / missed[layer]
    else:
        for res in info["fetch_links"]:
            read[res] = dict.fromkeys(accessed, 1.0)
    write = {res: 1.0 for res in info["writeback_links"]}
    return read, write


def cache_bytes_per_link(result: RunResult, cache: str) -> dict[str, float]:
    """Bytes per steady iteration that ``cache``'s misses and write-backs moved on each link."""
    c = result.metrics.cache[cache]
    if cache == GPU_PARAMS:
        steady = set(_steady(result))
        out: dict[str, float] = {}
        for s in result.recorder.spans:
            if s.iteration in steady and s.kind in PARAM_FETCH_KINDS and s.bytes:
                out[s.resource] = out.get(s.resource, 0.0) + s.bytes / len(steady)
        return out
    info = result.recorder.cache_info[cache]
    out = dict.fromkeys(info["fetch_links"], c.bytes_fetched)
    for res in info["writeback_links"]:
        out[res] = out.get(res, 0.0) + c.bytes_written_back
    return out


Pairs = tuple[tuple[int, float], ...]


@lru_cache(maxsize=256)
def _window_lower(sequence: tuple[int, ...], sizes: Pairs, capacity_bytes: float, read: Pairs, write: Pairs,
                  warm_start: bool) -> float:
    """The least cost of one window (flow; PFOO's lower side when the flow would be slow)."""
    problem = build_problem(list(sequence), dict(sizes), capacity_bytes, dict(read), dict(write), warm_start)
    if len(problem.intervals) <= bounds.MAX_FLOW_INTERVALS:
        return flow_lower_bound(problem)[0]
    return max(average_lower_bound(problem), split_lower_bound(problem, bounds.SEGMENT_POINTS))


def least_cache_cost(result: RunResult, cache: str, read_cost: Mapping[int, float], write_cost: float) -> float:
    """Lower bound on ``cache``'s cost per steady iteration, any policy, where a miss of tensor
    ``t`` costs ``read_cost[t]`` per byte and a write-back ``write_cost`` per byte.

    Windows as :func:`offsim.cache_stats.cache_bound`: a cache emptied every iteration is bounded
    iteration by iteration from empty; a persistent one over the steady window, its first
    contents free and its dirty tensors written back."""
    rec = result.recorder
    info = rec.cache_info[cache]
    capacity = math.inf if info["capacity_bytes"] is None else float(info["capacity_bytes"])
    steady = _steady(result)
    windows = [steady] if info["persistent"] else [[it] for it in steady]
    total = 0.0
    for window in windows:
        sequence, sizes = access_sequence(rec, cache, window)
        if not sequence:
            continue
        read = tuple(sorted((t, s * read_cost.get(t, 0.0)) for t, s in sizes.items()))
        write = tuple(sorted((t, s * write_cost) for t, s in sizes.items()))
        total += _window_lower(tuple(sequence), tuple(sorted(sizes.items())), capacity, read, write,
                               bool(info["persistent"]))
    return total / len(steady)


CacheLinks = tuple[dict[str, float], dict[str, dict[int, float]], dict[str, float]]


def _cache_term(result: RunResult, seconds_per_byte: float, weights: dict[str, float],
                caches: dict[str, CacheLinks]) -> float:
    """Seconds one resource is busy at least: bytes outside the caches as moved, plus the
    caches' least bytes on it, in equivalent bytes over its rate. ``caches``: per cache, the
    bytes it moved per link, and the bytes per byte of a miss and of a write-back per link."""
    traffic = result.metrics.traffic_bytes.model_dump()
    outside = sum(w * traffic.get(link, 0.0) for link, w in weights.items())
    least = 0.0
    for cache, (moved, read, write) in caches.items():
        outside -= sum(w * moved.get(link, 0.0) for link, w in weights.items())
        tensors = {t for per in read.values() for t in per}
        read_cost = {t: sum(w * read.get(link, {}).get(t, 0.0) for link, w in weights.items()) for t in tensors}
        write_cost = sum(w * write.get(link, 0.0) for link, w in weights.items())
        if any(read_cost.values()) or write_cost:
            least += least_cache_cost(result, cache, read_cost, write_cost)
    return seconds_per_byte * (max(outside, 0.0) + least)


def iteration_lower_bound(result: RunResult) -> IterationBound:
    """A lower bound on the steady iteration time of ``result``'s strategy and budgets, whichever
    eviction policy runs (module docstring)."""
    terms = dict(time_lower_bound(result.config).terms_s)
    caches = {cache: (cache_bytes_per_link(result, cache), *cache_link_factors(result, cache))
              for cache in result.metrics.cache}
    for name, (seconds_per_byte, weights) in _resources(result).items():
        terms[name] = max(terms.get(name, 0.0), _cache_term(result, seconds_per_byte, weights, caches))
    binding = max(terms, key=lambda k: terms[k])
    return IterationBound(terms[binding], binding, terms)
