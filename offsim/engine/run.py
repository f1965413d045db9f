"""simulate(): plan, check the fit, run the engine, summarise."""

from __future__ import annotations

import time
from collections.abc import Callable

from offsim.cache_stats import cache_stats
from offsim.config.run import RunConfig
from offsim.engine.simulate import run_engine
from offsim.errors import InfeasibleError
from offsim.metrics import RunMetrics, steady_iterations, summarize
from offsim.plan.footprint import check_fit, footprint, state_sizes
from offsim.plan.policy_plan import activation_policy, custom_activations
from offsim.results import RunResult


def simulate(cfg: RunConfig, on_iteration: Callable[[int, int], None] | None = None) -> RunResult:
    """Simulate ``cfg``. A configuration that does not fit returns ``feasible=False`` with the
    tier, the need and the capacity in ``infeasible_reason``; it is never silently simulated.

    ``on_iteration(done, total)`` reports progress as iterations finish."""
    t0 = time.perf_counter()
    sz = state_sizes(cfg)
    fp = footprint(cfg, sz)
    fp_dict = {"need": fp.need_bytes, "capacity": fp.capacity_bytes}
    try:
        check_fit(cfg, sz)
        rec, ledger, events = run_engine(cfg, sz, on_iteration)
    except InfeasibleError as exc:
        metrics = RunMetrics(feasible=False, infeasible_reason=str(exc), infeasible_tier=exc.tier)
        return RunResult(cfg, metrics, footprint_bytes=fp_dict, wall_time_s=time.perf_counter() - t0)
    metrics = summarize(cfg, rec, ledger.peak)
    act = activation_policy(cfg, sz).name if custom_activations(cfg) else None
    metrics = metrics.model_copy(update={"cache": cache_stats(rec, steady_iterations(cfg, rec)[0]),
                                         "activation_policy": act})
    return RunResult(cfg, metrics, rec, fp_dict, events, time.perf_counter() - t0)
