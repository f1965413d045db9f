"""The public entry points: resolve a configuration's searched values, then simulate it.

Some strategy values are chosen by a search that itself runs the simulator (Fuyou's activation
swap amount, :mod:`offsim.search.swap_amount`). The search sits above planning and the engine;
:func:`resolve` fills its choices into the configuration, after which every planner (footprint,
time bound, schedule) reads them as plain values.
"""

from __future__ import annotations

from collections.abc import Callable

from offsim.config.run import RunConfig
from offsim.policies.auto_swap import AutoSwapConfig
from offsim.results import RunResult
from offsim.simulation import simulate_resolved


def resolve(cfg: RunConfig) -> RunConfig:
    """``cfg`` with every searched value chosen (today: an ``auto-swap`` activation amount).

    The search is imported here, and only for a configuration it has to resolve (issue 16: it
    and the schedule bound it reads cost ~9 ms of a run's start-up that never searches)."""
    act = cfg.strategy.policies.activations
    if not isinstance(act, AutoSwapConfig) or act.chosen is not None:
        return cfg  # what resolve_auto_swap returns unchanged
    from offsim.search.swap_amount import resolve_auto_swap

    return resolve_auto_swap(cfg)


def simulate(cfg: RunConfig, on_iteration: Callable[[int, int], None] | None = None) -> RunResult:
    """Resolve ``cfg`` and simulate it; ``result.config`` is the resolved configuration.

    A configuration that does not fit returns ``feasible=False`` with the tier, the need and the
    capacity in ``infeasible_reason``. ``on_iteration(done, total)`` reports progress."""
    return simulate_resolved(resolve(cfg), on_iteration)
