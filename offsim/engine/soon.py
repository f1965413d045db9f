"""The engine's own clock: a heap of calls, in SimPy's order without SimPy's events (issue 16).

SimPy processes an event by popping ``(time_s, priority, eid, event)`` off ``env._queue`` and
calling each of ``event.callbacks`` with the event (``simpy/core.py::Environment.step``); it
schedules one by pushing that entry, ``eid`` from the environment's counter
(``Environment.schedule``), so that entries at the same time and priority are processed in the
order they were scheduled. Every event the executor made was of normal priority, each a
``Timeout`` or a pending event succeeded (``Event.succeed``), with its callbacks known by then.

:class:`Clock` keeps only that: an entry is ``(time_s, eid, call, arg)``, processed by
``call(arg)``; where the executor scheduled an event it schedules one entry, with the next
``eid``, at the same time. The order of every call, and the count of entries processed (the
events a run reports), are SimPy's; what is gone is the event object, its callback list and the
check of its value at each step (a SimPy step cost about 0.77 us, a clock step 0.33 us).
"""

from __future__ import annotations

from collections.abc import Callable
from heapq import heappop, heappush
from typing import Any

#: one scheduled call: (time_s, eid, call, arg)
Entry = tuple[float, int, Callable[[Any], None], Any]


class Clock:
    """Simulated time and the calls scheduled on it.

    Attributes:
        now_s: the current time (seconds).
        queue: the entries scheduled, a heap by (time_s, eid).
        eid: the entries scheduled so far (the next entry's ``eid``).
    """

    __slots__ = ("eid", "now_s", "queue")

    def __init__(self) -> None:
        self.now_s: float = 0  # an int, as SimPy's ``Environment(initial_time=0)``: records taken at 0 read ``0``
        self.queue: list[Entry] = []
        self.eid = 0

    def call_in(self, delay_s: float, call: Callable[[Any], None], arg: Any = None) -> None:
        """Call ``call(arg)`` ``delay_s`` seconds from now (``env.timeout(delay_s)`` with one callback)."""
        if delay_s < 0:
            raise ValueError(f"Negative delay {delay_s}")
        eid = self.eid
        self.eid = eid + 1
        heappush(self.queue, (self.now_s + delay_s, eid, call, arg))

    def call_now(self, call: Callable[[Any], None], arg: Any = None) -> None:
        """Call ``call(arg)`` now, after what is already scheduled for now (``event.succeed()``)."""
        eid = self.eid
        self.eid = eid + 1
        heappush(self.queue, (self.now_s, eid, call, arg))

    def step(self) -> None:
        """Process the next entry (IndexError when none is left)."""
        self.now_s, _, call, arg = heappop(self.queue)
        call(arg)

    def run(self) -> int:
        """Process every entry, those the calls schedule included; returns how many."""
        queue, n = self.queue, 0
        while queue:
            self.now_s, _, call, arg = heappop(queue)
            call(arg)
            n += 1
        return n
