"""simulate_resolved(): size the state, check the fit, compile the schedule, execute it, summarise.

The one place where a run configuration meets the engine: the system compiles the
configuration into a :class:`~offsim.schedule.ops.Schedule`, the run-time policies come from
the strategy (:mod:`offsim.systems._policies`), the :class:`~offsim.engine.execute.Machine` from
the hardware profile, and :class:`~offsim.engine.execute.Executor` runs the schedule on it
without reading any of them.
"""

from __future__ import annotations

import dataclasses
import gc
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from offsim.cache_stats import CacheStats, cache_stats
from offsim.config.run import RunConfig
from offsim.engine import reuse
from offsim.engine.execute import Executor, Machine
from offsim.errors import InfeasibleError
from offsim.fit_check import footprint_of, raise_if_over
from offsim.metrics import RunMetrics, steady_iterations, summarize
from offsim.plan.footprint import Footprint, StateSizes, capacities, state_sizes
from offsim.plan.paths import resource_capacities
from offsim.plan.policy_plan import activation_policy, custom_activations
from offsim.results import RunResult
from offsim.schedule.ops import Schedule
from offsim.systems._compile import System, compile_system
from offsim.systems._policies import run_policies
from offsim.systems._registry import compose, compose_measured
from offsim.trace import Recorder


def machine(cfg: RunConfig, sz: StateSizes) -> Machine:
    """The hardware of ``cfg`` as the executor sees it: one simulated rank's resources."""
    hw = cfg.hardware
    capacity = {str(r): c for r, c in resource_capacities(cfg, sz.ranks_per_node, sz.dp).items()}
    return Machine(capacity, hw.host_link.duplex_efficiency, hw.gpu.copy_engines, capacities(cfg),
                   sz.ranks_per_node, hw.topology.nodes)


@dataclass(frozen=True)
class Composed:
    """A configuration composed and compiled once, for every consumer of the same point (issue
    16: the sweep's pre-filter composes and compiles a point for its time bound, and the
    simulation used to do both again).

    ``cfg`` is fitted to the system's measurement window
    (:func:`offsim.systems._registry.compose_measured`), ``system`` is composed for that ``cfg``
    and ``sz``, and ``schedule`` is ``compile_system(system)`` (None: not compiled yet). The
    executor only reads a schedule (it keeps its run state in its own nodes), so one compiled
    schedule serves the bound and the run."""

    cfg: RunConfig
    sz: StateSizes
    system: System
    schedule: Schedule | None = None
    #: :func:`~offsim.fit_check.footprint_of` the composition, once worked out (None: not yet)
    fit: Footprint | None = None

    def compiled(self) -> Composed:
        """This composition with its schedule compiled (itself when it already is)."""
        if self.schedule is not None:
            return self
        memo = reuse.active()  # in a sweep: equal compositions share one compile
        schedule = compile_system(self.system) if memo is None else memo.compiled(self.system, compile_system)
        return dataclasses.replace(self, schedule=schedule)

    def footprint(self) -> Composed:
        """This composition with its footprint worked out (itself when it already is)."""
        if self.fit is not None:
            return self
        return dataclasses.replace(self, fit=footprint_of(self.system, self.cfg, self.sz))


def compose_run(cfg: RunConfig) -> Composed:
    """``cfg`` sized, fitted to its measurement window and composed, not compiled."""
    sz = state_sizes(cfg)
    fitted, system = compose_measured(cfg, sz)
    return Composed(fitted, sz, system)


def make_executor(cfg: RunConfig, sz: StateSizes, on_iteration: Callable[[int, int], None] | None = None,
                  system: System | None = None, schedule: Schedule | None = None) -> Executor:
    """The executor of ``cfg``'s schedule (``schedule``, if already compiled, else compiled from
    its composition ``system``, if already made), not run: its recorder, policies and machine as
    :func:`run_schedule` uses them."""
    if schedule is None:
        schedule = compile_system(compose(cfg, sz) if system is None else system)
    rec = Recorder()
    policies = run_policies(cfg, sz, schedule, rec)
    return Executor(schedule, machine(cfg, sz), policies.caches, rec, on_iteration, policies.choices)


def run_schedule(cfg: RunConfig, sz: StateSizes, on_iteration: Callable[[int, int], None] | None = None,
                 steady_shortcut: bool = True, system: System | None = None,
                 schedule: Schedule | None = None,
                 layer_shortcut: bool | None = None) -> tuple[Recorder, dict[str, float], int]:
    """Compile ``cfg`` (its composition ``system``, if already made; nothing when its
    ``schedule`` is given) into a schedule and execute it; returns the recorder, the peak bytes
    per reported tier and the clock entries processed (one per event SimPy would have processed).

    ``steady_shortcut``: skip the repetitions of an iteration or a micro-batch once the run is
    in a steady state (:mod:`offsim.engine.steady`; the same metrics); False simulates every one.
    ``layer_shortcut``: skip a block's runs of identical layers (:mod:`offsim.engine.layers`; the
    same records bit for bit); None takes the engine's default, False simulates every layer.
    """
    executor = make_executor(cfg, sz, on_iteration, system, schedule)
    rec = executor.rec
    with _few_collections():
        events = executor.run(steady_shortcut, layer_shortcut)
    return rec, executor.memory.peak_bytes, events


@contextmanager
def _few_collections() -> Iterator[None]:
    """Run with the objects made so far out of the collector's sight and its youngest generation
    collected every 100,000 allocations rather than 700: the engine makes many short-lived
    objects and few cycles, and full collections over the long-lived ones were ~20% of a run's
    CPU time (issue 16). The thresholds are restored after, and the frozen objects released."""
    thresholds = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(100_000, 20, 20)
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)
        gc.unfreeze()


def simulate_resolved(cfg: RunConfig, on_iteration: Callable[[int, int], None] | None = None,
                      composed: Composed | None = None) -> RunResult:
    """Simulate ``cfg``, whose searched values are already chosen (:func:`offsim.api.resolve`;
    :func:`offsim.api.simulate` does both). A configuration that does not fit returns
    ``feasible=False`` with the tier, the need and the capacity in ``infeasible_reason``; it is
    never silently simulated.

    ``on_iteration(done, total)`` reports progress as iterations finish. ``composed``: ``cfg``
    already composed (and compiled) by :func:`compose_run`, whose fitted configuration is the one
    simulated and returned (the sweep's pre-filter hands over what it made for the time bound)."""
    t0 = time.perf_counter()
    point = (compose_run(cfg) if composed is None else composed).footprint()
    cfg, sz, system, fp = point.cfg, point.sz, point.system, point.fit
    assert fp is not None
    fp_dict = {"need": fp.need_bytes, "capacity": fp.capacity_bytes}
    try:
        raise_if_over(fp)
        schedule = point.compiled().schedule  # shared with an equal composition's in a sweep
        rec, peaks, events = run_schedule(cfg, sz, on_iteration, system=system, schedule=schedule)
    except InfeasibleError as exc:
        metrics = RunMetrics(feasible=False, infeasible_reason=str(exc), infeasible_tier=exc.tier)
        return RunResult(cfg, metrics, footprint_bytes=fp_dict, wall_time_s=time.perf_counter() - t0)
    metrics = summarize(cfg, rec, peaks)
    act = activation_policy(cfg, sz).name if custom_activations(cfg) else None
    metrics = metrics.model_copy(update={"cache": _cache_stats(rec, steady_iterations(cfg, rec)[0]),
                                         "activation_policy": act})
    return RunResult(cfg, metrics, rec, fp_dict, events, time.perf_counter() - t0)


def _cache_stats(rec: Recorder, steady: list[int]) -> dict[str, CacheStats]:
    """:func:`~offsim.cache_stats.cache_stats`, kept with the cache events until more are recorded
    (:meth:`~offsim.trace.RecordLog.derived`): a run the sweep's memo hands out again shares its
    events with the run that made them (and its cache descriptions are copies of that run's), so
    its statistics are worked out once for all of its points (issue 16)."""
    stats = rec.cache_events.derived(f"simulation._cache_stats {steady}", lambda _: cache_stats(rec, steady))
    assert isinstance(stats, dict)
    return dict(stats)
