"""Bandwidth sharing: every transfer is a flow over a set of shared resources.

Rates are max-min fair (progressive filling, Bertsekas & Gallager, *Data Networks*, Sec. 6.5.2)
and are recomputed whenever a flow starts or ends (by :func:`fair_rates`: the rates of the general
:func:`max_min_rates`, with shortcuts for the few flows the engine has at once); a flow never runs
faster than its own cap (the single-transfer rate of its size, which carries the per-transfer
latency).

A flow's size is in bytes. Each resource has a capacity, and a flow uses ``coef`` units of a
resource per byte/s of its rate. For a link the coefficient is 1 (bytes/s); for DRAM it is the
DRAM bytes the flow touches per byte moved (a pageable copy stages through DRAM); for an NVMe
array the capacity is 1 (the array's time) and a byte costs ``1/read_rate`` or ``1/write_rate``,
so mixed reads and writes share the drives; for the CPU optimizer a byte of DRAM traffic costs
``1/bytes_per_param`` of a parameter update.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any

from offsim.engine.soon import Clock

_EPS = 1e-12
_FLOW_KEY = attrgetter("key")
#: flow sets whose rates the network keeps (it forgets them all beyond this)
_RATE_MEMO = 65_536


@dataclass(eq=False, slots=True)
class Flow:
    """One transfer (or bandwidth-bound piece of work) in progress; ``done(arg)`` is scheduled
    when its last byte has moved (None: nothing)."""

    name: str
    size_bytes: float
    usage: dict[str, float]
    cap_bytes_per_s: float
    done: Callable[[Any], None] | None
    start_s: float
    meta: dict[str, Any] = field(default_factory=dict)
    arg: Any = None
    remaining_bytes: float = 0.0
    rate_bytes_per_s: float = 0.0
    key: int = -1  # names its usage and cap in the network's memo of rates (-1: not yet)
    #: it has finished when no more than this is left (rounding): ``max(1e-6, 1e-12 * size_bytes)``
    finished_below_bytes: float = 1e-6


def max_min_rates(
    flows: list[Flow], capacity: dict[str, float]
) -> dict[Flow, float]:
    """Max-min fair rates by progressive filling with per-flow caps and usage coefficients.

    All unfrozen flows rise together; a flow freezes when it reaches its cap or when a
    resource it uses saturates. Pure function: used by the network and by tests.
    """
    rates: dict[Flow, float] = {}
    used = dict.fromkeys(capacity, 0.0)
    active = list(flows)
    while active:
        level = min(f.cap_bytes_per_s for f in active)
        for res, cap in capacity.items():
            coef = sum(f.usage.get(res, 0.0) for f in active)
            if coef > 0:
                level = min(level, max(0.0, cap - used[res]) / coef)
        full = {
            res for res, cap in capacity.items()
            if sum(f.usage.get(res, 0.0) for f in active) > 0
            and used[res] + level * sum(f.usage.get(res, 0.0) for f in active) >= cap * (1 - 1e-9)
        }
        frozen = [
            f for f in active
            if f.cap_bytes_per_s <= level * (1 + 1e-9) or any(r in full for r in f.usage if f.usage[r] > 0)
        ]
        for f in frozen:
            rates[f] = level
            for res, coef in f.usage.items():
                used[res] = used.get(res, 0.0) + coef * level
        active = [f for f in active if f not in rates]
    return rates


def fair_rates(flows: list[Flow], capacity: dict[str, float]) -> dict[Flow, float]:
    """The rates of :func:`max_min_rates`, bit for bit, at a fraction of its cost (issue 16).

    The flow network calls this on every flow start and end, mostly with 0 to 3 flows on 6
    resources, so its cost is fixed per call rather than asymptotic. Two shortcuts, each the same
    arithmetic as the general algorithm: one flow takes the least of its cap and each resource's
    capacity over its coefficient (one round of progressive filling, which always freezes it);
    several flows fill only the resources they use (an unused resource adds ``0.0`` to every sum,
    which changes no float, and can neither bound the level nor saturate).
    """
    if len(flows) == 1:
        f = flows[0]
        level = f.cap_bytes_per_s
        for res, coef in f.usage.items():
            if coef > 0:
                level = min(level, max(0.0, capacity[res]) / coef)
        return {f: level}
    rates: dict[Flow, float] = {}
    used: dict[str, float] = {}
    active = list(flows)
    while active:
        coefs: dict[str, float] = {}
        for f in active:  # sums over the active flows in order, as max_min_rates adds them
            for res, coef in f.usage.items():
                coefs[res] = coefs.get(res, 0.0) + coef
        level = min(f.cap_bytes_per_s for f in active)
        for res, coef in coefs.items():
            if coef > 0:
                level = min(level, max(0.0, capacity[res] - used.get(res, 0.0)) / coef)
        full = {res for res, coef in coefs.items()
                if coef > 0 and used.get(res, 0.0) + level * coef >= capacity[res] * (1 - 1e-9)}
        for f in active:
            if f.cap_bytes_per_s <= level * (1 + 1e-9) or any(c > 0 and r in full for r, c in f.usage.items()):
                rates[f] = level
                for res, coef in f.usage.items():
                    used[res] = used.get(res, 0.0) + coef * level
        active = [f for f in active if f not in rates]
    return rates


class WakeToken:
    """Names one wake-up of the network; a wake-up whose token is not the network's current one
    was superseded by a later start or end, and does nothing."""

    __slots__ = ()


class FlowNetwork:
    """Shared resources and the flows over them, on the engine's clock.

    Args:
        clock: the engine's clock.
        capacity: capacity per resource name.
        capacity_rule: optional function of the set of busy resources returning adjusted
            capacities (used for the duplex loss when both PCIe directions are busy).
        on_finish: called with each finished flow (the engine records its span).
    """

    def __init__(
        self,
        clock: Clock,
        capacity: dict[str, float],
        capacity_rule: Callable[[set[str], dict[str, float]], dict[str, float]] | None = None,
        on_finish: Callable[[Flow], None] | None = None,
    ) -> None:
        self.clock = clock
        self.capacity = dict(capacity)
        self.capacity_rule = capacity_rule
        self.on_finish = on_finish
        self.flows: list[Flow] = []
        self._last_s = 0.0
        self.wake_token = WakeToken()  # the wake-up that is live (the others were superseded)
        self._keys: dict[tuple[tuple[tuple[str, float], ...], float], int] = {}  # (usage, cap) -> key
        self._rates: dict[tuple[int, ...], tuple[float, ...]] = {}  # the flows' keys in order -> rates

    def start(self, size_bytes: float, usage: dict[str, float], cap_bytes_per_s: float,
              meta: dict[str, Any], done: Callable[[Any], None] | None = None, arg: Any = None) -> None:
        """Start a flow; ``done(arg)`` is scheduled when its last byte has moved (SimPy's event
        that succeeded then).

        ``meta`` labels it (``name`` at least) and is handed back with the finished flow.
        """
        name = meta.get("name", "flow")
        if type(name) is not str:
            name = str(name)
        self.start_keyed(name, size_bytes, usage, cap_bytes_per_s, self.key(name, usage, cap_bytes_per_s), meta,
                         done, arg)

    def key(self, name: str, usage: dict[str, float], cap_bytes_per_s: float) -> int:
        """Check a flow's usage and cap (``name`` names it in messages); returns the key that
        names them in the memo of rates (the same for every flow with the same usage and cap)."""
        if not usage.keys() <= self.capacity.keys():
            unknown = set(usage) - set(self.capacity)
            raise KeyError(f"flow {name!r} uses unknown resources {sorted(unknown)}")
        if cap_bytes_per_s <= 0:
            raise ValueError(f"flow {name!r} needs a positive rate cap")
        what = (tuple(usage.items()), cap_bytes_per_s)
        key = self._keys.get(what)
        if key is None:
            key = self._keys[what] = len(self._keys)
        return key

    def start_keyed(self, name: str, size_bytes: float, usage: dict[str, float], cap_bytes_per_s: float, key: int,
                    meta: dict[str, Any], done: Callable[[Any], None] | None, arg: Any) -> None:
        """:meth:`start` with the usage and cap checked and keyed by :meth:`key` (the executor
        does that once per op, issue 16)."""
        flow = Flow(name, size_bytes, usage, cap_bytes_per_s, done, self.clock.now_s, meta, arg, size_bytes)
        if size_bytes <= 0:
            self._finish(flow)
            return
        flow.key = key
        flow.finished_below_bytes = max(1e-6, _EPS * size_bytes)
        self._advance()
        self.flows.append(flow)
        self._rebalance()

    def _advance(self) -> None:
        now = self.clock.now_s
        dt = now - self._last_s
        if dt > 0:
            for f in self.flows:
                f.remaining_bytes -= f.rate_bytes_per_s * dt
        self._last_s = now

    def _capacities(self) -> dict[str, float]:
        if self.capacity_rule is None:
            return self.capacity
        busy = {r for f in self.flows for r, c in f.usage.items() if c > 0}
        return self.capacity_rule(busy, self.capacity)

    def _rebalance(self) -> None:
        """Share the bandwidth anew and wake up when the first flow will have finished.

        The rates are a pure function of the flows' usages and caps in order (the capacities
        depend on which resources are busy, which they decide), so each set met is shared once
        and looked up after (issue 16: the same few sets recur at every layer)."""
        token = self.wake_token = WakeToken()
        flows = self.flows
        if not flows:  # nothing to share and nothing to wake for
            return
        key = tuple(map(_FLOW_KEY, flows))
        rates = self._rates.get(key)
        if rates is None:
            by_flow = fair_rates(flows, self._capacities())
            rates = tuple([by_flow[f] for f in flows])
            if len(self._rates) >= _RATE_MEMO:
                self._rates.clear()
            self._rates[key] = rates
        horizon = math.inf
        for f, rate in zip(flows, rates, strict=True):
            f.rate_bytes_per_s = rate
            if rate > 0:
                left = f.remaining_bytes
                left_s = (left if left > 0.0 else 0.0) / rate  # max(0.0, left) without the call
                if left_s < horizon:
                    horizon = left_s
        if horizon < math.inf:
            self.clock.call_in(horizon, self._wake, token)

    def _wake(self, token: WakeToken) -> None:
        """The wake-up named ``token``: finish the flows done, share anew (a superseded one does nothing)."""
        if token is not self.wake_token:
            return
        self._advance()
        flows = self.flows
        finished = [f for f in flows if f.remaining_bytes <= f.finished_below_bytes]
        if not finished:  # rounding left a sliver: finish the nearest flow
            finished = [min(flows, key=lambda f: f.remaining_bytes / max(f.rate_bytes_per_s, _EPS))]
        if len(finished) == 1:
            flows.remove(finished[0])  # by identity (eq=False): the same list as the filter below
        else:
            self.flows = [f for f in flows if f not in finished]
        for f in finished:
            self._finish(f)
        self._rebalance()

    def shift(self, dt_s: float) -> None:
        """Move the flows in progress ``dt_s`` seconds later (the steady-state shortcut)."""
        self._last_s += dt_s
        for f in self.flows:
            f.start_s += dt_s

    def _finish(self, flow: Flow) -> None:
        flow.remaining_bytes = 0.0
        if self.on_finish is not None:
            self.on_finish(flow)
        if flow.done is not None:
            self.clock.call_now(flow.done, flow.arg)
