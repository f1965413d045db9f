"""simulate(): plan, check the fit, run the engine, summarise."""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from offsim.cache_stats import cache_stats
from offsim.config.run import RunConfig
from offsim.engine.simulate import run_engine
from offsim.errors import InfeasibleError
from offsim.metrics import RunMetrics, steady_iterations, summarize
from offsim.plan.footprint import StateSizes, check_fit, footprint, state_sizes
from offsim.plan.policy_plan import activation_policy, custom_activations
from offsim.results import RunResult
from offsim.trace import Recorder


def run_schedule(cfg: RunConfig, sz: StateSizes,
                 on_iteration: Callable[[int, int], None] | None = None) -> tuple[Recorder, dict[str, float], int]:
    """Compile ``cfg`` into a schedule and execute it; returns the recorder, the peak bytes per
    reported tier and the SimPy events processed."""
    from offsim.core.enums import CacheId, ChoiceId
    from offsim.engine.execute import Executor, Machine
    from offsim.engine.hooks import CachePolicy, ChoicePolicy
    from offsim.engine.policy_hooks import PolicyHooks
    from offsim.engine.transfers import resource_capacities
    from offsim.plan.footprint import capacities
    from offsim.plan.policy_plan import build_context
    from offsim.systems.generic import compile_generic, split_policy

    schedule = compile_generic(cfg)
    rec = Recorder()
    hooks = PolicyHooks(cfg, sz, rec)
    policies = {CacheId.GPU_PARAMS: CachePolicy(hooks.eviction, hooks.prefetch, hooks.bpp_param)}
    dram = schedule.cache(CacheId.DRAM_OPTIMIZER)
    if dram is not None:
        ctx = build_context(cfg, len(dram.unit_bytes), sz.optimizer_bytes_per_param)
        policies[CacheId.DRAM_OPTIMIZER] = CachePolicy(cfg.strategy.policies.dram_eviction.build(ctx))
    hw = cfg.hardware
    machine = Machine(resource_capacities(cfg, sz), hw.host_link.duplex_efficiency, hw.gpu.copy_engines,
                      capacities(cfg), sz.ranks_per_node, hw.topology.nodes)
    choices: dict[ChoiceId, ChoicePolicy] = {}
    if schedule.choice(ChoiceId.OPTIMIZER_SPLIT) is not None:
        choices[ChoiceId.OPTIMIZER_SPLIT] = split_policy(cfg)
    executor = Executor(schedule, machine, policies, rec, on_iteration, choices)
    events = executor.run()
    return rec, executor.memory.peak_bytes, events


def _engine(cfg: RunConfig) -> str:
    """Which engine runs ``cfg``: the schedule executor, unless ``OFFSIM_ENGINE=simpy`` asks
    for the old SimPy engine (kept until issue 14's step 5, for the agreement test) or the
    configuration needs what the schedule lacks (Deep Optimizer States' run-time split)."""
    return os.environ.get("OFFSIM_ENGINE", "schedule")


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
        if _engine(cfg) == "schedule":
            rec, peaks, events = run_schedule(cfg, sz, on_iteration)
        else:
            rec, ledger, events = run_engine(cfg, sz, on_iteration)
            peaks = ledger.peak
    except InfeasibleError as exc:
        metrics = RunMetrics(feasible=False, infeasible_reason=str(exc), infeasible_tier=exc.tier)
        return RunResult(cfg, metrics, footprint_bytes=fp_dict, wall_time_s=time.perf_counter() - t0)
    metrics = summarize(cfg, rec, peaks)
    act = activation_policy(cfg, sz).name if custom_activations(cfg) else None
    metrics = metrics.model_copy(update={"cache": cache_stats(rec, steady_iterations(cfg, rec)[0]),
                                         "activation_policy": act})
    return RunResult(cfg, metrics, rec, fp_dict, events, time.perf_counter() - t0)
