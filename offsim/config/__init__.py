"""Input models (hardware profiles, workloads, strategies) and their loading."""

from offsim.config.hardware import HardwareProfile
from offsim.config.loading import load_profile, load_strategy, load_workload
from offsim.config.strategy import Strategy
from offsim.config.workload import Workload

__all__ = ["HardwareProfile", "Strategy", "Workload", "load_profile", "load_strategy", "load_workload"]
