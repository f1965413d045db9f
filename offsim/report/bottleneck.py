"""The bottleneck of a run in one sentence, from its spans alone.

Every moment of an iteration the GPU either computes or waits. For each stretch of waiting,
:func:`find_bottleneck` walks the critical path backwards from the moment the GPU resumed:

1. the span that *ended* at that moment released the GPU, so the time back to its start (or to
   the start of the wait) is charged to its resource and kind;
2. then the same question is asked at that span's start: which span ended there (its
   predecessor in the chain, e.g. the NVMe read before an H2D copy, or CPU Adam of one
   sub-group before its write-back), and so on until the start of the wait.

Ties go to the spans of the layer the GPU says it waits for (its ``gpu_stall`` span), then to the
earliest-started one. When nothing ended at that moment but something is moving, the longest-
running moving span is charged; when nothing moves at all the time is left unattributed.
Spans carry no dependencies, so this is a reconstruction, exact for the engine's sequential
chains (fetch then copy, update then write back) and a good guess for contended links.

Cost: each window is walked over the spans that overlap it. A run the steady-state shortcut
took holds the skipped iterations' spans as copies (:class:`~offsim.trace.RecordLog`); their
windows are copies too, and each takes the terms of the window it copies rather than being
walked (issue 16: the 50-iteration GPT-3 175B run's sentence took 1.09 s, now 0.12 s).
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from offsim.report.tracks import RESOURCE_LABELS, RESOURCES, kind_label, steady_windows
from offsim.results import RunResult
from offsim.trace import RecordLog, Span

#: Span ends within this many seconds of an instant count as ending at it.
TOLERANCE_S = 1e-9
_GPU = ("gpu", "gpu_stall")


@dataclass(frozen=True)
class Bottleneck:
    """Where the time of an average analysed iteration went.

    Attributes:
        iteration_s: mean length of the analysed iterations.
        gpu_busy_s: seconds per iteration the GPU computed.
        waits_s: seconds per iteration the GPU waited, charged to the ``(resource, kind)`` on
            the critical path; with ``gpu_busy_s`` and ``unattributed_s`` they sum to
            ``iteration_s``.
        unattributed_s: GPU idle with nothing moving (latencies, unrecorded waits).
        busy_s: seconds per iteration each resource had at least one span (whether or not it
            held the GPU up).
    """

    iteration_s: float
    gpu_busy_s: float
    waits_s: dict[tuple[str, str], float] = field(default_factory=dict)
    unattributed_s: float = 0.0
    busy_s: dict[str, float] = field(default_factory=dict)

    def share(self, seconds: float) -> float:
        """``seconds`` as a fraction of the iteration."""
        return seconds / self.iteration_s if self.iteration_s > 0 else 0.0

    def waits_by_resource(self) -> dict[str, float]:
        """GPU wait seconds per iteration per resource, largest first."""
        out: dict[str, float] = defaultdict(float)
        for (resource, _), secs in self.waits_s.items():
            out[resource] += secs
        return dict(sorted(out.items(), key=lambda kv: -kv[1]))

    @property
    def resource(self) -> str:
        """What held the iteration: ``gpu`` when the GPU computed at least as long as it waited,
        else the resource it waited on longest."""
        waits = self.waits_by_resource()
        if not waits or self.gpu_busy_s >= sum(waits.values()) + self.unattributed_s:
            return "gpu"
        return next(iter(waits))

    @property
    def sentence(self) -> str:
        """The bottleneck in one sentence."""
        waits = [(r, s) for r, s in self.waits_by_resource().items() if s > 0]
        pct = self._pct
        if self.resource == "gpu":
            text = (f"GPU compute is the bottleneck: it was busy {pct(self.gpu_busy_s)} of the iteration "
                    f"({_fmt_s(self.gpu_busy_s)} of {_fmt_s(self.iteration_s)})")
            if waits:
                text += f"; the longest wait was on {self._what(waits[0][0])}, {pct(waits[0][1])}"
            return text + "."
        (top, secs), rest = waits[0], waits[1:]
        text = (f"The GPU waited on {self._what(top)} for {pct(secs)} of the iteration "
                f"({_fmt_s(secs)} of {_fmt_s(self.iteration_s)})")
        if rest and self.share(rest[0][1]) >= 0.02:
            text += f"; on {self._what(rest[0][0])} for {pct(rest[0][1])}"
        return text + f"; GPU compute was busy {pct(self.gpu_busy_s)}."

    def _pct(self, seconds: float) -> str:
        return f"{100 * self.share(seconds):.0f}%"

    def _what(self, resource: str) -> str:
        """``PCIe H2D (parameter fetches)``: the resource and its main kinds of work."""
        kinds = sorted(((k, s) for (r, k), s in self.waits_s.items() if r == resource), key=lambda kv: -kv[1])
        total = sum(s for _, s in kinds)
        main = [kind_label(k) for k, s in kinds if s >= 0.25 * total][:2]
        label = RESOURCE_LABELS.get(resource, resource)
        return f"{label} ({' and '.join(main)})" if main else label


def _fmt_s(seconds: float) -> str:
    return f"{seconds * 1e3:.3g} ms" if seconds < 1 else f"{seconds:.3g} s"


class _Segments:
    """The timeline cut at every span boundary, with the spans active in each piece."""

    def __init__(self, spans: Sequence[Span], cuts: Iterable[float]) -> None:
        starts: dict[float, list[int]] = defaultdict(list)
        ends: dict[float, list[int]] = defaultdict(list)
        for i, s in enumerate(spans):
            starts[s.start_s].append(i)
            ends[s.end_s].append(i)
        times = sorted({*starts, *ends, *cuts})
        active: set[int] = set()
        self.start: list[float] = []
        self.end: list[float] = []
        self.active: list[tuple[int, ...]] = []
        for t0, t1 in itertools.pairwise(times):
            active.difference_update(ends.get(t0, ()))
            active.update(starts.get(t0, ()))
            self.start.append(t0)
            self.end.append(t1)
            self.active.append(tuple(sorted(active)))

    def before(self, t: float) -> int:
        """Index of the segment that ends at (or contains the instant just before) ``t``."""
        return bisect.bisect_left(self.start, t) - 1


@dataclass
class _Terms:
    """What one window adds to the averages, each term in the order the walk meets it (so that
    the sums over windows are the same floats whichever way the windows were found)."""

    busy: list[tuple[str, float]] = field(default_factory=list)
    waits: list[list[tuple[tuple[str, str], float]]] = field(default_factory=list)  # per idle stretch
    unattributed: list[float] = field(default_factory=list)  # per idle stretch


def find_bottleneck(spans: Iterable[Span], windows: Sequence[tuple[float, float]]) -> Bottleneck:
    """Analyse ``spans`` over ``windows`` (``(start_s, end_s)`` of the iterations to average).

    Pure: the result depends only on the spans' resources, kinds, layers and times. Each window
    is walked over the spans that overlap it. Spans held as a :class:`~offsim.trace.RecordLog`
    with repetitions the steady-state shortcut skipped are not all built: a window whose spans
    are those of a window already walked, moved on by whole periods, takes that window's terms
    (:func:`_log_terms`; issue 16).
    """
    windows = sorted(windows)
    n = max(1, len(windows))
    if isinstance(spans, RecordLog) and spans.repeats:
        terms = _log_terms(spans, windows)
    else:
        terms = _list_terms([s for s in spans if s.end_s > s.start_s], windows)
    busy: dict[str, float] = defaultdict(float)
    waits: dict[tuple[str, str], float] = defaultdict(float)
    unattributed = 0.0
    for t in terms:
        for resource, seconds in t.busy:
            busy[resource] += seconds
        for charged, left in zip(t.waits, t.unattributed, strict=True):
            for key, seconds in charged:
                waits[key] += seconds
            unattributed += left
    total = sum(b - a for a, b in windows)
    return Bottleneck(
        iteration_s=total / n,
        gpu_busy_s=busy.get("gpu", 0.0) / n,
        waits_s={k: v / n for k, v in sorted(waits.items(), key=lambda kv: -kv[1])},
        unattributed_s=unattributed / n,
        busy_s={r: busy[r] / n for r in RESOURCES if busy.get(r)},
    )


def _cuts(windows: Sequence[tuple[float, float]]) -> list[float]:
    return sorted(t for w in windows for t in w)


def _window_terms(spans: Sequence[Span], window: tuple[float, float], cuts: Sequence[float]) -> _Terms:
    """The terms of one window, from the spans that overlap it (in the order given) and the
    window boundaries ``cuts`` (all windows', sorted: those inside this one cut it too)."""
    a, b = window
    inside = cuts[bisect.bisect_left(cuts, a):bisect.bisect_right(cuts, b)]
    seg = _Segments(spans, inside)
    terms = _Terms()
    for start, end in _idle_intervals(spans, seg, a, b, terms.busy):
        charged: list[tuple[tuple[str, str], float]] = []
        terms.unattributed.append(_charge_wait(spans, seg, start, end, charged))
        terms.waits.append(charged)
    return terms


def _list_terms(spans: list[Span], windows: Sequence[tuple[float, float]]) -> list[_Terms]:
    """Each window's terms, over the spans that overlap it (in the order given)."""
    per_window: list[list[Span]] = [[] for _ in windows]
    starts = [w[0] for w in windows]
    ends = [w[1] for w in windows]
    disjoint = all(ends[k] <= starts[k + 1] for k in range(len(windows) - 1))
    for s in spans:
        if disjoint:  # the windows it overlaps are consecutive: from the first that ends after it starts
            k, last = bisect.bisect_right(ends, s.start_s), bisect.bisect_left(starts, s.end_s)
        else:
            k, last = 0, len(windows)
        for j in range(k, last):
            if starts[j] < s.end_s and ends[j] > s.start_s:
                per_window[j].append(s)
    cuts = _cuts(windows)
    return [_window_terms(ws, w, cuts) for ws, w in zip(per_window, windows, strict=True)]


#: two windows are copies when their spans are the same held records, each run shifted alike and
#: the windows moved by the same seconds to this relative tolerance (rounding, not drift)
_SHIFT_TOLERANCE = 1e-12

_Run = tuple[int, int, float, int]  # held records [first, last) shifted by seconds and iterations


def _log_terms(log: RecordLog[Span], windows: Sequence[tuple[float, float]]) -> list[_Terms]:
    """Each window's terms, walking only the windows that are not copies of one walked before.

    The log gives every span as runs of held records, each shifted by whole periods
    (:meth:`~offsim.trace.RecordLog.runs`). A window is walked over the spans of the runs that
    overlap it, built in the order a full walk meets them (so its terms are the ones a walk over
    every span gives); a later window whose overlapping runs are the same held records, their
    shifts and iterations moved on alike and the window moved with them, takes the terms of the
    first (they differ only in the rounding of the shifted times). Cost: the spans of the
    windows walked, not of every copy.
    """
    items = log.items
    extents: dict[tuple[int, int], tuple[float, float]] = {}
    runs: list[tuple[float, float, int, _Run]] = []  # extent, the run's place in a full walk, the run
    for order, run in enumerate(log.runs()):
        first, last, dt, _ = run
        ext = extents.get((first, last))
        if ext is None:
            kept = [s for s in items[first:last] if s.end_s > s.start_s]
            ext = extents[(first, last)] = ((min(s.start_s for s in kept), max(s.end_s for s in kept))
                                            if kept else (math.inf, -math.inf))
        if ext[0] < math.inf:
            runs.append((ext[0] + dt, ext[1] + dt, order, run))
    runs.sort(key=lambda r: r[0])
    run_starts = [r[0] for r in runs]
    longest = max((hi - lo for lo, hi, _, _ in runs), default=0.0)
    cuts = _cuts(windows)
    walked: dict[tuple[tuple[int, int, int], ...], list[tuple[tuple[float, float], list[float], _Terms]]] = {}
    out: list[_Terms] = []
    for a, b in windows:
        tol = _SHIFT_TOLERANCE * max(1.0, abs(a), abs(b))
        lo = bisect.bisect_left(run_starts, a - longest - tol)
        hi = bisect.bisect_left(run_starts, b + tol)
        near = sorted((r for r in runs[lo:hi] if r[0] < b + tol and r[1] > a - tol), key=lambda r: r[2])
        over = [r[3] for r in near]
        key = tuple((first, last, d_it - over[0][3]) for first, last, _, d_it in over)
        terms = _copy_of(walked.get(key, ()), a, b, [run[2] for run in over], tol)
        if terms is None:
            terms = _window_terms(_spans_of(log, over, a, b), (a, b), cuts)
            walked.setdefault(key, []).append(((a, b), [run[2] for run in over], terms))
        out.append(terms)
    return out


def _copy_of(candidates: Iterable[tuple[tuple[float, float], list[float], _Terms]], a: float, b: float,
             shifts: list[float], tol: float) -> _Terms | None:
    """The terms of a window walked before of which (a, b) is a copy (its runs' shifts and its
    bounds all moved by the same seconds), or None."""
    for (ra, rb), ref_shifts, terms in candidates:
        moved = a - ra
        if abs(b - rb - moved) <= tol and all(abs(s - r - moved) <= tol
                                              for s, r in zip(shifts, ref_shifts, strict=True)):
            return terms
    return None


def _spans_of(log: RecordLog[Span], over: list[_Run], a: float, b: float) -> list[Span]:
    """The spans of runs ``over`` (in order) that overlap (a, b), shifted."""
    out: list[Span] = []
    items, shift = log.items, log.shift
    for first, last, dt, d_it in over:
        for k in range(first, last):
            s = items[k]
            if dt or d_it:
                s = shift(s, dt, d_it)
            if s.end_s > s.start_s and s.start_s < b and s.end_s > a:
                out.append(s)
    return out


def _idle_intervals(spans: Sequence[Span], seg: _Segments, w_start: float, w_end: float,
                    busy: list[tuple[str, float]]) -> list[tuple[float, float]]:
    """Add each resource's busy time inside the window to ``busy`` (one term per resource and
    piece); return the GPU's idle stretches."""
    idle: list[tuple[float, float]] = []
    first = bisect.bisect_left(seg.start, w_start)
    for j in range(first, len(seg.start)):
        t0, t1 = seg.start[j], seg.end[j]
        if t0 >= w_end:
            break
        for resource in {spans[i].resource for i in seg.active[j]}:
            busy.append((resource, t1 - t0))
        if any(spans[i].resource == "gpu" for i in seg.active[j]):
            continue
        if idle and idle[-1][1] == t0:
            idle[-1] = (idle[-1][0], t1)
        else:
            idle.append((t0, t1))
    return idle


def _charge_wait(spans: Sequence[Span], seg: _Segments, a: float, b: float,
                 waits: list[tuple[tuple[str, str], float]]) -> float:
    """Walk back from ``b`` to ``a`` charging each piece to the span that held the GPU (a term
    of ``waits`` each); returns the unattributed seconds."""
    unattributed = 0.0
    t = b
    while t - a > TOLERANCE_S:
        j = seg.before(t)
        active = [spans[i] for i in seg.active[j]]
        movers = [s for s in active if s.resource not in _GPU]
        if not movers:
            t_prev = max(a, seg.start[j])
            unattributed += t - t_prev
            t = t_prev
            continue
        waited_for = {(s.iteration, s.layer) for s in active if s.resource == "gpu_stall" and s.layer >= 0}
        pick = _holder(movers, t, waited_for)
        t_prev = max(a, pick.start_s)
        waits.append(((pick.resource, pick.kind), t - t_prev))
        t = t_prev
    return unattributed


def _holder(movers: list[Span], t: float, waited_for: set[tuple[int, int]]) -> Span:
    """The span that released whatever started at ``t``."""
    ending = [s for s in movers if abs(s.end_s - t) <= TOLERANCE_S]
    pool = ending or movers
    pool = [s for s in pool if (s.iteration, s.layer) in waited_for] or pool
    if ending:
        return min(pool, key=lambda s: (s.start_s, _order(s.resource)))
    return max(pool, key=lambda s: (s.end_s - s.start_s, -_order(s.resource)))


def _order(resource: str) -> int:
    return RESOURCES.index(resource) if resource in RESOURCES else len(RESOURCES)


def bottleneck(result: RunResult) -> Bottleneck:
    """:func:`find_bottleneck` over the run's steady-state iterations."""
    windows = [(start, end) for _, start, end in steady_windows(result)]
    return find_bottleneck(result.recorder.spans, windows)
