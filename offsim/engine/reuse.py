"""Runs an earlier run answers: the executor's inputs compared, the records handed out again.

The executor is a pure function of what it is given: the schedule, the machine, the caches'
policies and what :func:`~offsim.systems._policies.run_policies` wrote in the recorder before the
run. A sweep's points often differ only in what the run never reads (the DRAM size of a strategy
that holds nothing in DRAM beyond what fits, the NVMe drives of one that never touches NVMe): the
configurations differ, but the schedules, machines and policies they compile to are equal, and so
are their runs. Inside :func:`reusing` (or after :func:`enable`, as a sweep's workers do), an
:class:`~offsim.engine.execute.Executor` looks its inputs up in a :class:`RunMemo` and, when an
earlier run had the same, hands out that run's records, peaks and event count instead of running
(issue 16): the metrics computed from them are the ones a run gives, to the last bit.

What is compared, exactly (``==``): the schedule's body, streams, pools, caches and unit names
(its :attr:`~offsim.schedule.ops.Schedule.fingerprint`, hashed once per schedule);
the machine's resource capacities, duplex efficiency, copy engines, ranks and nodes, and the GPU's
memory (the prefetch policies read how much of it is free); the policies' types and attributes;
the recorder's cache descriptions; the shortcut switch. The host, NVMe and PFS capacities are not
compared: they only decide whether a level overflows, so a run is handed out only to a machine its
peaks fit, and is simulated (to fail the same way as ever) otherwise. A schedule with run-time
choices, a policy of an unknown kind, a progress callback or a recorder with records in it is
never reused. Only runs that finished are kept, those used last, within a budget of records.

A memo also shares compiles (:meth:`RunMemo.compiled`): equal compositions compile to one
schedule object, which the run look-up then finds by identity.
"""

from __future__ import annotations

import dataclasses
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any

from offsim.schedule.ops import Fingerprint, Schedule
from offsim.trace import CacheEvent, LevelSample, RecordLog, Span

if TYPE_CHECKING:
    from offsim.engine.execute import Executor

#: the inputs of a run (or of a compilation), with their hash worked out once
_Key = Fingerprint

#: the reported tiers whose capacity a run only checks levels against (the GPU's is an input)
CHECKED_TIERS = ("host_pinned", "host", "nvme", "pfs")
#: what a memo keeps unless told otherwise, in records held and template ops (about 250 bytes
#: each: some 300 MB; a 7B run of three iterations is 3,000 to 5,000 of them). A sweep's points
#: whose runs are equal lie a few hundred points apart in grid order: the 10,000-point 7B grid of
#: ``benchmarks/sweep_throughput.py`` (8,056 points simulated, 766 distinct runs) on two workers
#: reuses no run when each keeps 64 runs, 79% of the points when each keeps 128 and 84% from 256 on
DEFAULT_BUDGET = 1_200_000

#: compiled schedules a memo keeps, those used last (a 7B schedule is some 3,000 ops; the runs
#: kept hold theirs anyway)
SCHEDULES_KEPT = 256

#: the memo of the block of :func:`reusing` the caller is in (per thread: contexts do not leak)
_ACTIVE: ContextVar[RunMemo | None] = ContextVar("offsim_run_memo", default=None)
#: the memo of a process given over to a sweep (:func:`enable`), where no block says otherwise
_PROCESS: RunMemo | None = None


class _OpaqueError(Exception):
    """An input the memo cannot compare by value: the run is not reused."""


@dataclass
class _Done:
    """What a finished run leaves for its caller: the records, peaks and events."""

    spans: RecordLog[Span]
    cache_events: RecordLog[CacheEvent]
    level_log: RecordLog[LevelSample]
    iteration_starts_s: list[float]
    phases: list[tuple[int, str, float, float]]
    end_s: float
    cache_info: dict[str, dict[str, Any]]
    peaks: dict[str, float]
    owner_peaks: dict[Any, dict[str, int]]  # per mechanism (Memory.owner_peak_bytes)
    events: int
    iterations: int
    weight: int  # records held and template ops: what keeping it costs
    key: _Key  # the key it is kept under (found again by identity, not compared anew)


class RunMemo:
    """The runs last used, by their inputs, as many as ``budget`` records and template ops hold;
    ``hits`` and ``misses`` count the look-ups."""

    def __init__(self, budget: int = DEFAULT_BUDGET) -> None:
        self.budget = budget
        self.runs: OrderedDict[_Key, _Done] = OrderedDict()
        self.held = 0
        self.hits = 0
        self.misses = 0
        self.schedules: OrderedDict[_Key, Schedule] = OrderedDict()
        self.compiles_saved = 0
        self._lock = threading.Lock()  # a Dask worker may run chunks in several threads

    def key(self, ex: Executor, steady_shortcut: bool, layer_shortcut: bool = False) -> _Key | None:
        """The inputs of ``ex``'s run, or None where they cannot be compared."""
        s, m, rec = ex.schedule, ex.machine, ex.rec
        if s.choices or ex.choice_policies or ex.on_iteration is not None:
            return None
        if rec.spans or rec.cache_events or rec.level_log or rec.iteration_starts_s or rec.phases:
            return None
        try:
            parts = (steady_shortcut, layer_shortcut, s.fingerprint,
                     tuple(m.capacity.items()), m.duplex_efficiency, m.copy_engines, m.ranks_per_node, m.nodes,
                     tuple((t, c) for t, c in m.memory_bytes.items() if t not in CHECKED_TIERS),
                     _value(ex.cache_policies), _value(rec.cache_info))
            return _Key(parts)
        except (_OpaqueError, TypeError):  # TypeError: something unhashable in the schedule
            return None

    def compiled(self, system: object, compile_system: Callable[[Any], Schedule]) -> Schedule:
        """``compile_system(system)``, or the schedule an equal composition compiled to (the
        same object: its :attr:`~offsim.schedule.ops.Schedule.fingerprint` is then worked out
        once and compared by identity). A composition is a value (its mechanisms are frozen
        dataclasses that emit ops from their fields alone, :mod:`offsim.mechanisms.base`), so
        compositions equal field by field compile to equal schedules; sweep points that differ
        only in what no mechanism reads (the DRAM size, the NVMe drives of a strategy that never
        touches NVMe...) share one compile (issue 16). Compositions that differ only in what no op
        shows compile to equal schedules: the one kept is handed out, so that the look-ups of runs
        and bounds compare it by identity, not op by op. One that holds anything else (a
        callback, an object of an unknown kind) is compiled every time."""
        try:
            key = _Key((_value(system),))
        except (_OpaqueError, TypeError):
            return compile_system(system)
        with self._lock:
            schedule = self.schedules.get(key)
            if schedule is not None:
                self.schedules.move_to_end(key)
                self.compiles_saved += 1
                return schedule
        schedule = compile_system(system)
        with self._lock:  # one object per schedule: an equal one compiled from another composition
            schedule = next((s for s in self.schedules.values() if s.fingerprint == schedule.fingerprint), schedule)
            self.schedules[key] = schedule
            while len(self.schedules) > SCHEDULES_KEPT:
                self.schedules.popitem(last=False)
        return schedule

    def restore(self, key: _Key, ex: Executor) -> bool:
        """Give ``ex`` the records of the run with inputs ``key`` if one is kept and its peaks
        fit ``ex``'s machine; False (and nothing changed) otherwise."""
        capacity = ex.machine.memory_bytes
        with self._lock:
            done = self.runs.get(key)
            if done is None or any(done.peaks.get(t, 0.0) > capacity[t] * (1 + 1e-9)
                                   for t in CHECKED_TIERS if t in capacity):
                self.misses += 1
                return False
            self.hits += 1
            self.runs.move_to_end(done.key)
        rec = ex.rec
        rec.spans, rec.cache_events, rec.level_log = done.spans, done.cache_events, done.level_log
        rec.iteration_starts_s[:] = done.iteration_starts_s
        rec.phases[:] = done.phases
        rec.end_s = done.end_s
        for cache, info in done.cache_info.items():
            rec.cache_info[cache] = dict(info)
        ex.memory.peak_bytes = dict(done.peaks)
        ex.memory.owner_peak_bytes = {o: dict(p) for o, p in done.owner_peaks.items()}
        ex.events, ex.end_s, ex.iterations = done.events, done.end_s, done.iterations
        return True

    def store(self, key: _Key, ex: Executor) -> None:
        """Keep the finished run of ``ex`` under ``key`` (forgetting those used longest ago
        beyond the budget)."""
        rec = ex.rec
        weight = (len(rec.spans.items) + len(rec.cache_events.items) + len(rec.level_log.items)
                  + sum(len(b.ops) for b in ex.schedule.blocks()))
        done = _Done(rec.spans, rec.cache_events, rec.level_log, list(rec.iteration_starts_s), list(rec.phases),
                     rec.end_s, {c: dict(i) for c, i in rec.cache_info.items()}, dict(ex.memory.peak_bytes),
                     {o: dict(p) for o, p in ex.memory.owner_peak_bytes.items()}, ex.events, ex.iterations, weight, key)
        with self._lock:
            old = self.runs.pop(key, None)
            if old is not None:
                self.held -= old.weight
            self.runs[key] = done
            self.held += weight
            while self.held > self.budget and len(self.runs) > 1:
                self.held -= self.runs.popitem(last=False)[1].weight


#: modules of frozen dataclasses that hold only numbers, enums, strings, ops and each other
_AS_THEY_HASH = ("offsim.schedule.ops", "offsim.mechanisms.")


def _value(x: Any) -> Any:
    """``x`` as a hashable value that equals another's exactly when they are the same inputs:
    plain values as they are, containers element by element (with their kind), the ops and the
    mechanisms as they are where they hash (their own ``==`` compares their fields; a policy
    object in a field would hash and compare by identity, so a dataclass that holds one, such as a
    cache's policy, is taken field by field), other dataclasses and the
    policies of :mod:`offsim.policies` by type and attributes; raises :class:`_OpaqueError` for
    anything else (a callback, an object of an unknown kind)."""
    if x is None or isinstance(x, bool | int | float | str | Enum):
        return x
    if isinstance(x, tuple | list):
        return (type(x).__name__, *(_value(v) for v in x))
    if isinstance(x, frozenset | set):
        return ("set", frozenset(_value(v) for v in x))
    if isinstance(x, dict):
        return ("dict", *((_value(k), _value(v)) for k, v in x.items()))
    kind = type(x)
    if dataclasses.is_dataclass(x) and kind.__module__.startswith("offsim."):
        if kind.__module__.startswith(_AS_THEY_HASH):  # frozen numbers and ops: as they are where they hash
            try:  # (compared by their generated __eq__, field by field)
                hash(x)
                return x
            except TypeError:  # a field is a dict (a cache's units and programs, a composition's mechanisms)
                pass
        return (kind, *(_value(getattr(x, f.name)) for f in dataclasses.fields(x)))
    if kind.__module__.startswith("offsim.policies."):
        attrs = dict(vars(x)) if hasattr(x, "__dict__") else {}
        for name in getattr(kind, "__slots__", ()):
            attrs[name] = getattr(x, name)
        return (kind, _value(attrs))
    raise _OpaqueError(f"cannot compare a {kind.__name__}")


def active() -> RunMemo | None:
    """The memo runs look up now (None: every run is simulated)."""
    memo = _ACTIVE.get()
    return memo if memo is not None else _PROCESS


def enable(budget: int = DEFAULT_BUDGET) -> RunMemo:
    """Reuse runs in this whole process from now on (a sweep's pool worker, which runs nothing
    else); returns the memo (the one already enabled, if any)."""
    global _PROCESS  # one memo per worker process, like the worker's payload
    if _PROCESS is None:
        _PROCESS = RunMemo(budget)
    return _PROCESS


@contextmanager
def reusing(memo: RunMemo | None = None) -> Iterator[RunMemo]:
    """Reuse runs inside the block (in this thread), from ``memo`` (None: the one active, or a
    new one)."""
    use = memo if memo is not None else active() or RunMemo()
    token = _ACTIVE.set(use)
    try:
        yield use
    finally:
        _ACTIVE.reset(token)
