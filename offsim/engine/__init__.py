"""The discrete-event engine (SimPy lives only in this package)."""

from offsim.engine.run import simulate

__all__ = ["simulate"]
