"""Input models (hardware profiles, workloads, strategies) and their loading.

The names below are imported on first use (PEP 562 ``__getattr__``; issue 16): importing any
``offsim.config.*`` module imports this package first, and an eager import of the loader here
(whose strategy model imports :mod:`offsim.policies`, whose modules import
:mod:`offsim.config.base`) tied ``offsim.config`` and ``offsim.policies`` in a package cycle that
only worked when ``offsim.config`` was entered first, and made every process pay for the input
models before it needed them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from offsim.core.lazy import lazy_names

if TYPE_CHECKING:
    from offsim.config.hardware import HardwareProfile
    from offsim.config.loading import load_profile, load_strategy, load_workload
    from offsim.config.strategy import Strategy
    from offsim.config.workload import Workload

#: public name -> the module it lives in
_HOMES = {
    "HardwareProfile": "offsim.config.hardware",
    "Strategy": "offsim.config.strategy",
    "Workload": "offsim.config.workload",
    "load_profile": "offsim.config.loading",
    "load_strategy": "offsim.config.loading",
    "load_workload": "offsim.config.loading",
}

__all__ = ["HardwareProfile", "Strategy", "Workload", "load_profile", "load_strategy", "load_workload"]


__getattr__, __dir__ = lazy_names("offsim.config", _HOMES, globals())
