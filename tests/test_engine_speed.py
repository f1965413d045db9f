"""What the executor's cost cuts (issue 16) must leave unchanged.

* :mod:`offsim.engine.soon`: the executor's own events take the same places in SimPy's queue as
  ``simpy.Timeout`` and ``simpy.Event.succeed`` (so every event runs in the same order);
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
from offsim.engine.soon import Soon, call_in
from offsim.trace import CacheEvent, LevelSample, Span

#: a script: per step, (at, how, delay): at whole time ``at`` make an event, by a timeout of ``delay``
#: ("timeout") or a pending event succeeded then ("succeed"), each logging its name when processed
_SCRIPT = hs.lists(hs.tuples(hs.integers(0, 3), hs.sampled_from(["timeout", "succeed"]), hs.integers(0, 2)),
                   min_size=1, max_size=15)


def _run(script: list[tuple[int, str, int]], own: bool) -> tuple[list[tuple[int, float]], int]:
    """The order events are processed in (name, time) and their count, with SimPy's events or the
    executor's own (``own``)."""
    env = simpy.Environment()
    log: list[tuple[int, float]] = []

    def make(i: int, how: str, delay: int) -> None:
        def note(_e: Any) -> None:
            log.append((i, env.now))
        if how == "timeout":
            if own:
                call_in(env, float(delay), note)
            else:
                env.timeout(float(delay)).callbacks.append(note)
        else:
            event = Soon(env) if own else env.event()
            event.callbacks.append(note)
            event.succeed()

    for i, (at, how, delay) in enumerate(script):
        env.timeout(float(at)).callbacks.append(lambda _e, i=i, how=how, delay=delay: make(i, how, delay))
    events = 0
    while True:
        try:
            env.step()
        except simpy.core.EmptySchedule:
            break
        events += 1
    return log, events


@settings(max_examples=200, deadline=None)
@given(script=_SCRIPT)
def test_own_events_run_in_simpys_order(script: list[tuple[int, str, int]]) -> None:
    assert _run(script, own=True) == _run(script, own=False)


def test_a_soon_event_succeeds_once_and_a_delay_is_not_negative() -> None:
    env = simpy.Environment()
    event = Soon(env)
    assert not event.triggered
    event.succeed()
    assert event.triggered and event.ok
    with pytest.raises(RuntimeError):
        event.succeed()
    with pytest.raises(ValueError, match="Negative delay"):
        call_in(env, -1.0, lambda _e: None)


#: users of a pool: (arrival, units, hold), whole time units so that many meet at one instant
_POOL_USERS = hs.lists(hs.tuples(hs.integers(0, 4), hs.integers(1, 3), hs.integers(0, 3)), min_size=1, max_size=12)


def _pool_script(make: Any, capacity: int, users: list[tuple[int, int, int]]) -> tuple[list[tuple[Any, ...]], int]:
    """Users take units of a pool made by ``make(env, capacity)``, hold them, give them back; the
    log of what happened, in order, and the events processed."""
    env = simpy.Environment()
    pool = make(env, capacity)
    log: list[tuple[Any, ...]] = []

    def arrive(i: int, units: int, hold: int) -> None:
        log.append(("asked", i, env.now))

        def granted(_e: Any) -> None:
            log.append(("granted", i, env.now))

            def back(_d: Any) -> None:
                pool.put(units).callbacks.append(lambda _p: log.append(("in", i, env.now)))
            env.timeout(hold).callbacks.append(back)
        pool.get(units).callbacks.append(granted)

    for i, (at, units, hold) in enumerate(users):
        fits = min(units, capacity)
        env.timeout(at).callbacks.append(lambda _e, i=i, u=fits, h=hold: arrive(i, u, h))
        env.timeout(at).callbacks.append(lambda _e, i=i: log.append(("tick", i, env.now)))
    events = 0
    while True:
        try:
            env.step()
        except simpy.core.EmptySchedule:
            break
        events += 1
    return log, events


@settings(max_examples=300, deadline=None)
@given(capacity=hs.integers(1, 4), users=_POOL_USERS)
def test_pool_grants_as_simpy_container_does(capacity: int, users: list[tuple[int, int, int]]) -> None:
    own = _pool_script(lambda env, c: Pool(env, c, c), capacity, users)
    assert own == _pool_script(lambda env, c: simpy.Container(env, capacity=c, init=c), capacity, users)
    assert any(x[0] == "granted" for x in own[0])


def test_pool_checks_amounts() -> None:
    pool = Pool(simpy.Environment(), 2, 2)
    with pytest.raises(ValueError, match="must be > 0"):
        pool.get(0)
    with pytest.raises(ValueError, match="init"):
        Pool(simpy.Environment(), 2, 3)


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
