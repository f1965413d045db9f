"""The policy hooks a schedule names: caches that decide at run time what is resident.

A cache with an eviction policy (``gpu_params``, ``dram_optimizer``) serves its accesses in the
order the schedule issues them, through :class:`~offsim.engine.cache.Cache`, which asks the
policy and checks every answer: an :class:`~offsim.schedule.ops.Access` is a hit, or a miss that
runs the write-back programs of the victims the policy names, one after the other, then the
unit's fetch program; the prefetch policy may issue later accesses at once. A
:class:`~offsim.schedule.ops.Done` unpins the unit and runs the programs of what the policy
releases. A cache that is not persistent is emptied by :class:`~offsim.schedule.ops.Flush` at
each iteration's end, with one access sequence per iteration.

A cache without a policy (``gpu_activations``) only tracks fetches: the unit's fetch program runs
at its demand or when a :class:`~offsim.schedule.ops.Prefetch` finds the GPU memory free for it.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from types import MappingProxyType
from typing import Protocol

from offsim.core.errors import PolicyError
from offsim.engine.cache import Cache
from offsim.engine.node import Node
from offsim.policies.base import EvictionPolicy, PrefetchPolicy, PrefetchView
from offsim.schedule.ops import Block, CacheSpec, Prefetch

#: runs a program after some nodes; returns the node that finishes when all its ops have
RunProgram = Callable[[Block, Node, list[Node]], Node]
#: records a cache event: (iteration, cache, kind, unit, bytes, seconds)
LogEvent = Callable[[int, str, str, int, float, float], None]


@dataclass(frozen=True)
class CachePolicy:
    """The policies of one cache; ``bytes_per_param`` reads budgets given in parameters."""

    eviction: EvictionPolicy
    prefetch: PrefetchPolicy | None = None
    bytes_per_param: float = 0.0


class ChoicePolicy(Protocol):
    """Decides a :class:`~offsim.schedule.ops.Choose` at run time."""

    def choose(self, iteration: int, gpu_free_bytes: float) -> Hashable:
        """The option to run now (``gpu_free_bytes``: GPU memory not held, per rank)."""
        ...

    def observe(self, option: Hashable, stream_s: float) -> None:
        """How long the program of ``option`` kept the deciding op's stream (seconds)."""
        ...


class PolicyCache:
    """A cache whose residency an eviction policy manages."""

    def __init__(self, spec: CacheSpec, policy: CachePolicy, run: RunProgram, log: LogEvent,
                 note_peak: Callable[[float], None], gpu_free_bytes: Callable[[], float]) -> None:
        self.spec, self.policy, self.run, self.log = spec, policy, run, log
        self.note_peak, self.gpu_free_bytes = note_peak, gpu_free_bytes
        self.sequences: dict[int, list[int]] = {}  # per iteration (one list, key 0, when persistent)
        self.counters: dict[int, int] = {}
        self.where: dict[int, list[str]] = {}
        self.cache: Cache | None = None
        self.cache_key = -1
        self.present: dict[int, Node] = {}  # unit -> its fetch (done or in flight)
        self.open: dict[int, deque[int]] = {}  # unit -> positions issued and not done
        self.issued = 0
        self.iteration = 0

    def _key(self, iteration: int) -> int:
        return 0 if self.spec.persistent else iteration

    def on_walk(self, iteration: int, unit: int, where: str) -> None:
        """Add an access to the sequence (a walk of the schedule before the run); ``where``
        names it in messages."""
        self.sequences.setdefault(self._key(iteration), []).append(unit)
        self.where.setdefault(self._key(iteration), []).append(where)

    def on_issue(self, node: Node) -> None:
        """Number an access as the schedule issues it."""
        key = self._key(node.iteration)
        node.position = self.counters.get(key, 0)
        self.counters[key] = node.position + 1

    def _current(self, iteration: int) -> Cache:
        key = self._key(iteration)
        if self.cache is None or self.cache_key != key:
            cap = math.inf if self.spec.capacity_bytes is None else self.spec.capacity_bytes
            where = self.where[key]
            self.cache = Cache(str(self.spec.id), self.policy.eviction, self.sequences[key], self.spec.unit_bytes, cap,
                               lambda p: f"op {p} ({where[p]})", keep_served=False)
            self.cache_key, self.issued = key, 0
        return self.cache

    # ------------------------------------------------------------ the steady-state shortcut
    def shift_positions(self, key: int, delta: int, first: int, nodes: list[Node]) -> None:
        """Move the positions of sequence ``key`` from ``first`` on (where it repeats) on by
        ``delta`` accesses (those of the repetitions skipped): the count issued, the residents'
        and the open accesses' positions, and those of the access ops in ``nodes``."""
        self.counters[key] = self.counters.get(key, 0) + delta
        if self.cache is not None and self.cache_key == key:
            self.issued += delta
            self.cache.shift(delta, first)
        self.open = {unit: deque(p + delta if p >= first else p for p in q) for unit, q in self.open.items()}
        for n in nodes:
            if n.position >= first:
                n.position += delta

    def shift_iterations(self, first: int, times: int) -> None:
        """Iterations from ``first`` on become ``times`` later (the iterations skipped)."""
        self.iteration += times if self.iteration >= first else 0
        if self.spec.persistent:
            return
        self.counters = {k + (times if k >= first else 0): n for k, n in self.counters.items()}
        if self.cache is not None and self.cache_key >= first:
            self.cache_key += times
            where = self.where[self.cache_key]
            self.cache.describe = lambda p: f"op {p} ({where[p]})"

    # ------------------------------------------------------------ hooks
    def access(self, node: Node) -> None:
        """Issue the demand at ``node.position`` unless issued, then the prefetches asked for."""
        cache = self._current(node.iteration)
        self.iteration = node.iteration
        if self.issued <= node.position:
            self._issue(node, node.position, due=True)
        prefetch = self.policy.prefetch
        if prefetch is None:
            return
        for f in prefetch.fetches(self._view(cache, node.position)):
            if f.position != self.issued or f.position >= len(cache.sequence):
                raise PolicyError(f"prefetch policy '{prefetch.name}' before op {node.position}: asks for "
                                  f"op {f.position}, but prefetches go in order and the next is op "
                                  f"{self.issued} (of {len(cache.sequence)})")
            if not self._issue(node, f.position, due=False):
                break

    def _view(self, cache: Cache, position: int) -> PrefetchView:
        return PrefetchView(position, self.issued, cache.sequence, MappingProxyType(cache.sizes),
                            frozenset(self.present), cache.pinned_bytes(), cache.capacity_bytes,
                            self.gpu_free_bytes(), self.policy.bytes_per_param)

    def _issue(self, origin: Node, position: int, due: bool) -> bool:
        cache = self._current(origin.iteration)
        served = cache.serve(position, due=due)
        if served is None:
            return False
        after = self._drop_all(origin, served.victims, "evict")
        unit = served.tensor
        self.open.setdefault(unit, deque()).append(position)
        self._log(origin, "hit" if served.hit else "miss", unit)
        self.note_peak(cache.used_bytes)
        if not served.hit:
            self.present[unit] = self.run(self.spec.fetch[unit], origin, after)
        self.issued = position + 1
        return True

    def _log(self, origin: Node, kind: str, unit: int) -> None:
        self.log(origin.iteration, str(self.spec.id), kind, unit, float(self.spec.unit_bytes[unit]), 0.0)

    def _drop_all(self, origin: Node, units: tuple[int, ...] | list[int], why: str) -> list[Node]:
        """Run the write-back programs of ``units`` one after the other; returns the last."""
        after: list[Node] = []
        for unit in units:
            del self.present[unit]
            self._log(origin, why, unit)
            if self.spec.writes_back:
                self._log(origin, "writeback", unit)
            after = [self.run(self.spec.evict[unit], origin, after)]
        return after

    def ready(self, node: Node) -> Node:
        """The fetch a :class:`~offsim.schedule.ops.Ready` of ``unit`` waits for."""
        return self.present[node.op.body.unit]  # type: ignore[union-attr]

    def done(self, node: Node) -> list[Node]:
        """The unit's use has ended: unpin it, run what the policy releases; returns what the
        done waits for (write-backs)."""
        unit = node.op.body.unit  # type: ignore[union-attr]
        cache = self._current(node.iteration)
        position = self.open[unit].popleft()
        cache.done(position)
        after = self._drop_all(node, cache.releases(position), "release")
        if self.spec.writes_back and unit not in cache.resident and unit in self.present:  # it bypassed the cache
            del self.present[unit]
            self._log(node, "writeback", unit)
            after = [self.run(self.spec.evict[unit], node, after)]
        return after

    def flush_waits(self) -> list[Node]:
        """What a flush waits for: the fetches in flight."""
        return list(self.present.values())

    def flush(self, node: Node) -> None:
        """Drop every unit (their fetches have ended)."""
        for unit in list(self.present):
            self.run(self.spec.evict[unit], node, [])
        self.present.clear()
        self.open.clear()
        if self.cache is not None:
            self.cache.flush()


class FetchTracker:
    """A cache without a policy: each unit's fetch runs once per micro-batch, at its demand or
    ahead of it while GPU memory allows (activations brought back for backward)."""

    def __init__(self, spec: CacheSpec, run: RunProgram, gpu_free_bytes: Callable[[], float]) -> None:
        self.spec, self.run, self.gpu_free_bytes = spec, run, gpu_free_bytes
        self.present: dict[tuple[int, int, int], Node] = {}

    def on_walk(self, iteration: int, unit: int, where: str) -> None:
        """No sequence is kept."""

    def on_issue(self, node: Node) -> None:
        """Nothing to number."""

    def _start(self, node: Node, unit: int) -> None:
        self.present[(node.iteration, node.micro_batch, unit)] = self.run(self.spec.fetch[unit], node, [])

    def access(self, node: Node) -> None:
        unit = node.op.body.unit  # type: ignore[union-attr]
        if (node.iteration, node.micro_batch, unit) not in self.present:
            self._start(node, unit)

    def prefetch(self, node: Node, body: Prefetch) -> None:
        """Start the next units not started, in order, while the GPU keeps ``reserve_bytes`` free."""
        for unit in body.units:
            if (node.iteration, node.micro_batch, unit) in self.present:
                continue
            if self.spec.unit_bytes[unit] + body.reserve_bytes > self.gpu_free_bytes():
                return
            self._start(node, unit)

    def ready(self, node: Node) -> Node:
        return self.present.pop((node.iteration, node.micro_batch, node.op.body.unit))  # type: ignore[union-attr]

    def done(self, node: Node) -> list[Node]:
        return []

    def flush_waits(self) -> list[Node]:
        return []

    def flush(self, node: Node) -> None:
        """Nothing stays."""
