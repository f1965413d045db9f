"""Bounds on the bytes any eviction schedule must move, for tensors of different sizes.

Belady's rule is optimal for one cache of equal-size pages; with several sizes it is a
heuristic (a large tensor used far ahead may be dropped where dropping a small one was cheaper).
The offline optimum with variable sizes is NP-hard, but it is bounded from both sides by the
min-cost-flow formulation of Berger, Beckmann and Harchol-Balter, "Practical Bounds on Optimal
Caching with Variable Object Sizes", Proc. ACM Meas. Anal. Comput. Syst. 2(2), 2018
(SIGMETRICS 2018): FOO. Their formulation is written here from the paper's idea, for the
cache offsim's engine runs:

* An *interval* is the time between two consecutive accesses of one tensor. A schedule either
  keeps the tensor over the whole interval (free) or drops it somewhere inside and pays the
  interval's cost: the bytes re-fetched at its end, plus the write-back for a dirty tensor.
* A tensor larger than the budget bypasses the cache: it moves at every access.
* *Points* are the accesses. At access ``k`` the tensor used there must be resident (the
  engine has no bypass), so the kept intervals strictly across ``k`` may take at most
  ``room_k = capacity - size(tensor at k)``. These are the only constraints: the room between two
  accesses is implied (what is kept across the gap after ``k`` is what is kept across ``k``
  plus, at most, the tensor used at ``k``).
* An interval larger than the room at some point it covers can never be kept; it is charged
  up front (a valid cut that keeps the flow from keeping a fraction of it).
* Each room is lowered to the largest total of whole intervals across its point that fits
  (another valid cut; with one tensor size it rounds the room to a whole number of tensors).
* Letting a fraction ``x_i`` of each interval be kept gives a linear program whose constraint
  matrix has consecutive ones in every column (an interval covers consecutive points): it is a
  min-cost flow. Nodes ``0..K``; arc ``k -> k+1`` (capacity ``room_k``, cost 0) carries the kept
  bytes; for each interval covering points ``a..b`` an arc ``a -> b+1`` (capacity its size, cost
  its drop cost per byte) carries the dropped bytes; node ``a`` supplies and node ``b+1``
  absorbs the interval's size. Its optimum is a **lower bound** on every integral schedule
  (FOO-L).
* Rounding the flow down (keeping only intervals the flow keeps whole, then adding dropped ones
  greedily while they fit) gives a feasible schedule: an **upper bound** (FOO-U). Where the two
  meet, the bound *is* the optimum and is reported exact (with equal sizes and a room that is a
  whole number of tensors the matrix is totally unimodular and they always meet).

Two start/end conventions cover offsim's caches: a cache that starts empty and is dropped at no
cost at the end (the GPU parameter buffer, emptied every iteration), and a *window* of a cache
that persists (the DRAM cache over optimizer state, measured over the steady iterations): its
contents at the window's start are free to choose within the budget (an initial interval,
dropped at the cost of one read) and dirty tensors not resident at its end must have been written
back (a final interval, dropped at the cost of one write). Both only relax what the engine can
do, so the lower bound holds for it.

For long sequences (more than ``MAX_FLOW_INTERVALS`` intervals) one flow is too slow (tens of
seconds at 30,000 intervals), and PFOO (Berger et al., Sec. 5) takes its place:

* from below, the larger of two relaxations: PFOO-L, the room held only on average over time (a
  fractional knapsack, ``n log n``; weak on training's zig-zags, where the room is full at the
  turn and idle elsewhere), and independent flows over segments of ``SEGMENT_POINTS`` points with
  the intervals cut at the boundaries (:func:`split_lower_bound`, offsim's cut);
* from above, PFOO-U: flows over overlapping windows, each interval decided in the window it
  starts in and kept only where it fits over its whole span (:func:`segmented_schedule`), or a
  replay of Belady's rule or Belady-Size if cheaper.

Neither side is then the optimum unless they meet (``CacheBound.exact``); the gap is reported.
"""

from __future__ import annotations

import math
import time
from bisect import bisect_left
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

import numpy as np
from scipy.optimize import linprog
from scipy.sparse import csr_matrix

#: Relative slack on byte budgets, as the engine's cache allows (sizes are float products).
SLACK = 1e-9
#: Relative tolerance under which a lower and an upper bound are called equal (the LP solver's
#: feasibility tolerance is 1e-7 on data scaled to the largest tensor).
EXACT_RTOL = 1e-6
#: Above this many intervals the exact flow (seconds at 10,000 on a 2-core machine, growing
#: faster than linearly) gives way to PFOO: flows over segments of ``SEGMENT_POINTS`` points.
MAX_FLOW_INTERVALS = 10_000
SEGMENT_POINTS = 2_000


class BoundMethod(StrEnum):
    """How a lower bound was computed."""

    FLOW = "foo-flow"  # the min-cost flow (FOO-L), with its rounding as the upper bound (FOO-U)
    #: long sequences: the larger of PFOO-L (room held on average) and flows over segments below,
    #: PFOO-U (flows over overlapping windows, rounded) and the replays above
    AVERAGE = "pfoo"


@dataclass(frozen=True)
class Interval:
    """Between two consecutive accesses of one tensor (or the window's start or end).

    Attributes:
        tensor: the tensor.
        first / last: the first and last point (access index) it covers; ``last < first`` when
            it covers none (two accesses in a row: kept for free).
        size_bytes: bytes it holds while kept.
        drop_bytes: bytes moved if it is not kept (re-fetch, and write-back when dirty).
    """

    tensor: int
    first: int
    last: int
    size_bytes: float
    drop_bytes: float

    @property
    def points(self) -> int:
        """Number of points it covers."""
        return max(0, self.last - self.first + 1)


@dataclass(frozen=True)
class Problem:
    """One cache's offline caching problem.

    Attributes:
        intervals: the choices (keep or drop).
        room_bytes: per point, the bytes kept intervals across it may take.
        fixed_bytes: bytes every schedule moves (first fetches of an empty cache, tensors too
            large to be cached).
    """

    intervals: tuple[Interval, ...]
    room_bytes: tuple[float, ...]
    fixed_bytes: float

    def cost(self, kept: Iterable[int]) -> float:
        """Bytes moved by the schedule that keeps the intervals ``kept`` (indices)."""
        keep = set(kept)
        return self.fixed_bytes + sum(iv.drop_bytes for i, iv in enumerate(self.intervals) if i not in keep)


@dataclass(frozen=True)
class CacheBound:
    """Lower and upper bound on the bytes one cache moves.

    Attributes:
        lower_bytes: no schedule moves fewer.
        upper_bytes: a feasible schedule moves this many (the best one constructed).
        method: how the lower bound was computed.
        solve_s: seconds the bounds took.
    """

    lower_bytes: float
    upper_bytes: float
    method: BoundMethod
    solve_s: float = 0.0

    @property
    def gap_bytes(self) -> float:
        """``upper_bytes - lower_bytes`` (0 when exact)."""
        return 0.0 if self.exact else self.upper_bytes - self.lower_bytes

    @property
    def exact(self) -> bool:
        """The bounds meet: the lower bound is the optimum."""
        return self.upper_bytes - self.lower_bytes <= EXACT_RTOL * max(self.upper_bytes, 1.0)


# ---------------------------------------------------------------- building the problem
def fits(size_bytes: float, capacity_bytes: float) -> bool:
    """Whether a tensor can be cached at all (the engine bypasses larger ones)."""
    return size_bytes <= capacity_bytes * (1 + SLACK) + SLACK


def build_problem(sequence: Sequence[int], sizes: Mapping[int, float], capacity_bytes: float,
                  read_bytes: Mapping[int, float] | None = None,
                  write_bytes: Mapping[int, float] | None = None, warm_start: bool = False) -> Problem:
    """The intervals and rooms of ``sequence`` in a cache of ``capacity_bytes``.

    Args:
        sequence: the tensor of every access, in order.
        sizes: bytes each tensor occupies.
        capacity_bytes: the budget (``inf``: unbounded).
        read_bytes: bytes a miss of each tensor moves (default: its size).
        write_bytes: bytes a write-back of each tensor moves (default 0: a clean cache). Every
            access dirties the tensor (the optimizer updates the state it reads).
        warm_start: the contents at the start are free to choose (a window of a cache that
            persists); otherwise the cache starts empty.
    """
    read = {t: sizes[t] for t in sizes} if read_bytes is None else dict(read_bytes)
    write = dict.fromkeys(sizes, 0.0) if write_bytes is None else dict(write_bytes)
    room = [capacity_bytes - sizes[t] if fits(sizes[t], capacity_bytes) else capacity_bytes for t in sequence]
    intervals: list[Interval] = []
    fixed = 0.0
    last: dict[int, int] = {}
    for k, t in enumerate(sequence):
        if not fits(sizes[t], capacity_bytes):
            fixed += read[t] + write[t]  # bypasses the cache: read and written at every access
        elif t in last:
            intervals.append(Interval(t, last[t] + 1, k - 1, sizes[t], read[t] + write[t]))
        elif warm_start:
            intervals.append(Interval(t, 0, k - 1, sizes[t], read[t]))
        else:
            fixed += read[t]
        last[t] = k
    for t, k in last.items():
        if fits(sizes[t], capacity_bytes) and write[t] > 0:
            intervals.append(Interval(t, k + 1, len(sequence) - 1, sizes[t], write[t]))
    # an interval covering no point (two accesses in a row) is kept for free
    problem = Problem(tuple(iv for iv in intervals if iv.points > 0), tuple(room), fixed)
    for _ in range(2):  # fixing oversized intervals may let the rooms shrink further
        problem = _without_oversized(*_with_whole_rooms(problem))
    return problem


#: Most partial sums :func:`_largest_sum` tracks at one point, and most sums it tries in one step,
#: before it leaves the room as it is (not rounding a room is valid, only weaker).
MAX_SUMS = 4096
MAX_SUM_STEPS = 8192


def _largest_sum(room: float, multiset: tuple[tuple[float, int], ...]) -> float:
    """The largest sum of sizes from ``multiset`` ((size, count) pairs) that fits ``room``; the
    room itself when the sums are too many to enumerate."""
    limit = room * (1 + SLACK) + SLACK
    full = room * (1 - SLACK) - SLACK  # a sum this large cannot be improved on
    sums = {0.0}
    for size, count in multiset:
        most = min(count, int(limit // size))
        if len(sums) * (most + 1) > MAX_SUM_STEPS:
            return room
        sums = {a + m * size for a in sums for m in range(most + 1) if a + m * size <= limit}
        if len(sums) > MAX_SUMS or max(sums) >= full:
            return room if len(sums) > MAX_SUMS else min(room, max(sums))
    return min(room, max(sums))


def _with_whole_rooms(problem: Problem) -> tuple[tuple[Interval, ...], tuple[float, ...], float]:
    """Each room lowered to the largest total of whole intervals across that point that fits in
    it (a valid cut: a schedule keeps intervals whole; with one size it rounds the room down to a
    whole number of tensors, which makes the flow integral)."""
    n = len(problem.room_bytes)
    sizes = sorted({iv.size_bytes for iv in problem.intervals})
    counts = np.zeros((len(sizes), n + 1), dtype=np.int64)
    index = {s: d for d, s in enumerate(sizes)}
    for iv in problem.intervals:
        counts[index[iv.size_bytes], iv.first] += 1
        counts[index[iv.size_bytes], iv.last + 1] -= 1
    across = np.cumsum(counts, axis=1)[:, :n]
    memo: dict[tuple[float, tuple[tuple[float, int], ...]], float] = {}
    rooms = []
    for k, room in enumerate(problem.room_bytes):
        key = (room, tuple((s, int(across[d, k])) for d, s in enumerate(sizes) if across[d, k] > 0))
        if key not in memo:
            memo[key] = _largest_sum(*key) if math.isfinite(room) else room
        rooms.append(memo[key])
    return problem.intervals, tuple(rooms), problem.fixed_bytes


def _without_oversized(intervals: tuple[Interval, ...], room: tuple[float, ...], fixed: float) -> Problem:
    """Moves intervals larger than the room at some point they cover into the fixed bytes: no
    schedule can keep them, and fixing them tightens the flow (which could keep a fraction)."""
    rooms = np.array(room) * (1 + SLACK) + SLACK
    keepable, dropped = [], 0.0
    for iv in intervals:
        if iv.size_bytes <= rooms[iv.first:iv.last + 1].min():
            keepable.append(iv)
        else:
            dropped += iv.drop_bytes
    return Problem(tuple(keepable), room, fixed + dropped)


# ---------------------------------------------------------------- FOO: the min-cost flow
def _flow_matrix(problem: Problem) -> tuple[csr_matrix, np.ndarray, np.ndarray, np.ndarray]:
    """Node-arc incidence matrix (+1 where an arc leaves, -1 where it enters), supplies, arc
    capacities and arc costs per unit flow. Arcs: ``k -> k+1`` per point, then one per interval."""
    n_points, ivs = len(problem.room_bytes), problem.intervals
    tails = np.concatenate([np.arange(n_points), [iv.first for iv in ivs]]).astype(np.int64)
    heads = np.concatenate([np.arange(1, n_points + 1), [iv.last + 1 for iv in ivs]]).astype(np.int64)
    n_arcs = len(tails)
    rows = np.concatenate([tails, heads])
    cols = np.concatenate([np.arange(n_arcs), np.arange(n_arcs)])
    vals = np.concatenate([np.ones(n_arcs), -np.ones(n_arcs)])
    incidence = csr_matrix((vals, (rows, cols)), shape=(n_points + 1, n_arcs))
    supply = np.zeros(n_points + 1)
    sizes = np.array([iv.size_bytes for iv in ivs])
    np.add.at(supply, [iv.first for iv in ivs], sizes)
    np.add.at(supply, [iv.last + 1 for iv in ivs], -sizes)
    capacity = np.concatenate([np.maximum(np.array(problem.room_bytes), 0.0), sizes])
    cost = np.concatenate([np.zeros(n_points), [iv.drop_bytes / iv.size_bytes for iv in ivs]])
    return incidence, supply, capacity, cost


def flow_lower_bound(problem: Problem) -> tuple[float, np.ndarray]:
    """FOO-L: the min-cost flow's cost, and the fraction of each interval it keeps.

    Data are scaled to the largest tensor so that the solver's absolute tolerances are relative
    ones."""
    if not problem.intervals:
        return problem.fixed_bytes, np.ones(0)
    incidence, supply, capacity, cost = _flow_matrix(problem)
    scale = max(iv.size_bytes for iv in problem.intervals)
    res = linprog(cost, A_eq=incidence, b_eq=supply / scale, bounds=np.column_stack([np.zeros_like(capacity),
                  capacity / scale]), method="highs")
    if res.status != 0:
        raise RuntimeError(f"min-cost flow failed: {res.message}")
    n_points = len(problem.room_bytes)
    dropped = res.x[n_points:] * scale
    sizes = np.array([iv.size_bytes for iv in problem.intervals])
    kept = np.clip(1.0 - dropped / sizes, 0.0, 1.0)
    return problem.fixed_bytes + float(res.fun) * scale, kept


def round_schedule(problem: Problem, preference: Sequence[float]) -> list[int]:
    """A feasible schedule (kept intervals): intervals in decreasing ``preference`` (the flow's
    kept fraction, or bytes saved per byte-point of room), then bytes saved, each kept if it fits
    at every point it covers."""
    load = np.zeros(len(problem.room_bytes))
    room = np.array(problem.room_bytes) * (1 + SLACK) + SLACK
    order = sorted(range(len(problem.intervals)),
                   key=lambda i: (-preference[i], -problem.intervals[i].drop_bytes, i))
    kept: list[int] = []
    for i in order:
        iv = problem.intervals[i]
        span = slice(iv.first, iv.last + 1)
        if np.all(load[span] + iv.size_bytes <= room[span]):
            load[span] += iv.size_bytes
            kept.append(i)
    return kept


def feasible(problem: Problem, kept: Iterable[int]) -> bool:
    """Whether keeping the intervals ``kept`` respects the room at every point."""
    load = np.zeros(len(problem.room_bytes))
    for i in kept:
        iv = problem.intervals[i]
        load[iv.first:iv.last + 1] += iv.size_bytes
    return bool(np.all(load <= np.array(problem.room_bytes) * (1 + SLACK) + SLACK))


# ---------------------------------------------------------------- PFOO-L: room on average
def average_lower_bound(problem: Problem) -> float:
    """The bound with the room held only on average over the points (a fractional knapsack:
    keep the intervals that save the most bytes per byte-point of room first). Weaker than the
    flow, never above it; ``n log n``."""
    budget = float(sum(max(r, 0.0) for r in problem.room_bytes))
    saved = 0.0
    for iv in sorted(problem.intervals, key=lambda iv: -iv.drop_bytes / (iv.size_bytes * iv.points)):
        need = iv.size_bytes * iv.points
        share = min(1.0, budget / need) if need > 0 else 1.0
        saved += share * iv.drop_bytes
        budget -= share * need
        if budget <= 0:
            break
    return problem.fixed_bytes + sum(iv.drop_bytes for iv in problem.intervals) - saved


# ---------------------------------------------------------------- PFOO: flows over segments
def split_lower_bound(problem: Problem, segment_points: int = SEGMENT_POINTS) -> float:
    """A lower bound from independent flows over segments of ``segment_points`` points.

    Each interval is cut where it crosses a segment boundary; a piece carries the interval's size
    and the share of its drop cost that its points are of the interval's points, and the pieces
    are kept or dropped independently. Every schedule of the whole problem is one of the cut
    problem at the same cost (keep every piece of a kept interval), so the cut problem's flows
    (one per segment, each a lower bound on its segment) sum to a lower bound. Exact where no
    interval crosses a boundary; this cut is offsim's, in the spirit of PFOO's segments, and it
    is usually much tighter than :func:`average_lower_bound` on the zig-zags of training."""
    n = len(problem.room_bytes)
    if n == 0 or not problem.intervals:
        return problem.fixed_bytes
    seg = max(1, segment_points)
    pieces: list[list[Interval]] = [[] for _ in range((n + seg - 1) // seg)]
    for iv in problem.intervals:
        for j in range(iv.first // seg, iv.last // seg + 1):
            lo, hi = max(iv.first, j * seg), min(iv.last, (j + 1) * seg - 1)
            share = (hi - lo + 1) / iv.points
            pieces[j].append(Interval(iv.tensor, lo - j * seg, hi - j * seg, iv.size_bytes, iv.drop_bytes * share))
    total = problem.fixed_bytes
    for j, part in enumerate(pieces):
        if part:
            total += flow_lower_bound(Problem(tuple(part), problem.room_bytes[j * seg:(j + 1) * seg], 0.0))[0]
    return total


def segmented_schedule(problem: Problem, segment_points: int = SEGMENT_POINTS) -> list[int]:
    """PFOO-U (Berger et al., Sec. 5): a feasible schedule from flows over overlapping windows.

    Windows of ``segment_points`` points start every half window. In each, the undecided
    intervals that start there (cut at the window's end) get a min-cost flow over the room the
    schedule has not yet taken; the intervals starting in the window's first half (all of them
    in the last window) are then kept in decreasing kept fraction if they fit over their whole
    span, and are final. With one window it is the flow's rounding (FOO-U)."""
    ivs, n = problem.intervals, len(problem.room_bytes)
    seg = max(2, segment_points)
    half = seg // 2
    room = np.array(problem.room_bytes) * (1 + SLACK) + SLACK
    load = np.zeros(n)
    order = sorted(range(len(ivs)), key=lambda i: ivs[i].first)
    firsts = [ivs[i].first for i in order]
    kept: list[int] = []
    for s in range(0, n, half):
        e = min(n, s + seg)
        window = order[bisect_left(firsts, s):bisect_left(firsts, e)]
        part = tuple(Interval(ivs[i].tensor, ivs[i].first - s, min(ivs[i].last, e - 1) - s, ivs[i].size_bytes,
                              ivs[i].drop_bytes) for i in window)
        free = np.maximum(np.array(problem.room_bytes[s:e]) - load[s:e], 0.0)
        fraction = flow_lower_bound(Problem(part, tuple(free), 0.0))[1]
        decide = [k for k, i in enumerate(window) if ivs[i].first < s + half or e == n]
        for k in sorted(decide, key=lambda k: (-fraction[k], -ivs[window[k]].drop_bytes, window[k])):
            iv = ivs[window[k]]
            span = slice(iv.first, iv.last + 1)
            if np.all(load[span] + iv.size_bytes <= room[span]):
                load[span] += iv.size_bytes
                kept.append(window[k])
        if e == n:
            break
    return kept


# ---------------------------------------------------------------- both bounds
def bound(problem: Problem, schedules: Iterable[Iterable[int]] = (),
          max_flow_intervals: int | None = None, segment_points: int | None = None) -> CacheBound:
    """Lower and upper bound for ``problem``; ``schedules`` (kept intervals of schedules built
    elsewhere, e.g. a policy's replay) compete for the upper bound.

    Up to ``max_flow_intervals`` intervals (default :data:`MAX_FLOW_INTERVALS`, read at call
    time): FOO (the flow, and its rounding). Above: PFOO, the larger of the time-averaged bound
    (PFOO-L) and the flows over segments of ``segment_points`` points (default
    :data:`SEGMENT_POINTS`; :func:`split_lower_bound`) from below, PFOO-U
    (:func:`segmented_schedule`) from above."""
    max_flow_intervals = MAX_FLOW_INTERVALS if max_flow_intervals is None else max_flow_intervals
    segment_points = SEGMENT_POINTS if segment_points is None else segment_points
    t0 = time.perf_counter()
    candidates = [list(s) for s in schedules]
    candidates.append(round_schedule(problem, [iv.drop_bytes / (iv.size_bytes * iv.points)
                                               for iv in problem.intervals]))
    if len(problem.intervals) <= max_flow_intervals:
        lower, kept = flow_lower_bound(problem)
        candidates.append(round_schedule(problem, list(kept)))
        method = BoundMethod.FLOW
    else:
        lower = max(average_lower_bound(problem), split_lower_bound(problem, segment_points))
        candidates.append(segmented_schedule(problem, segment_points))
        method = BoundMethod.AVERAGE
    upper = min((problem.cost(s) for s in candidates if feasible(problem, s)), default=math.inf)
    if not math.isfinite(upper):
        upper = problem.cost(round_schedule(problem, [0.0] * len(problem.intervals)))
    return CacheBound(min(lower, upper), upper, method, time.perf_counter() - t0)


def kept_intervals(problem: Problem, hits: Sequence[bool], resident_at_end: Iterable[int] = ()) -> list[int]:
    """The intervals a replayed schedule kept: an interval ending at an access is kept when that
    access hit; a final interval when its tensor is resident at the end."""
    end = set(resident_at_end)
    n = len(hits)
    return [i for i, iv in enumerate(problem.intervals)
            if (iv.last + 1 < n and hits[iv.last + 1]) or (iv.last == n - 1 and iv.tensor in end)]
