"""The executor's slots (:class:`offsim.engine.slots.Slots`) grant in SimPy's order.

The executor's copy engines and out-of-order streams were ``simpy.Resource`` s; ``Slots`` keeps
only what the executor used of them (issue 16). Random scripts of requests and releases, some at
the same instant and beside unrelated events, must process the same events in the same order.
"""

from __future__ import annotations

from typing import Any

import simpy
from hypothesis import given, settings
from hypothesis import strategies as hs

from offsim.engine.slots import Slots

#: (arrival, hold) of each user, in whole time units so that many fall on the same instant
_USERS = hs.lists(hs.tuples(hs.integers(0, 4), hs.integers(0, 3)), min_size=1, max_size=12)


def _script(make: Any, capacity: int, users: list[tuple[int, int]]) -> tuple[list[tuple[Any, ...]], int]:
    """Run the users on a resource made by ``make(env, capacity)``; returns the log of what
    happened, in order, and the events processed."""
    env = simpy.Environment()
    res = make(env, capacity)
    log: list[tuple[Any, ...]] = []

    def arrive(i: int, hold: int) -> None:
        req = res.request()
        log.append(("asked", i, env.now))

        def granted(_e: simpy.Event) -> None:
            log.append(("granted", i, env.now))

            def done(_d: simpy.Event) -> None:
                res.release(req)
                log.append(("released", i, env.now))
            env.timeout(hold).callbacks.append(done)
        req.callbacks.append(granted)

    for i, (at, hold) in enumerate(users):
        env.timeout(at).callbacks.append(lambda _e, i=i, hold=hold: arrive(i, hold))
        env.timeout(at).callbacks.append(lambda _e, i=i: log.append(("tick", i, env.now)))  # an unrelated event
    events = 0
    while True:
        try:
            env.step()
        except simpy.core.EmptySchedule:
            break
        events += 1
    return log, events


@settings(max_examples=300, deadline=None)
@given(capacity=hs.integers(1, 3), users=_USERS)
def test_slots_grant_as_simpy_resource_does(capacity: int, users: list[tuple[int, int]]) -> None:
    assert _script(Slots, capacity, users) == _script(lambda env, c: simpy.Resource(env, capacity=c), capacity,
                                                      users)


def test_a_release_grants_the_next_when_its_event_is_processed() -> None:
    """One slot: the second user is granted at the instant the first releases, after what was
    already scheduled for that instant."""
    log, _ = _script(Slots, 1, [(0, 1), (0, 1)])
    assert log[:4] == [("asked", 0, 0), ("tick", 0, 0), ("asked", 1, 0), ("tick", 1, 0)]
    assert [x for x in log if x[0] != "tick"][2:] == [("granted", 0, 0), ("released", 0, 1), ("granted", 1, 1),
                                                      ("released", 1, 2)]
