"""offsim: a discrete-event simulator of offloaded LLM training.

Typical use::

    from offsim import make_run_config, simulate
    result = simulate(make_run_config("rtx4090-pcie4-ws", "llama2-7b", "zero-offload"))
    print(result.metrics.iteration_time_s)

The names below are imported on first use (PEP 562 ``__getattr__``): importing a submodule such as
``offsim.cli`` or ``offsim.core.enums`` imports the package first, and importing the whole API
there made every start-up pay for the engine and the input models (issue 16).
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from offsim.core._version import __version__

if TYPE_CHECKING:
    from offsim.api import simulate
    from offsim.config.loading import load_profile, load_strategy, load_workload
    from offsim.config.run import RunConfig, make_run_config
    from offsim.results import RunResult

#: public name -> the module it lives in
_HOMES = {
    "simulate": "offsim.api",
    "load_profile": "offsim.config.loading",
    "load_strategy": "offsim.config.loading",
    "load_workload": "offsim.config.loading",
    "RunConfig": "offsim.config.run",
    "make_run_config": "offsim.config.run",
    "RunResult": "offsim.results",
}

__all__ = [
    "RunConfig",
    "RunResult",
    "__version__",
    "load_profile",
    "load_strategy",
    "load_workload",
    "make_run_config",
    "simulate",
]


def __getattr__(name: str) -> Any:
    """A public name, imported from its module on first use (then kept in the package)."""
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'offsim' has no attribute {name!r}")
    value = getattr(import_module(home), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOMES})
