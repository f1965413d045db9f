"""The executor's slots (:class:`offsim.engine.slots.Slots`) grant in SimPy's order.

The executor's copy engines and out-of-order streams were ``simpy.Resource`` s; ``Slots`` keeps
only what the executor used of them (issue 16), on the engine's clock. Random scripts of requests and releases, some at
the same instant and beside unrelated events, must process the same events in the same order.
"""

from __future__ import annotations

from typing import Any

import simpy
from hypothesis import given, settings
from hypothesis import strategies as hs

from offsim.engine.slots import Slots
from offsim.engine.soon import Clock

#: (arrival, hold) of each user, in whole time units so that many fall on the same instant
_USERS = hs.lists(hs.tuples(hs.integers(0, 4), hs.integers(0, 3)), min_size=1, max_size=12)


def _script(own: bool, capacity: int, users: list[tuple[int, int]]) -> tuple[list[tuple[Any, ...]], int]:
    """Run the users on :class:`Slots` on the engine's clock (``own``) or on a ``simpy.Resource``;
    returns the log of what happened, in order, and the events processed."""
    env, clock = simpy.Environment(), Clock()
    log: list[tuple[Any, ...]] = []

    def now() -> float:
        return float(clock.now_s if own else env.now)

    def after(delay: int, call: Any) -> None:
        if own:
            clock.call_in(delay, lambda _a: call())
        else:
            env.timeout(delay).callbacks.append(lambda _e: call())

    def arrive(i: int, hold: int) -> None:
        log.append(("asked", i, now()))

        def granted() -> None:
            log.append(("granted", i, now()))

            def done() -> None:
                if own:
                    slots.release()
                else:
                    res.release(req)
                log.append(("released", i, now()))
            after(hold, done)
        if own:
            slots.request(lambda _a: granted())
        else:
            req = res.request()
            req.callbacks.append(lambda _e: granted())

    slots, res = Slots(clock, capacity), simpy.Resource(env, capacity=capacity)
    for i, (at, hold) in enumerate(users):
        after(at, lambda i=i, hold=hold: arrive(i, hold))
        after(at, lambda i=i: log.append(("tick", i, now())))  # an unrelated event
    if own:
        return log, clock.run()
    events = 0
    while True:
        try:
            env.step()
        except simpy.core.EmptySchedule:
            return log, events
        events += 1


@settings(max_examples=300, deadline=None)
@given(capacity=hs.integers(1, 3), users=_USERS)
def test_slots_grant_as_simpy_resource_does(capacity: int, users: list[tuple[int, int]]) -> None:
    assert _script(True, capacity, users) == _script(False, capacity, users)


def test_a_release_grants_the_next_when_its_event_is_processed() -> None:
    """One slot: the second user is granted at the instant the first releases, after what was
    already scheduled for that instant."""
    log, _ = _script(True, 1, [(0, 1), (0, 1)])
    assert log[:4] == [("asked", 0, 0), ("tick", 0, 0), ("asked", 1, 0), ("tick", 1, 0)]
    assert [x for x in log if x[0] != "tick"][2:] == [("granted", 0, 0), ("released", 0, 1), ("granted", 1, 1),
                                                      ("released", 1, 2)]
