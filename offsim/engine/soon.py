"""The executor's own SimPy events: the same queue entries as ``simpy.Event``/``simpy.Timeout``,
made with fewer Python calls (issue 16).

SimPy schedules an event by pushing ``(time_s, priority, eid, event)`` on ``env._queue``
(``simpy/core.py::Environment.schedule``), ``eid`` from the environment's counter, so events at
the same time and priority are processed in the order they were scheduled. A ``simpy.Timeout``
costs its ``__init__`` (six attributes and a check) and a call of ``schedule``; ``succeed`` of a
``simpy.Event`` checks, sets two attributes and calls ``schedule``. :class:`Soon` is a
``simpy.Event`` (so everything that handles SimPy events handles it: the executor's loop, the
steady-state snapshot) whose entry is pushed directly, with the same time, priority and ``eid``
SimPy's call would give it: the queue, and so the order of every event, is the same.
"""

from __future__ import annotations

from collections.abc import Callable
from heapq import heappush
from typing import Any

import simpy
from simpy.events import NORMAL, PENDING


class Soon(simpy.Event):
    """A pending event (``callbacks`` empty, no value); :meth:`succeed` schedules it now."""

    _ok = True  # it only ever succeeds (``simpy.Event.succeed`` sets the same on the instance)

    def __init__(self, env: simpy.Environment) -> None:  # no super().__init__: the same three attributes
        self.env = env
        self.callbacks: list[Callable[[Any], None]] = []  # type: ignore[assignment]
        self._value = PENDING

    def succeed(self, value: Any = None) -> Soon:
        """Schedule the event now (``simpy.Event.succeed``: an event succeeds once)."""
        if self._value is not PENDING:
            raise RuntimeError(f"{self} has already been triggered")
        self._value = value
        env = self.env
        heappush(env._queue, (env._now, NORMAL, next(env._eid), self))
        return self


def call_in(env: simpy.Environment, delay_s: float, callback: Callable[[Any], None]) -> Soon:
    """``env.timeout(delay_s).callbacks.append(callback)``: the same queue entry, one call."""
    if delay_s < 0:
        raise ValueError(f"Negative delay {delay_s}")
    event = Soon.__new__(Soon)
    event.env = env
    event.callbacks = [callback]
    event._value = None
    heappush(env._queue, (env._now + delay_s, NORMAL, next(env._eid), event))
    return event
