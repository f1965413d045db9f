"""Records the engine emits: spans (something busy on a resource) and memory level samples.

The engine writes to a :class:`Recorder`; sweeps that need only metrics still use one (spans are
how the metrics are computed) but skip the DataFrame conversion.

Records are kept in :class:`RecordLog` s. When the engine skips repetitions of a period that left
the run in the state it found it (the steady-state shortcut, :mod:`offsim.engine.steady`), the log
keeps the records of the period once and a :class:`Repeat` that stands for its copies: memory
stays bounded by the periods simulated, iterating the log still gives every record, in the order
a full simulation records them, and :meth:`RecordLog.window` gives only the records simulated (for
a trace or a report).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, TypeVar, overload

from offsim.schedule.fast_init import fast_init

if TYPE_CHECKING:  # pandas is imported where a frame is built, not by every run (issue 16)
    import pandas as pd

SPAN_COLUMNS = ["iteration", "phase", "resource", "kind", "name", "layer", "start_s", "end_s", "bytes"]
LEVEL_COLUMNS = ["t_s", "tier", "bytes"]


@fast_init
@dataclass(frozen=True, slots=True)
class Span:
    """One interval of activity.

    Attributes:
        iteration: optimizer step it belongs to.
        phase: ``forward``, ``backward`` or ``optimizer``.
        resource: the track it lies on (``gpu``, ``h2d``, ``d2h``, ``nvme_read``, ``nvme_write``,
            ``cpu``, ``dram_copy``, ``gpu_link``, ``gpu_stall``).
        kind: what it is (``compute``, ``recompute``, ``param_fetch``, ``grad_offload``, ...).
        name: a readable label, e.g. ``block3 params``.
        layer: layer index, or -1 when not tied to one layer (optimizer sub-groups use -1).
        bytes: bytes moved (0 for compute).
    """

    iteration: int
    phase: str
    resource: str
    kind: str
    name: str
    layer: int
    start_s: float
    end_s: float
    bytes: float = 0.0


@fast_init
@dataclass(frozen=True, slots=True)
class LevelSample:
    """Bytes resident in ``tier`` from ``t_s`` on (per GPU for gpu; per node for host and nvme)."""

    t_s: float
    tier: str
    bytes: float


@fast_init
@dataclass(frozen=True, slots=True)
class CacheEvent:
    """One event of a policy-managed cache (``gpu_params``, ``dram_optimizer``).

    Attributes:
        iteration: optimizer step it belongs to.
        cache: the cache.
        kind: ``hit``, ``miss`` (fetched), ``evict`` (dropped for room), ``release`` (dropped
            after use), ``writeback`` (a dirty victim written to the tier below), ``stall``
            (the consumer waited for this cache's data).
        tensor: layer or sub-group index (-1 for a stall).
        bytes: the tensor's bytes (hit, miss, evict, release, writeback).
        seconds: the wait (stall).
    """

    iteration: int
    cache: str
    kind: str
    tensor: int
    bytes: float = 0.0
    seconds: float = 0.0


T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Mark:
    """A point of a :class:`RecordLog`: records and repeats held before it."""

    items: int
    repeats: int


@dataclass(frozen=True, slots=True)
class Repeat:
    """``times`` copies of the records between two marks, the copy ``j`` (1 to ``times``) shifted
    by ``j * dt_s`` seconds and ``j * d_iteration`` iterations, standing at item ``at``.

    Attributes:
        at: where the copies stand among the items held (they follow the item before ``at``).
        start / end: the template's marks (its items and the repeats inside it).
        times: copies.
        dt_s: the period, seconds.
        d_iteration: iterations per period (0: the period is a micro-batch).
    """

    at: Mark
    start: Mark
    end: Mark
    times: int
    dt_s: float
    d_iteration: int


class RecordLog(Sequence[T]):
    """Records in the order recorded, some held once for many copies (:class:`Repeat`).

    Iterating, ``len``, indexing and ``==`` see every record (a copy is built when it is read;
    indexing builds them all once); :meth:`window` sees only those held. ``shift(record, dt_s,
    d_iteration)`` builds a copy.
    """

    def __init__(self, shift: Callable[[T, float, int], T], items: list[T] | None = None) -> None:
        self.items: list[T] = items if items is not None else []
        self.repeats: list[Repeat] = []
        self.shift = shift
        self._expanded: tuple[Mark, list[T]] | None = None
        self._derived: dict[str, tuple[Mark, object]] = {}

    def append(self, item: T) -> None:
        """Record one item."""
        self.items.append(item)

    def mark(self) -> Mark:
        """The point reached."""
        return Mark(len(self.items), len(self.repeats))

    def repeat(self, start: Mark, times: int, dt_s: float, d_iteration: int) -> None:
        """The records since ``start`` repeat ``times`` more times, here."""
        if times > 0:
            self.repeats.append(Repeat(self.mark(), start, self.mark(), times, dt_s, d_iteration))

    def window(self) -> list[T]:
        """The records held (those simulated), in order."""
        return self.items

    def runs(self) -> Iterator[tuple[int, int, float, int]]:
        """Every record, in the order :meth:`__iter__` gives them, as runs of held items
        ``(first, last, seconds, iterations)``: ``items[first:last]``, each shifted by ``seconds``
        and ``iterations`` (0 and 0 where held as recorded); for sums and sequences that need not
        build every copy (one run per copy of a repeat and per stretch between repeats)."""
        return self._segments(Mark(0, 0), self.mark(), 0.0, 0)

    def derived(self, key: str, build: Callable[[RecordLog[T]], object]) -> object:
        """``build(self)``, kept under ``key`` until more is recorded (for readers that index
        the records once for several questions)."""
        mark = self.mark()
        held = self._derived.get(key)
        if held is None or held[0] != mark:
            held = self._derived[key] = (mark, build(self))
        return held[1]

    def _segments(self, start: Mark, end: Mark, dt_s: float,
                  d_iteration: int) -> Iterator[tuple[int, int, float, int]]:
        """The records from ``start`` to ``end``, shifted, as runs of held items: (first, last,
        seconds, iterations)."""
        item = start.items
        for r in range(start.repeats, end.repeats):
            rep = self.repeats[r]
            if rep.at.items > item:
                yield item, rep.at.items, dt_s, d_iteration
            item = rep.at.items
            for j in range(1, rep.times + 1):
                yield from self._segments(rep.start, rep.end, dt_s + j * rep.dt_s, d_iteration + j * rep.d_iteration)
        if end.items > item:
            yield item, end.items, dt_s, d_iteration

    def __iter__(self) -> Iterator[T]:
        items, shift = self.items, self.shift
        if not self.repeats:
            yield from items
            return
        for first, last, dt_s, d_iteration in self._segments(Mark(0, 0), self.mark(), 0.0, 0):
            if dt_s == 0.0 and d_iteration == 0:
                yield from items[first:last]
            else:
                for k in range(first, last):
                    yield shift(items[k], dt_s, d_iteration)

    def weighted(self) -> Iterator[tuple[T, tuple[Repeat, ...]]]:
        """Each record held, with the repeats whose template holds it (outermost last): its
        copies are the sums of a multiple (0 to ``times``) of each one's shift
        (:func:`copy_offsets`), for sums that need not build every copy."""
        spans = [(rep.start.items, rep.end.items, rep) for rep in self.repeats]
        for k, item in enumerate(self.items):
            yield item, tuple(rep for first, last, rep in spans if first <= k < last)

    def __len__(self) -> int:
        return len(self.items) + sum(self._copies(r) for r in range(len(self.repeats)))

    def _copies(self, r: int) -> int:
        """Records the copies of repeat ``r`` add."""
        rep = self.repeats[r]
        inner = sum(self._copies(q) for q in range(rep.start.repeats, rep.end.repeats))
        return rep.times * (rep.end.items - rep.start.items + inner)

    def __bool__(self) -> bool:
        return bool(self.items)

    @overload
    def __getitem__(self, index: int) -> T: ...

    @overload
    def __getitem__(self, index: slice) -> list[T]: ...

    def __getitem__(self, index: int | slice) -> T | list[T]:
        if not self.repeats:
            return self.items[index]
        return self._every()[index]

    def _every(self) -> list[T]:
        """Every record as a list, built once for indexing (until more is recorded)."""
        mark = self.mark()
        if self._expanded is None or self._expanded[0] != mark:
            self._expanded = (mark, list(self))
        return self._expanded[1]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, RecordLog | list):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # mutable

    def __repr__(self) -> str:
        return f"RecordLog({len(self.items)} held, {len(self.repeats)} repeats)"


def copy_offsets(chain: tuple[Repeat, ...]) -> dict[int, tuple[int, float, float]]:
    """Per iteration shift, the copies a record of ``chain`` (:meth:`RecordLog.weighted`) has
    there (itself included) and the least and most seconds they are shifted by."""
    out: dict[int, tuple[int, float, float]] = {0: (1, 0.0, 0.0)}
    for rep in chain:
        new: dict[int, tuple[int, float, float]] = {}
        steps = [(0, 0)] if rep.d_iteration == 0 else [(j, j * rep.d_iteration) for j in range(rep.times + 1)]
        for d, (count, low_s, high_s) in out.items():
            for j, di in steps:
                n = count * (rep.times + 1) if rep.d_iteration == 0 else count
                lo = low_s + j * rep.dt_s
                hi = high_s + (rep.times if rep.d_iteration == 0 else j) * rep.dt_s
                c0, l0, h0 = new.get(d + di, (0, lo, hi))
                new[d + di] = (c0 + n, min(l0, lo), max(h0, hi))
        out = new
    return out


def _shift_span(s: Span, dt_s: float, d_iteration: int) -> Span:
    return Span(s.iteration + d_iteration, s.phase, s.resource, s.kind, s.name, s.layer, s.start_s + dt_s,
                s.end_s + dt_s, s.bytes)


def _shift_level(s: LevelSample, dt_s: float, d_iteration: int) -> LevelSample:
    return LevelSample(s.t_s + dt_s, s.tier, s.bytes)


def _shift_cache(e: CacheEvent, dt_s: float, d_iteration: int) -> CacheEvent:
    return CacheEvent(e.iteration + d_iteration, e.cache, e.kind, e.tensor, e.bytes, e.seconds)


def _shift_phase(p: tuple[int, str, float, float], dt_s: float, d_iteration: int) -> tuple[int, str, float, float]:
    return (p[0] + d_iteration, p[1], p[2] + dt_s, p[3] + dt_s)


@dataclass
class Recorder:
    """Collects spans, level samples, cache events and iteration boundaries.

    Each kind of record is a :class:`RecordLog`; :meth:`mark` and :meth:`repeat` act on all of
    them at once (the steady-state shortcut). ``phases`` are the per-micro-batch phases of the
    stream that records stalls, ``(iteration, phase, start_s, end_s)``.
    """

    spans: RecordLog[Span] = field(default_factory=lambda: RecordLog(_shift_span))
    iteration_starts_s: list[float] = field(default_factory=list)
    phases: list[tuple[int, str, float, float]] = field(default_factory=list)
    end_s: float = 0.0
    cache_events: RecordLog[CacheEvent] = field(default_factory=lambda: RecordLog(_shift_cache))
    cache_info: dict[str, dict] = field(default_factory=dict)
    level_log: RecordLog[LevelSample] = field(default_factory=lambda: RecordLog(_shift_level), repr=False)

    @property
    def levels(self) -> RecordLog[LevelSample]:
        """The level samples in the order recorded."""
        return self.level_log

    def cache(self, event: CacheEvent) -> None:
        """Record one cache event."""
        self.cache_events.append(event)

    def phase(self, iteration: int, name: str, start_s: float, end_s: float) -> None:
        """Record that the main process spent ``[start_s, end_s]`` of ``iteration`` in phase ``name``."""
        self.phases.append((iteration, name, start_s, end_s))

    def span(self, span: Span) -> None:
        """Record one span."""
        self.spans.append(span)

    def level(self, t_s: float, tier: str, nbytes: float) -> None:
        """Record that ``tier`` holds ``nbytes`` from ``t_s`` (seconds) on."""
        self.level_log.append(LevelSample(t_s, tier, nbytes))

    def mark(self) -> tuple[Mark, Mark, Mark]:
        """The point reached in the spans, cache events and levels."""
        return self.spans.mark(), self.cache_events.mark(), self.level_log.mark()

    def repeat(self, start: tuple[Mark, Mark, Mark], times: int, dt_s: float, d_iteration: int) -> None:
        """What was recorded since ``start`` repeats ``times`` more times (each ``dt_s`` later
        and ``d_iteration`` iterations on)."""
        self.spans.repeat(start[0], times, dt_s, d_iteration)
        self.cache_events.repeat(start[1], times, dt_s, d_iteration)
        self.level_log.repeat(start[2], times, dt_s, d_iteration)

    def spans_frame(self, window: bool = False) -> pd.DataFrame:
        """Spans as a DataFrame with :data:`SPAN_COLUMNS`; ``window``: only those simulated (the
        repetitions the steady-state shortcut skipped left out), for a trace or a report."""
        import pandas as pd

        spans = self.spans.window() if window else self.spans
        return pd.DataFrame([asdict(s) for s in spans], columns=SPAN_COLUMNS)

    def levels_frame(self, window: bool = False) -> pd.DataFrame:
        """Level samples as a DataFrame with :data:`LEVEL_COLUMNS`; ``window`` as for spans."""
        import pandas as pd

        levels = self.level_log.window() if window else list(self.level_log)
        return pd.DataFrame({"t_s": [lv.t_s for lv in levels], "tier": [lv.tier for lv in levels],
                             "bytes": [lv.bytes for lv in levels]}, columns=LEVEL_COLUMNS)
