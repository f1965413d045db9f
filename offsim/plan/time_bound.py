"""The time bound of a run configuration: its compiled schedule's bound on its machine.

:func:`time_lower_bound` compiles the strategy's schedule (or takes one already compiled) and
reads the least work per resource and per stream off it (:mod:`offsim.schedule.bound`,
architecture.md §9): one description of every mechanism, the one the engine executes, so the
bound cannot disagree with the engine. The machine is the engine's
(:func:`offsim.plan.paths.resource_capacities`, the GPU's copy engines), and the work is averaged
over the iterations the metrics average (:func:`offsim.metrics.steady_iterations`).

The sweep's pre-filter (:mod:`offsim.sweep.prefilter`), ProTrain's knob search
(:mod:`offsim.search.protrain`) and Fuyou's automatic swap amount
(:mod:`offsim.search.swap_amount`) all read it; ``tests/test_schedule_bound.py`` checks it is
never above the simulated steady iteration time.
"""

from __future__ import annotations

from offsim.config.run import RunConfig
from offsim.plan.footprint import StateSizes, state_sizes
from offsim.plan.paths import resource_capacities
from offsim.schedule.bound import ScheduleBound, schedule_bound
from offsim.schedule.ops import Schedule

#: a lower bound on the steady iteration time: seconds, binding term, every term (seconds)
TimeBound = ScheduleBound


def steady_indices(cfg: RunConfig) -> list[int]:
    """The iterations the metrics average over (the indices of
    :func:`offsim.metrics.steady_iterations`, which needs a finished run for their durations)."""
    return list(cfg.measured_range)


def time_lower_bound(cfg: RunConfig, sz: StateSizes | None = None, schedule: Schedule | None = None) -> TimeBound:
    """A lower bound on the simulated steady iteration time of ``cfg`` (module docstring);
    ``schedule``: its compiled schedule, when the caller has it, with ``cfg`` fitted to the
    system's measurement window (:func:`offsim.systems._registry.compose_measured`); else both
    are done here."""
    from offsim.systems._compile import compile_system  # systems compose plan modules
    from offsim.systems._registry import compose_measured

    sz = sz or state_sizes(cfg)
    if schedule is None:
        cfg, system = compose_measured(cfg, sz)
        schedule = compile_system(system)
    capacity = {str(r): c for r, c in resource_capacities(cfg, sz.ranks_per_node, sz.dp).items()}
    return schedule_bound(schedule, capacity, cfg.hardware.gpu.copy_engines, steady_indices(cfg))
