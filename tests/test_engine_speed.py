"""What the executor's cost cuts (issue 16) must leave unchanged.

* :mod:`offsim.engine.soon`: the engine's clock calls what it is given in the order SimPy
  processes ``simpy.Timeout`` and ``simpy.Event.succeed`` (so every event runs in the same order),
  and processes as many entries as SimPy processes events;
* :class:`offsim.engine.slots.Pool` grants as ``simpy.Container`` does, with the same events;
* the records' hand-written ``__init__`` (:mod:`offsim.trace`) builds what the dataclass's would;
* the renamed ``belady_fetched_bytes`` (it was ``opt_bytes``), by hand.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import simpy
from hypothesis import given, settings
from hypothesis import strategies as hs

from offsim.engine.cache import belady_fetched_bytes
from offsim.engine.slots import Pool
from offsim.engine.soon import Clock
from offsim.trace import CacheEvent, LevelSample, Span

#: a script: per step, (at, how, delay): at whole time ``at`` make an event, by a timeout of ``delay``
#: ("timeout") or a pending event succeeded then ("succeed"), each logging its name when processed
_SCRIPT = hs.lists(hs.tuples(hs.integers(0, 3), hs.sampled_from(["timeout", "succeed"]), hs.integers(0, 2)),
                   min_size=1, max_size=15)


def _simpy_run(env: simpy.Environment) -> int:
    """Process every event of ``env``; returns how many."""
    events = 0
    while True:
        try:
            env.step()
        except simpy.core.EmptySchedule:
            return events
        events += 1


def _run_simpy(script: list[tuple[int, str, int]]) -> tuple[list[tuple[int, float]], int]:
    """The order SimPy processes the script's events in (name, time), and their count."""
    env = simpy.Environment()
    log: list[tuple[int, float]] = []

    def make(i: int, how: str, delay: int) -> None:
        def note(_e: Any) -> None:
            log.append((i, env.now))
        event = env.timeout(float(delay)) if how == "timeout" else env.event()
        event.callbacks.append(note)
        if how != "timeout":
            event.succeed()

    for i, (at, how, delay) in enumerate(script):
        env.timeout(float(at)).callbacks.append(lambda _e, i=i, how=how, delay=delay: make(i, how, delay))
    return log, _simpy_run(env)


def _run_clock(script: list[tuple[int, str, int]]) -> tuple[list[tuple[int, float]], int]:
    """The same script on the engine's clock: a timeout is ``call_in``, a succeed ``call_now``."""
    clock = Clock()
    log: list[tuple[int, float]] = []

    def make(i: int, how: str, delay: int) -> None:
        def note(_a: Any) -> None:
            log.append((i, clock.now_s))
        if how == "timeout":
            clock.call_in(float(delay), note)
        else:
            clock.call_now(note)

    for i, (at, how, delay) in enumerate(script):
        clock.call_in(float(at), lambda _a, i=i, how=how, delay=delay: make(i, how, delay))
    return log, clock.run()


@settings(max_examples=200, deadline=None)
@given(script=_SCRIPT)
def test_the_clock_calls_in_simpys_order(script: list[tuple[int, str, int]]) -> None:
    assert _run_clock(script) == _run_simpy(script)


def test_a_clock_passes_the_argument_refuses_a_negative_delay_and_starts_at_0() -> None:
    """Entries at one time run in the order scheduled, each with its argument; ``step`` runs one."""
    clock, log = Clock(), []
    assert clock.now_s == 0 and isinstance(clock.now_s, int)  # as SimPy's initial time: records read 0
    clock.call_in(2.0, log.append, "b")
    clock.call_in(1.0, log.append, "a")
    clock.call_now(log.append, "now")
    clock.step()
    assert log == ["now"] and clock.now_s == 0
    assert clock.run() == 2 and log == ["now", "a", "b"] and clock.now_s == 2.0
    with pytest.raises(ValueError, match="Negative delay"):
        clock.call_in(-1.0, log.append)


#: users of a pool: (arrival, units, hold), whole time units so that many meet at one instant
_POOL_USERS = hs.lists(hs.tuples(hs.integers(0, 4), hs.integers(1, 3), hs.integers(0, 3)), min_size=1, max_size=12)


class _SimPyPool:
    """A ``simpy.Container`` on SimPy's clock, driven through the calls the script makes."""

    def __init__(self, capacity: int) -> None:
        self.env = simpy.Environment()
        self.pool = simpy.Container(self.env, capacity=capacity, init=capacity)

    def now(self) -> float:
        return float(self.env.now)

    def after(self, delay: int, call: Any) -> None:
        self.env.timeout(delay).callbacks.append(lambda _e: call())

    def get(self, units: int, call: Any) -> None:
        self.pool.get(units).callbacks.append(lambda _e: call())

    def put(self, units: int, call: Any) -> None:
        self.pool.put(units).callbacks.append(lambda _e: call())

    def run(self) -> int:
        return _simpy_run(self.env)


class _ClockPool:
    """The engine's :class:`Pool` on its :class:`Clock`, driven through the same calls."""

    def __init__(self, capacity: int) -> None:
        self.clock = Clock()
        self.pool = Pool(self.clock, capacity, capacity)

    def now(self) -> float:
        return float(self.clock.now_s)

    def after(self, delay: int, call: Any) -> None:
        self.clock.call_in(delay, lambda _a: call())

    def get(self, units: int, call: Any) -> None:
        self.pool.get(units, lambda _a: call())

    def put(self, units: int, call: Any) -> None:
        self.pool.put(units, lambda _a: call())

    def run(self) -> int:
        return self.clock.run()


def _pool_script(side: Any, capacity: int, users: list[tuple[int, int, int]]) -> tuple[list[tuple[Any, ...]], int]:
    """Users take units of the pool of ``side`` (:class:`_SimPyPool` or :class:`_ClockPool`), hold
    them, give them back; the log of what happened, in order, and the events processed."""
    log: list[tuple[Any, ...]] = []

    def arrive(i: int, units: int, hold: int) -> None:
        log.append(("asked", i, side.now()))

        def granted() -> None:
            log.append(("granted", i, side.now()))
            side.after(hold, lambda: side.put(units, lambda: log.append(("in", i, side.now()))))
        side.get(units, granted)

    for i, (at, units, hold) in enumerate(users):
        fits = min(units, capacity)
        side.after(at, lambda i=i, u=fits, h=hold: arrive(i, u, h))
        side.after(at, lambda i=i: log.append(("tick", i, side.now())))
    return log, side.run()


@settings(max_examples=300, deadline=None)
@given(capacity=hs.integers(1, 4), users=_POOL_USERS)
def test_pool_grants_as_simpy_container_does(capacity: int, users: list[tuple[int, int, int]]) -> None:
    own = _pool_script(_ClockPool(capacity), capacity, users)
    assert own == _pool_script(_SimPyPool(capacity), capacity, users)
    assert any(x[0] == "granted" for x in own[0])


def test_pool_checks_amounts() -> None:
    pool = Pool(Clock(), 2, 2)
    with pytest.raises(ValueError, match="must be > 0"):
        pool.get(0)
    with pytest.raises(ValueError, match="init"):
        Pool(Clock(), 2, 3)


@pytest.mark.parametrize("cls, args", [
    (Span, (1, "forward", "h2d", "param_fetch", "block3 params", 3, 0.5, 1.25, 4096.0)),
    (Span, (0, "backward", "gpu", "compute", "block0", 0, 0.0, 2.0)),
    (LevelSample, (1.5, "gpu", 1024.0)),
    (CacheEvent, (2, "gpu_params", "miss", 7, 512.0, 0.0)),
    (CacheEvent, (2, "gpu_params", "stall", -1)),
])
def test_records_init_as_the_dataclass_does(cls: type, args: tuple[Any, ...]) -> None:
    """Each field set from its argument (positional, keyword, default), frozen as before."""
    names = [f.name for f in dataclasses.fields(cls)]
    record = cls(*args)
    defaults = {f.name: f.default for f in dataclasses.fields(cls) if f.default is not dataclasses.MISSING}
    assert dataclasses.asdict(record) == {**defaults, **dict(zip(names, args, strict=False))}
    assert cls(**dict(zip(names, args, strict=False))) == record
    assert hash(cls(*args)) == hash(record)
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(record, names[0], 99)


def test_belady_fetched_bytes_by_hand() -> None:
    """Room for two tensors of 1 byte; accesses 0 1 0 2 0 1. Misses fetch 0 and 1; 0 hits; 2
    misses and evicts the tensor used furthest ahead (1, next at position 5, against 0 at 4); 0
    hits; 1 misses again (evicting 2, never used again)."""
    assert belady_fetched_bytes([0, 1, 0, 2, 0, 1], {0: 1.0, 1: 1.0, 2: 1.0}, 2.0) == [1.0, 1.0, 0.0, 1.0, 0.0, 1.0]
