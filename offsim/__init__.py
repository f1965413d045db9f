"""offsim: a discrete-event simulator of offloaded LLM training.

Typical use::

    from offsim import make_run_config, simulate
    result = simulate(make_run_config("rtx4090-pcie4-ws", "llama2-7b", "zero-offload"))
    print(result.metrics.iteration_time_s)
"""

from offsim.api import simulate
from offsim.config.loading import load_profile, load_strategy, load_workload
from offsim.config.run import RunConfig, make_run_config
from offsim.core._version import __version__
from offsim.results import RunResult

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
