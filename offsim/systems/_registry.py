"""Which system a strategy names, and its schedule.

A system is a module of this package whose name does not start with ``_``: ``system: twin-flow``
in a strategy file is ``offsim/systems/twin_flow.py``. It defines

* ``compose(cfg, sz=None) -> System``: its mechanisms along its order (from
  :mod:`offsim.systems._parts`, plus what is its own);
* ``OPTIONS``: the strategy fields of :data:`~offsim.config.strategy.SYSTEM_OPTIONS` it accepts
  (the mechanism variants it has); a strategy that sets another is refused by :func:`check_options`;
* optionally ``Options``: a pydantic model of the knobs of the mechanisms only it adds, set in a
  strategy under ``system_options:`` and read with :func:`offsim.systems._options.read_options`;
* optionally ``choice_policies(cfg, sz) -> dict[ChoiceId, ChoicePolicy]``: the run-time
  policies of the choices its schedule names.

Adding a system is adding its file (with its strategy YAML and its test); nothing here changes.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from offsim.config.run import RunConfig, fit_window
from offsim.config.strategy import SYSTEM_OPTIONS, Strategy, known_systems, option_is_set
from offsim.core.enums import ChoiceId
from offsim.core.window import MeasureWindow
from offsim.engine.hooks import ChoicePolicy
from offsim.errors import ConfigError
from offsim.plan.footprint import StateSizes
from offsim.schedule.ops import Schedule
from offsim.systems._compile import System, compile_system
from offsim.systems._options import check_system_options
from offsim.systems._part_grads import with_gradient_hooks


def system_module(name: str) -> ModuleType:
    """The module of system ``name`` (``zero-offload`` -> :mod:`offsim.systems.zero_offload`)."""
    if name not in known_systems():
        raise ConfigError(f"system '{name}' is not known; known systems: {', '.join(known_systems())}")
    return importlib.import_module(f"offsim.systems.{name.replace('-', '_')}")


def options(name: str) -> frozenset[str]:
    """The system options system ``name`` accepts."""
    return frozenset(system_module(name).OPTIONS)


def check_options(st: Strategy) -> None:
    """Refuse a strategy that sets a system option its system does not have (a mechanism
    variant of another published system), naming the field and the systems that have it, or
    ``system_options`` its system's ``Options`` does not accept."""
    check_system_options(st, system_module(st.system))
    own = options(st.system)
    for field in SYSTEM_OPTIONS:
        if field not in own and option_is_set(st, field):
            owners = [name for name in known_systems() if field in options(name)]
            raise ConfigError(f"strategy '{st.name}': {field} = {getattr(st, field)!r} is a mechanism of system "
                              f"{' / '.join(owners)}, not of system '{st.system}'; name one of those systems "
                              f"with `system:`, or leave {field} at its default")


def compose(cfg: RunConfig, sz: StateSizes | None = None) -> System:
    """The composition of the system ``cfg``'s strategy names (``sz``: sizes other than the
    configuration's, for hand-built layers in tests), after :func:`check_options`."""
    check_options(cfg.strategy)
    system: System = system_module(cfg.strategy.system).compose(cfg, sz)
    return with_gradient_hooks(system)


def measure_window(system: System) -> MeasureWindow:
    """The iterations ``system``'s steady metrics may average over: every mechanism's
    ``measure_window()`` (those whose work crosses iteration boundaries) merged."""
    window = MeasureWindow()
    for mechanism in system.mechanisms.values():
        declared = getattr(mechanism, "measure_window", None)
        if declared is not None:
            window = window.merged(declared())
    return window


#: per (system, strategy name), the measurement window its composition declared last
_WINDOWS: dict[tuple[str, str], MeasureWindow] = {}
#: strategies whose windows :data:`_WINDOWS` keeps (a sweep names a few)
WINDOWS_KEPT = 64


def compose_measured(cfg: RunConfig, sz: StateSizes | None = None) -> tuple[RunConfig, System]:
    """``cfg`` fitted to its system's measurement window (:func:`offsim.config.run.fit_window`:
    iterations raised, with a note, where the system needs more), and the system composed for it.

    Composed once where the strategy's window is known from an earlier call (a sweep's points,
    issue 16): ``cfg`` is fitted to that window first and composed, and the fit stands when the
    composition declares the same window. A window depends on the strategy's knobs (the delayed
    parameter update, ZenFlow's update interval), not on the iteration counts the fit sets, so
    the composition for ``cfg`` would have declared it too. Otherwise (no window known, or
    another one declared) ``cfg`` is composed, fitted, and composed again if the fit changed it."""
    name = (cfg.strategy.system, cfg.strategy.name)
    known = _WINDOWS.get(name)
    if known is not None:
        fitted = fit_window(cfg, known)
        system = compose(fitted, sz)
        if measure_window(system) == known:
            return fitted, system
    return _compose_fitted(cfg, sz, name)


def _compose_fitted(cfg: RunConfig, sz: StateSizes | None, name: tuple[str, str]) -> tuple[RunConfig, System]:
    """:func:`compose_measured` without a known window: compose, fit, compose again if fitted;
    the window is kept for the strategy's next call."""
    system = compose(cfg, sz)
    window = measure_window(system)
    if len(_WINDOWS) >= WINDOWS_KEPT:
        _WINDOWS.clear()
    _WINDOWS[name] = window
    fitted = fit_window(cfg, window)
    return (cfg, system) if fitted is cfg else (fitted, compose(fitted, sz))


def compile_strategy(cfg: RunConfig, sz: StateSizes | None = None) -> Schedule:
    """The schedule of ``cfg`` under the system its strategy names (``cfg`` as given: callers
    that measure a run fit it first with :func:`compose_measured`)."""
    return compile_system(compose(cfg, sz))


def choice_policies(cfg: RunConfig, sz: StateSizes) -> dict[ChoiceId, ChoicePolicy]:
    """The run-time policies of the system's choices (none for most systems)."""
    build = getattr(system_module(cfg.strategy.system), "choice_policies", None)
    return {} if build is None else dict(build(cfg, sz))
