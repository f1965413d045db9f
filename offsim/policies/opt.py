"""``opt``: an offline plan for bytes fetched, and a policy that follows it.

It is the optimum for fetch on demand only when its search is complete (``exact``); otherwise it
is a heuristic. It is never the yardstick: ``offsim compare`` scores every policy, this one
included, against the bounds of :mod:`offsim.policies.bounds`.

Belady's rule (evict the tensor used furthest ahead, :mod:`offsim.policies.belady`) minimises
misses when all tensors have one size; with several sizes it can fetch more bytes than another
policy (a large tensor used far ahead is evicted, and later re-fetched, where dropping a small
one used sooner was cheaper). Layers are nearly uniform: the transformer blocks share one size
and only a few tensors (embedding, LM head) differ. The optimum is then found exactly by
enumeration:

* each access of a tensor of a minority size either keeps it until its next access or drops it
  at once (dropping later never leaves more room; the dropped tensor costs its size when it is
  next needed);
* given those choices, the majority-size tensors are served by Belady's rule, which is optimal
  for equal-sized pages under a budget that changes over time.

The choices are enumerated (2^k for k gaps between accesses of minority tensors; one training
iteration has about two per micro-batch). Above ``MAX_CHOICES`` gaps, each minority tensor gets
one choice for all its gaps (the pattern repeats every micro-batch) and the result is marked
inexact. ``tests/test_policies.py`` checks the
result against an exhaustive search over cache contents.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from itertools import product
from typing import Literal

from offsim.config.base import Frozen
from offsim.policies.base import BuildContext, Evict, MemoryView, evict_in_order

MAX_CHOICES = 10
_SLACK = 1e-9


@dataclass(frozen=True)
class OptimalPlan:
    """The cheapest schedule for one access sequence and budget.

    Attributes:
        fetched_bytes: bytes fetched at each position (0 on a hit).
        drop_after: positions after which the (minority-size) tensor just used is dropped.
        minority: tensors whose size differs from the most common one.
        exact: the enumeration was complete (otherwise the best of a few heuristics).
    """

    fetched_bytes: tuple[float, ...]
    drop_after: frozenset[int]
    minority: frozenset[int]
    exact: bool

    @property
    def total_bytes(self) -> float:
        """Bytes fetched over the whole sequence."""
        return sum(self.fetched_bytes)


def _next_positions(sequence: Sequence[int]) -> list[int | None]:
    out: list[int | None] = [None] * len(sequence)
    last: dict[int, int] = {}
    for p in range(len(sequence) - 1, -1, -1):
        out[p] = last.get(sequence[p])
        last[sequence[p]] = p
    return out


def _or_inf(position: int | None) -> float:
    return math.inf if position is None else position


def _fits(used: float, size: float, capacity: float) -> bool:
    return used + size <= capacity * (1 + _SLACK) + _SLACK


def _schedule(sequence: Sequence[int], sizes: Mapping[int, float], capacity: float, nxt: Sequence[int | None],
              minority: frozenset[int], drop_after: frozenset[int]) -> list[float] | None:
    """Bytes fetched per position under one set of choices, or None if it cannot fit."""
    resident: dict[int, int] = {}  # tensor -> position of its latest access
    used = 0.0
    out: list[float] = []
    for p, t in enumerate(sequence):
        if t in resident:
            out.append(0.0)
        else:
            size = sizes[t]
            if not _fits(0.0, size, capacity):
                return None
            while not _fits(used, size, capacity):
                majority = [u for u in resident if u not in minority]
                if not majority:
                    return None
                victim = max(majority, key=lambda u: (_or_inf(nxt[resident[u]]), u))
                used -= sizes[victim]
                del resident[victim]
            used += size
            out.append(size)
        resident[t] = p
        if t in minority and (nxt[p] is None or p in drop_after):
            used -= sizes[t]
            del resident[t]
    return out


def _minority(sequence: Sequence[int], sizes: Mapping[int, float]) -> frozenset[int]:
    tensors = set(sequence)
    common = Counter(sizes[t] for t in tensors).most_common(1)[0][0]
    return frozenset(t for t in tensors if sizes[t] != common)


def optimal_plan(sequence: Sequence[int], sizes: Mapping[int, float], capacity_bytes: float) -> OptimalPlan:
    """The schedule that fetches the fewest bytes for ``sequence`` within ``capacity_bytes``.

    A tensor larger than the budget is fetched at every access and never kept.
    """
    seq = tuple(sequence)
    if not seq:
        return OptimalPlan((), frozenset(), frozenset(), True)
    too_big = {t for t in seq if not _fits(0.0, sizes[t], capacity_bytes)}
    if too_big:  # bypass: solve the rest, charge these at every access
        rest = [t for t in seq if t not in too_big]
        sub = optimal_plan(rest, sizes, capacity_bytes)
        it = iter(sub.fetched_bytes)
        fetched = tuple(sizes[t] if t in too_big else next(it) for t in seq)
        return OptimalPlan(fetched, frozenset(), sub.minority, sub.exact)
    minority = _minority(seq, sizes)
    nxt = _next_positions(seq)
    gaps = [p for p, t in enumerate(seq) if t in minority and (n := nxt[p]) is not None and n > p + 1]
    exact = len(gaps) <= MAX_CHOICES
    best: tuple[float, list[float], frozenset[int]] | None = None
    for drop in _choices(seq, gaps, minority, exact):
        out = _schedule(seq, sizes, capacity_bytes, nxt, minority, drop)
        if out is not None and (best is None or sum(out) < best[0] - _SLACK):
            best = (sum(out), out, drop)
    if best is None:
        raise ValueError("no schedule fits: the budget cannot hold the largest tensor")
    return OptimalPlan(tuple(best[1]), best[2], minority, exact)


def _choices(seq: Sequence[int], gaps: list[int], minority: frozenset[int],
             exact: bool) -> list[frozenset[int]]:
    """Every subset of gaps to drop in; or, when there are too many, one choice per tensor (all
    of its gaps alike), which covers the steady pattern of repeated micro-batches."""
    if exact:
        return [frozenset(p for p, d in zip(gaps, mask, strict=True) if d)
                for mask in product((False, True), repeat=len(gaps))]
    tensors = sorted(minority)
    out = []
    for mask in product((False, True), repeat=len(tensors)):
        dropped = {t for t, d in zip(tensors, mask, strict=True) if d}
        out.append(frozenset(p for p in gaps if seq[p] in dropped))
    return out


@lru_cache(maxsize=64)
def _cached_plan(sequence: tuple[int, ...], sizes: tuple[tuple[int, float], ...],
                 capacity: float) -> OptimalPlan:
    return optimal_plan(sequence, dict(sizes), capacity)


class OptConfig(Frozen):
    """``{kind: opt}``."""

    kind: Literal["opt"] = "opt"

    def build(self, ctx: BuildContext) -> Optimal:
        """The policy."""
        return Optimal()


class Optimal:
    """Follows :func:`optimal_plan`: drops minority-size tensors where the plan does, keeps
    them otherwise, and evicts the others by Belady's rule.

    The plan is for fetch-on-demand; when prefetch pins a tensor the plan would drop, the tensor
    stays and the rule falls back to Belady over everything evictable.
    """

    name = "opt"

    def _plan(self, view: MemoryView) -> OptimalPlan:
        sizes = tuple(sorted(view.sizes.items()))
        return _cached_plan(tuple(view.sequence), sizes, view.capacity_bytes)

    def victims(self, view: MemoryView, need_bytes: float) -> list[Evict]:
        """Majority-size tensors by furthest next use; minority ones only if that is short."""
        plan = self._plan(view)

        def key(t: int) -> tuple[bool, float, int]:
            e = view.entries[t]
            return (t in plan.minority, -(math.inf if e.next_use is None else e.next_use), t)

        return evict_in_order(view, need_bytes, sorted(view.candidates(), key=key))

    def releases(self, view: MemoryView) -> list[Evict]:
        """The tensor just used, where the plan drops it (and nothing pins it)."""
        if not math.isfinite(view.capacity_bytes):
            return []
        plan = self._plan(view)
        t = view.sequence[view.position]
        if t not in plan.minority or t in view.pinned or t not in view.entries:
            return []
        nxt = _next_positions(view.sequence)[view.position]
        if nxt is None or view.position in plan.drop_after:
            return [Evict(t)]
        return []
