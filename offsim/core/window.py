"""Which iterations a run's steady metrics may average over, when a system's work crosses
iteration boundaries. A mechanism whose work does declares it (``measure_window()``); the run is
fitted to it when the system is composed (:func:`offsim.config.run.fit_window`)."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class MeasureWindow:
    """Which iterations a system's steady metrics may average over, when its work crosses
    iteration boundaries (a mechanism's ``measure_window()``; most have none).

    Attributes:
        lead: iterations to leave out first, at least (DPU: the first step has no earlier one to
            overlap; ZenFlow: the first window has no CPU step running beside it).
        tail: trailing iterations left out (DPU: the last step has no next iteration to overlap).
        period: the measured iterations are whole multiples of it (ZenFlow: the update interval,
            a window's steps differ).
        why: the reason, said in the run's notes when the requested iterations are raised.
    """

    lead: int = 0
    tail: int = 0
    period: int = 1
    why: str = ""

    def merged(self, other: MeasureWindow) -> MeasureWindow:
        """The window satisfying both."""
        why = "; ".join(w for w in (self.why, other.why) if w)
        return MeasureWindow(max(self.lead, other.lead), max(self.tail, other.tail),
                             math.lcm(self.period, other.period), why)
