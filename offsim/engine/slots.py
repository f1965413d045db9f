"""Slots taken first come, first served: the executor's copy engines and out-of-order streams
(and :class:`Pool`: its pools of units).

:class:`Slots` keeps what the executor used of :class:`simpy.Resource` and nothing else (issue 16:
a SimPy request and release cost about 3 us of Python, most of it bookkeeping the executor never
reads), in SimPy's order, on the engine's :class:`~offsim.engine.soon.Clock`, so that the events
processed and their order do not change (a request's event is the call it names, scheduled when
it is granted):

* a request joins the queue, and the head of the queue is granted at once if a slot is free (its
  call is scheduled now);
* a release frees the slot at once and schedules an entry (SimPy's ``Release`` event) which, when
  it is processed, grants the head of the queue if a slot is free.

Each of the two grants at most the head: SimPy's ``Resource`` stops at the first request it
examines.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

from offsim.engine.soon import Clock

#: who waits: the call to schedule when granted, and its argument
Waiter = tuple[Callable[[Any], None], Any]


class Slots:
    """``capacity`` slots of ``clock``; ``used`` are held and ``waiting`` requests queue for one."""

    __slots__ = ("capacity", "clock", "used", "waiting")

    def __init__(self, clock: Clock, capacity: int) -> None:
        if capacity <= 0:
            raise ValueError('"capacity" must be > 0.')
        self.clock, self.capacity, self.used = clock, capacity, 0
        self.waiting: deque[Waiter] = deque()

    def request(self, call: Callable[[Any], None], arg: Any = None) -> None:
        """Queue for a slot; ``call(arg)`` is scheduled when it is granted."""
        self.waiting.append((call, arg))
        if self.used < self.capacity:  # :meth:`grant`, inlined
            self.used += 1
            call, arg = self.waiting.popleft()
            self.clock.call_now(call, arg)

    def release(self) -> None:
        """Give back a slot; the next request is granted when the release's entry is processed."""
        self.used -= 1
        self.clock.call_now(self.grant)

    def grant(self, _arg: Any = None) -> None:
        """Grant the head of the queue if a slot is free."""
        if self.waiting and self.used < self.capacity:
            self.used += 1
            call, arg = self.waiting.popleft()
            self.clock.call_now(call, arg)


class Ask:
    """A get or a put waiting in a :class:`Pool`: its amount, and what to call once it is in."""

    __slots__ = ("amount", "arg", "call")

    def __init__(self, amount: float, call: Callable[[Any], None] | None, arg: Any) -> None:
        self.amount, self.call, self.arg = amount, call, arg


class Pool:
    """Units of a pool taken and given back first come, first served: what the executor used of
    ``simpy.Container`` (``simpy/resources/container.py`` and ``base.py``: ``Get``/``Put``,
    ``_trigger_get``/``_trigger_put``, ``_do_get``/``_do_put``), with the same events in the same
    order and without the rest of its machinery (issue 16).

    A get (a put) joins its queue, and the queue is served at once: from its head, each that
    fits is granted (its entry scheduled now) until one does not. A get's entry, when processed,
    serves the puts waiting, then calls what the get named; a put's serves the gets waiting.
    """

    __slots__ = ("capacity", "clock", "gets", "level", "puts")

    def __init__(self, clock: Clock, capacity: float, init: float) -> None:
        if capacity <= 0:
            raise ValueError('"capacity" must be > 0.')
        if not 0 <= init <= capacity:
            raise ValueError('"init" must be >= 0 and <= "capacity".')
        self.clock, self.capacity, self.level = clock, capacity, init
        self.gets: deque[Ask] = deque()
        self.puts: deque[Ask] = deque()

    def get(self, amount: float, call: Callable[[Any], None] | None = None, arg: Any = None) -> None:
        """Ask for ``amount`` units; ``call(arg)`` once they are taken."""
        self.gets.append(self._ask(amount, call, arg))
        self.serve_gets()

    def put(self, amount: float, call: Callable[[Any], None] | None = None, arg: Any = None) -> None:
        """Give back ``amount`` units; ``call(arg)`` once they are in."""
        self.puts.append(self._ask(amount, call, arg))
        self.serve_puts()

    @staticmethod
    def _ask(amount: float, call: Callable[[Any], None] | None, arg: Any) -> Ask:
        if amount <= 0:
            raise ValueError(f"amount(={amount}) must be > 0.")
        return Ask(amount, call, arg)

    def serve_gets(self, _arg: Any = None) -> None:
        """Grant the gets waiting, from the head, while they fit."""
        gets = self.gets
        while gets and self.level >= gets[0].amount:
            ask = gets.popleft()
            self.level -= ask.amount
            self.clock.call_now(self._got, ask)

    def serve_puts(self, _arg: Any = None) -> None:
        """Take the puts waiting, from the head, while they fit."""
        puts = self.puts
        while puts and self.capacity - self.level >= puts[0].amount:
            ask = puts.popleft()
            self.level += ask.amount
            self.clock.call_now(self._put_in, ask)

    def _got(self, ask: Ask) -> None:
        """A get's entry: the puts waiting are served, then the get's call."""
        self.serve_puts()
        if ask.call is not None:
            ask.call(ask.arg)

    def _put_in(self, ask: Ask) -> None:
        """A put's entry: the gets waiting are served, then the put's call."""
        self.serve_gets()
        if ask.call is not None:
            ask.call(ask.arg)
