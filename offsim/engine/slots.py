"""Slots taken first come, first served: the executor's copy engines and out-of-order streams.

:class:`Slots` keeps what the executor used of :class:`simpy.Resource` and nothing else (issue 16:
a SimPy request and release cost about 3 us of Python, most of it bookkeeping the executor never
reads), in SimPy's order, so that the events processed and their order do not change:

* a request joins the queue, and the head of the queue is granted at once if a slot is free (its
  event is scheduled now);
* a release frees the slot at once and schedules an event (SimPy's ``Release``) which, when it is
  processed, grants the head of the queue if a slot is free.

Each of the two grants at most the head: SimPy's ``Resource`` stops at the first request it
examines.
"""

from __future__ import annotations

from collections import deque

import simpy

from offsim.engine.soon import Soon, call_in


class Slots:
    """``capacity`` slots of ``env``; ``used`` are held and ``waiting`` requests queue for one."""

    __slots__ = ("capacity", "env", "used", "waiting")

    def __init__(self, env: simpy.Environment, capacity: int) -> None:
        if capacity <= 0:
            raise ValueError('"capacity" must be > 0.')
        self.env, self.capacity, self.used = env, capacity, 0
        self.waiting: deque[simpy.Event] = deque()

    def request(self) -> simpy.Event:
        """Queue for a slot; the event succeeds when it is granted."""
        event = Soon(self.env)
        self.waiting.append(event)
        self.grant()
        return event

    def release(self, request: simpy.Event) -> None:
        """Give back the slot ``request`` holds; the next request is granted when the release's
        event is processed."""
        self.used -= 1
        call_in(self.env, 0.0, self.grant)

    def grant(self, _event: simpy.Event | None = None) -> None:
        """Grant the head of the queue if a slot is free."""
        if self.waiting and self.used < self.capacity:
            self.used += 1
            self.waiting.popleft().succeed()
