"""The discrete-event engine, on its own clock (:mod:`offsim.engine.soon`: SimPy's event order
without SimPy): it executes a compiled :class:`~offsim.schedule.ops.Schedule` on a
:class:`~offsim.engine.execute.Machine` and reads no strategy, workload or hardware configuration
(:func:`offsim.simulation.simulate` joins them)."""

from offsim.engine.execute import Executor, Machine

__all__ = ["Executor", "Machine"]
