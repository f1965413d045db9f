"""Slots taken first come, first served: the executor's copy engines and out-of-order streams
(and :class:`Pool`: its pools of units).

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
from collections.abc import Callable
from typing import Any

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


class Pool:
    """Units of a pool taken and given back first come, first served: what the executor used of
    ``simpy.Container`` (``simpy/resources/container.py`` and ``base.py``: ``Get``/``Put``,
    ``_trigger_get``/``_trigger_put``, ``_do_get``/``_do_put``), with the same events in the same
    order and without the rest of its machinery (issue 16).

    A get (a put) joins its queue, and the queue is served at once: from its head, each that
    fits is granted (its event scheduled now) until one does not. A get's event, when processed,
    serves the puts waiting; a put's event serves the gets waiting.
    """

    __slots__ = ("capacity", "env", "gets", "level", "puts")

    def __init__(self, env: simpy.Environment, capacity: float, init: float) -> None:
        if capacity <= 0:
            raise ValueError('"capacity" must be > 0.')
        if not 0 <= init <= capacity:
            raise ValueError('"init" must be >= 0 and <= "capacity".')
        self.env, self.capacity, self.level = env, capacity, init
        self.gets: deque[Soon] = deque()
        self.puts: deque[Soon] = deque()

    def get(self, amount: float) -> Soon:
        """Ask for ``amount`` units; the event succeeds when they are taken."""
        event = self._event(amount, self.serve_puts)
        self.gets.append(event)
        self.serve_gets()
        return event

    def put(self, amount: float) -> Soon:
        """Give back ``amount`` units; the event succeeds when they are in."""
        event = self._event(amount, self.serve_gets)
        self.puts.append(event)
        self.serve_puts()
        return event

    def _event(self, amount: float, then: Callable[[Any], None]) -> Soon:
        if amount <= 0:
            raise ValueError(f"amount(={amount}) must be > 0.")
        event = Soon(self.env)
        event.amount = amount  # type: ignore[attr-defined]  # as SimPy's ContainerGet/ContainerPut hold it
        event.callbacks.append(then)
        return event

    def serve_gets(self, _event: Any = None) -> None:
        """Grant the gets waiting, from the head, while they fit."""
        gets = self.gets
        while gets and self.level >= gets[0].amount:  # type: ignore[attr-defined]
            event = gets.popleft()
            self.level -= event.amount  # type: ignore[attr-defined]
            event.succeed()

    def serve_puts(self, _event: Any = None) -> None:
        """Take the puts waiting, from the head, while they fit."""
        puts = self.puts
        while puts and self.capacity - self.level >= puts[0].amount:  # type: ignore[attr-defined]
            event = puts.popleft()
            self.level += event.amount  # type: ignore[attr-defined]
            event.succeed()
