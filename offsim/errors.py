"""Re-export of :mod:`offsim.core.errors` (where the exceptions live)."""

from offsim.core.errors import ConfigError, InfeasibleError, OffsimError, PolicyError, ScheduleError

__all__ = ["ConfigError", "InfeasibleError", "OffsimError", "PolicyError", "ScheduleError"]
