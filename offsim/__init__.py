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

from typing import TYPE_CHECKING

from offsim.core._version import __version__
from offsim.core.lazy import lazy_names

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


__getattr__, __dir__ = lazy_names("offsim", _HOMES, globals())
