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
"""

from __future__ import annotations

import bisect
import itertools
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from offsim.report.tracks import RESOURCE_LABELS, RESOURCES, kind_label, steady_windows
from offsim.results import RunResult
from offsim.trace import Span

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


def find_bottleneck(spans: Iterable[Span], windows: Sequence[tuple[float, float]]) -> Bottleneck:
    """Analyse ``spans`` over ``windows`` (``(start_s, end_s)`` of the iterations to average).

    Pure: the result depends only on the spans' resources, kinds, layers and times.
    """
    spans = [s for s in spans if s.end_s > s.start_s]
    windows = sorted(windows)
    n = max(1, len(windows))
    seg = _Segments(spans, [t for w in windows for t in w])
    busy: dict[str, float] = defaultdict(float)
    waits: dict[tuple[str, str], float] = defaultdict(float)
    unattributed = 0.0
    for w_start, w_end in windows:
        for a, b in _idle_intervals(spans, seg, w_start, w_end, busy):
            unattributed += _charge_wait(spans, seg, a, b, waits)
    total = sum(b - a for a, b in windows)
    return Bottleneck(
        iteration_s=total / n,
        gpu_busy_s=busy.get("gpu", 0.0) / n,
        waits_s={k: v / n for k, v in sorted(waits.items(), key=lambda kv: -kv[1])},
        unattributed_s=unattributed / n,
        busy_s={r: busy[r] / n for r in RESOURCES if busy.get(r)},
    )


def _idle_intervals(spans: Sequence[Span], seg: _Segments, w_start: float, w_end: float,
                    busy: dict[str, float]) -> list[tuple[float, float]]:
    """Add each resource's busy time inside the window to ``busy``; return the GPU's idle stretches."""
    idle: list[tuple[float, float]] = []
    first = bisect.bisect_left(seg.start, w_start)
    for j in range(first, len(seg.start)):
        t0, t1 = seg.start[j], seg.end[j]
        if t0 >= w_end:
            break
        for resource in {spans[i].resource for i in seg.active[j]}:
            busy[resource] += t1 - t0
        if any(spans[i].resource == "gpu" for i in seg.active[j]):
            continue
        if idle and idle[-1][1] == t0:
            idle[-1] = (idle[-1][0], t1)
        else:
            idle.append((t0, t1))
    return idle


def _charge_wait(spans: Sequence[Span], seg: _Segments, a: float, b: float,
                 waits: dict[tuple[str, str], float]) -> float:
    """Walk back from ``b`` to ``a`` charging each piece to the span that held the GPU; returns
    the unattributed seconds."""
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
        waits[(pick.resource, pick.kind)] += t - t_prev
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
