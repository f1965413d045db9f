"""Per-cache statistics of a run, scored against the offline optimum (steady state).

Computed from the cache events the engine records (:class:`~offsim.trace.CacheEvent`) and, for
the GPU parameter buffer's stall, from the GPU's "waits for params" spans. OPT is
:func:`offsim.policies.opt.optimal_plan` run on the same access sequence within the same
budget: the cache's capacity, or, for an unbounded cache, the most it ever held in the run
(OPT with the memory the policy actually used). Regret is what the policy fetched beyond it.
"""

from __future__ import annotations

from collections import defaultdict

from pydantic import BaseModel

from offsim.policies.opt import optimal_plan
from offsim.trace import CacheEvent, Recorder


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
        opt_bytes_fetched: bytes OPT fetches on the same sequence and budget.
        regret_bytes: ``bytes_fetched - opt_bytes_fetched``.
        opt_exact: OPT was found by complete enumeration.
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
    opt_bytes_fetched: float = 0.0
    regret_bytes: float = 0.0
    opt_exact: bool = True


PARAM_STALL_SUFFIX = "waits for params"  # names of the GPU's stall spans for parameters (engine)


def _opt_per_iteration(events: list[CacheEvent], info: dict,
                       steady: list[int]) -> tuple[dict[int, float], bool]:
    """OPT bytes fetched in each steady iteration."""
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
    opt, exact = _opt_per_iteration(events, info, steady) if events else ({}, True)
    opt_bytes = sum(opt.get(it, 0.0) for it in steady) / n
    accesses = sums["hit_n"] + sums["miss_n"]
    regret = sums["miss"] / n - opt_bytes
    if abs(regret) <= 1e-9 * max(opt_bytes, 1.0):  # the same bytes summed in another order
        regret = 0.0
    return CacheStats(
        tier=info["tier"], policy=info["policy"], fetch_links=info["fetch_links"],
        writeback_links=info["writeback_links"], capacity_bytes=info["capacity_bytes"],
        peak_bytes=info["peak_bytes"], hits=sums["hit_n"] / n, misses=sums["miss_n"] / n,
        hit_rate=sums["hit_n"] / accesses if accesses else None, bytes_fetched=sums["miss"] / n,
        bytes_evicted=(sums["evict"] + sums["release"]) / n, bytes_written_back=sums["writeback"] / n,
        stall_s=sums["stall"] / n, opt_bytes_fetched=opt_bytes, regret_bytes=regret,
        opt_exact=exact,
    )


def cache_stats(rec: Recorder, steady: list[int]) -> dict[str, CacheStats]:
    """Statistics of every cache the run had, averaged over the ``steady`` iterations."""
    if not steady:
        return {}
    return {name: _one_cache(rec, name, info, steady) for name, info in rec.cache_info.items()}
