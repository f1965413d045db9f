"""A cache over a known access sequence, which asks a policy and checks every answer.

Pure bookkeeping, no SimPy: the engine drives it access by access (issuing an access when its
fetch starts, finishing it when its op has run); :func:`replay` drives it on a bare sequence,
for tests and for the offline optimum the results are scored against.

Rules the cache enforces (a violation raises :class:`~offsim.errors.PolicyError` naming the
policy and the op):

* a victim or a released tensor must be resident and not pinned (pinned = needed by an issued
  access that has not finished);
* victims must free at least the bytes asked for, with no tensor named twice.

A prefetch that cannot get room (the pinned tensors fill the budget, or the policy keeps what
is left) waits; an access that is due now and cannot get room is the policy's error.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from offsim.errors import PolicyError
from offsim.policies.base import Entry, Evict, EvictionPolicy, MemoryView

_SLACK = 1e-9  # relative tolerance on byte budgets (sizes are float products)


@dataclass
class _Resident:
    size_bytes: float
    inserted_at: int
    last_use: int
    uses: int = 1


@dataclass(frozen=True)
class Served:
    """Outcome of one access: hit or miss, and what was evicted to make room."""

    position: int
    tensor: int
    hit: bool
    victims: tuple[int, ...] = ()


@dataclass
class CacheCounters:
    """Running totals of one cache."""

    hits: int = 0
    misses: int = 0
    bytes_fetched: float = 0.0
    bytes_evicted: float = 0.0
    peak_bytes: float = 0.0
    served: list[Served] = field(default_factory=list)


def next_positions(sequence: Sequence[int]) -> list[int | None]:
    """For each position, the next position holding the same tensor (None if none)."""
    out: list[int | None] = [None] * len(sequence)
    last: dict[int, int] = {}
    for p in range(len(sequence) - 1, -1, -1):
        out[p] = last.get(sequence[p])
        last[sequence[p]] = p
    return out


class Cache:
    """One cache tier's residency over a known access sequence.

    Args:
        name: the cache (``gpu_params``, ``dram_optimizer``), for messages.
        policy: the eviction policy.
        sequence: the tensor of every access position.
        sizes: bytes of every tensor.
        capacity_bytes: budget; ``inf`` for none.
        describe: names the op at a position, for messages.
        keep_served: keep every access's outcome in ``counters.served`` (the engine does not:
            its memory would grow with the run).
    """

    def __init__(self, name: str, policy: EvictionPolicy, sequence: Sequence[int], sizes: Mapping[int, float],
                 capacity_bytes: float = math.inf, describe: Callable[[int], str] | None = None,
                 keep_served: bool = True) -> None:
        self.name = name
        self.policy = policy
        self.sequence = tuple(sequence)
        self.sizes = dict(sizes)
        self.capacity_bytes = capacity_bytes
        self.describe = describe or (lambda p: f"access {p}")
        self._next = next_positions(self.sequence)
        self.resident: dict[int, _Resident] = {}
        self.pins: Counter[int] = Counter()
        self._pinned: set[int] = set()  # the tensors whose pin count is above 0 (kept with ``pins``)
        self.used_bytes = 0.0
        self.counters = CacheCounters()
        self.keep_served = keep_served

    # ------------------------------------------------------------ views
    def view(self, position: int) -> MemoryView:
        """The read-only snapshot a policy decides on."""
        entries = {t: Entry(r.size_bytes, r.inserted_at, r.last_use, r.uses, self._next[r.last_use])
                   for t, r in self.resident.items()}
        pinned = frozenset(self._pinned)  # issue 16: not a walk of every tensor ever pinned
        return MemoryView(self.name, position, self.capacity_bytes, self.used_bytes,
                          MappingProxyType(entries), pinned, self.sequence, MappingProxyType(self.sizes))

    def _fits(self, nbytes: float) -> bool:
        return self.used_bytes + nbytes <= self.capacity_bytes * (1 + _SLACK) + _SLACK

    def pinned_bytes(self) -> float:
        """Bytes of the pinned resident tensors."""
        return sum(self.resident[t].size_bytes for t, n in self.pins.items() if n > 0 and t in self.resident)

    def cacheable(self, tensor: int) -> bool:
        """False when the tensor alone exceeds the budget (it then bypasses the cache)."""
        return self.sizes[tensor] <= self.capacity_bytes * (1 + _SLACK) + _SLACK

    # ------------------------------------------------------------ accesses
    def serve(self, position: int, *, due: bool = True) -> Served | None:
        """Issue the access at ``position``: a hit, or a miss that takes room (evicting).

        A prefetch (``due=False``) that cannot get room returns None and changes nothing.
        """
        t = self.sequence[position]
        if t in self.resident:
            r = self.resident[t]
            r.last_use, r.uses = position, r.uses + 1
            return self._record(Served(position, t, True))
        size = self.sizes[t]
        victims: tuple[int, ...] = ()
        if not self.cacheable(t):
            self._pin(t)
            return self._record(Served(position, t, False), size, insert=False)
        if not self._fits(size):
            chosen = self._make_room(position, size, due)
            if chosen is None:
                return None
            victims = chosen
        self.resident[t] = _Resident(size, position, position)
        self.used_bytes += size
        self.counters.peak_bytes = max(self.counters.peak_bytes, self.used_bytes)
        return self._record(Served(position, t, False, victims), size)

    def _record(self, served: Served, fetched: float = 0.0, insert: bool = True) -> Served:
        c = self.counters
        if insert:
            self._pin(served.tensor)
        if served.hit:
            c.hits += 1
        else:
            c.misses += 1
            c.bytes_fetched += fetched
        if self.keep_served:
            c.served.append(served)
        return served

    def _make_room(self, position: int, size: float, due: bool) -> tuple[int, ...] | None:
        need = self.used_bytes + size - self.capacity_bytes
        view = self.view(position)
        evictable = sum(view.entries[t].size_bytes for t in view.candidates())
        if evictable < need * (1 - _SLACK):
            if due:
                raise PolicyError(f"{self.name}: {self.describe(position)} needs "
                                  f"{size / 2**20:.1f} MiB but the tensors in use fill the budget of "
                                  f"{self.capacity_bytes / 2**20:.1f} MiB")
            return None
        victims = [e.tensor for e in self.policy.victims(view, need)]
        self._check_victims(view, victims, position)
        freed = sum(view.entries[t].size_bytes for t in victims)
        if freed < need * (1 - _SLACK) - _SLACK:
            if not due:
                return None
            where = f"{self.name} eviction policy '{self.policy.name}' at {self.describe(position)}"
            raise PolicyError(f"{where}: evicts too little ({freed / 2**20:.1f} MiB freed, "
                              f"{need / 2**20:.1f} MiB needed)")
        for v in victims:
            self._drop(v)
        return tuple(victims)

    def _check_victims(self, view: MemoryView, victims: list[int], position: int) -> None:
        where = f"{self.name} eviction policy '{self.policy.name}' at {self.describe(position)}"
        if len(set(victims)) != len(victims):
            raise PolicyError(f"{where}: names a tensor twice in {victims}")
        for v in victims:
            if v not in view.entries:
                raise PolicyError(f"{where}: evicts tensor {v}, which is not resident")
            if v in view.pinned:
                raise PolicyError(f"{where}: evicts tensor {v}, which is in use (needed by an issued op)")

    def _drop(self, tensor: int) -> None:
        r = self.resident.pop(tensor)
        self.used_bytes -= r.size_bytes
        self.counters.bytes_evicted += r.size_bytes

    def shift(self, delta: int, first: int) -> None:
        """Positions of the residents from ``first`` on ``delta`` later (the steady-state shortcut:
        from ``first`` on the sequence repeats with period ``delta``, so their next uses move with
        them; a position before stays, as its next use does)."""
        for r in self.resident.values():
            if r.inserted_at >= first:
                r.inserted_at += delta
            if r.last_use >= first:
                r.last_use += delta

    def done(self, position: int) -> None:
        """The access at ``position`` has finished: unpin its tensor."""
        t = self.sequence[position]
        if self.pins[t] > 0:
            self.pins[t] -= 1
            if not self.pins[t]:
                self._pinned.discard(t)

    def _pin(self, tensor: int) -> None:
        """One more issued access needs ``tensor``."""
        self.pins[tensor] += 1
        self._pinned.add(tensor)

    def releases(self, position: int) -> list[int]:
        """Ask the policy what to drop after the access at ``position``; drop it."""
        view = self.view(position)
        out = [e.tensor for e in self.policy.releases(view)]
        where = f"{self.name} eviction policy '{self.policy.name}' at {self.describe(position)}"
        if len(set(out)) != len(out):
            raise PolicyError(f"{where}: releases a tensor twice in {out}")
        for t in out:
            if t not in view.entries:
                raise PolicyError(f"{where}: releases tensor {t}, which is not resident")
            if t in view.pinned:
                raise PolicyError(f"{where}: releases tensor {t}, which is in use (needed by an issued op)")
            self._drop(t)
        return out

    def flush(self) -> list[int]:
        """Drop everything (the end of an iteration for parameters updated by the optimizer)."""
        out = list(self.resident)
        for t in out:
            r = self.resident.pop(t)
            self.used_bytes -= r.size_bytes
        self.pins.clear()
        self._pinned.clear()
        return out


def replay(policy: EvictionPolicy, sequence: Sequence[int], sizes: Mapping[int, float],
           capacity_bytes: float = math.inf) -> CacheCounters:
    """Run ``policy`` on a bare access sequence (fetch on demand, no prefetch)."""
    cache = Cache("replay", policy, sequence, sizes, capacity_bytes)
    for p in range(len(sequence)):
        cache.serve(p)
        cache.done(p)
        cache.releases(p)
    return cache.counters


def belady_fetched_bytes(sequence: Sequence[int], sizes: Mapping[int, float], capacity_bytes: float) -> list[float]:
    """Bytes Belady's rule (evict the tensor used furthest ahead) fetches at each position of
    ``sequence`` (0 on a hit), on demand into ``capacity_bytes``. Not the optimum: with tensors of
    different sizes Belady's rule is a heuristic (hence not named ``opt``)."""
    from offsim.policies.belady import Belady

    counters = replay(Belady(), sequence, sizes, capacity_bytes)
    return [0.0 if s.hit else sizes[s.tensor] for s in counters.served]


__all__ = ["Cache", "CacheCounters", "Evict", "Served", "belady_fetched_bytes", "next_positions", "replay"]
