"""The steady-state shortcut (issue 16): skip the repetitions of a period that repeats exactly.

The executor is deterministic: what it does from a point on depends only on its state there and
on the ops still to issue. At the start of each repetition (after the first) of a
:class:`~offsim.schedule.ops.Repeat` (an iteration, or a micro-batch of gradient accumulation),
once the clock's step that began it has run, :class:`SteadyState` takes a :class:`Snapshot` of the
whole state, relative to that moment: the calls queued (when, relative to now, and what each
will call), every op instance not finished (its op, its iteration and micro-batch relative to
the repetition, who waits for it, when it started), the flows in progress with their bytes left,
the pools and queues, the memory held (tensors keyed by their micro-batch relative to the
repetition), the last writer of each tensor still being written, the caches (residents, pins,
positions relative to the repetition's first access) and the program counter. The ops a
repetition issues are the same template objects in every repetition, so when the snapshot equals
the previous repetition's (times to rounding, :data:`TIME_TOLERANCE`), every later repetition
repeats it exactly, shifted by the period, and the shortcut moves the state on by whole periods
and records the skipped repetitions as copies of the last one (:meth:`offsim.trace.Recorder.repeat`).

It takes the shortcut only where that is provable, and simulates otherwise:

* something in the state it does not know how to compare (a callback or an object of an unknown
  kind) makes the snapshot opaque, and opaque never matches;
* a choice policy that decided during the period (it sees the iteration number and the step's
  observed time), or an eviction or prefetch policy not in :mod:`offsim.policies` (a policy
  reviewed to decide from positions relative to the current one and from what lies at most its
  horizon ahead), blocks it;
* the repetitions left at the end are simulated, as many as a prefetch policy's horizon reaches
  (at least the last), so what a policy reads ahead of a skipped repetition is periodic.
"""

from __future__ import annotations

import heapq
import math
import types
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any

from offsim.engine.cache import Cache
from offsim.engine.cursor import Frame
from offsim.engine.flows import Flow as NetFlow
from offsim.engine.flows import WakeToken
from offsim.engine.hooks import FetchTracker, PolicyCache
from offsim.engine.node import Node
from offsim.engine.slots import Ask, Pool, Slots
from offsim.schedule.ops import Access, TensorRef

if TYPE_CHECKING:
    from offsim.engine.execute import Executor

#: two snapshots match when their times (relative to their repetition's start) differ by at most
#: this times the larger of the start and the period: rounding of times of that size, not drift
TIME_TOLERANCE = 1e-13
#: other floats (bytes left of a flow, bytes held by a cache) match to this, relative
VALUE_TOLERANCE = 1e-12


class OpaqueStateError(Exception):
    """The state holds something a snapshot cannot compare: no shortcut."""


@dataclass
class Snapshot:
    """The state at a repetition's start, relative to it.

    Attributes:
        shape: everything discrete (ops, counts, who waits for whom), and floats that are constants.
        times_s: times relative to the repetition's start, in the order met.
        values: other floats that change as the run goes (bytes left, bytes held).
        nodes: the op instances met that have not finished (to move them on).
    """

    shape: tuple[Any, ...]
    times_s: list[float]
    values: list[float]
    nodes: list[Node]

    def matches(self, other: Snapshot, scale_s: float) -> bool:
        """Equal shapes, times within :data:`TIME_TOLERANCE` x ``scale_s``, values to :data:`VALUE_TOLERANCE`."""
        if self.shape != other.shape or len(self.times_s) != len(other.times_s):
            return False
        if len(self.values) != len(other.values):
            return False
        tol_s = TIME_TOLERANCE * scale_s
        for a, b in zip(self.times_s, other.times_s, strict=True):
            if not (a == b or abs(a - b) <= tol_s):
                return False
        return all(a == b or abs(a - b) <= VALUE_TOLERANCE * max(abs(a), abs(b))
                   for a, b in zip(self.values, other.values, strict=True))


@dataclass
class _Seen:
    """What :class:`SteadyState` keeps of a repetition's start."""

    frame: Frame
    k: int
    snapshot: Snapshot
    now_s: float
    mark: Any
    events: int
    accesses: dict[str, int]
    choices: int


class SteadyState:
    """Watches the starts of repetitions and takes the shortcut where a period repeats."""

    def __init__(self, executor: Executor) -> None:
        self.ex = executor
        self.seen: dict[int, _Seen] = {}
        self.regions: dict[int, tuple[Frame, dict[str, int]]] = {}  # per frame, where its repeat began
        self.skipped = 0  # repetitions skipped, for tests and benchmarks

    def entered(self, frame: Frame) -> None:
        """A repeat is entered: note where its accesses begin in each cache's sequence (a position
        before is fixed, one after moves on with the repetitions)."""
        self.regions[id(frame)] = (frame, _accesses(self.ex, frame))

    def at_boundary(self, frame: Frame) -> None:
        """``frame`` has just begun a repetition: compare, and skip what repeats."""
        ex = self.ex
        live = {id(f) for f in ex.cursor.frames}
        self.seen = {key: s for key, s in self.seen.items() if key in live}
        self.regions = {key: r for key, r in self.regions.items() if key in live}
        region = self.regions.get(id(frame))
        if region is None or region[0] is not frame:
            return
        try:
            snap = take_snapshot(ex, frame, region[1])
        except OpaqueStateError:
            self.seen.pop(id(frame), None)
            return
        now = _Seen(frame, frame.k, snap, ex.clock.now_s, ex.rec.mark(), ex.events, _accesses(ex, frame),
                    ex.choices_taken)
        prev = self.seen.get(id(frame))
        self.seen[id(frame)] = now
        if prev is None or prev.frame is not frame or prev.k != frame.k - 1 or prev.choices != now.choices:
            return
        period_s = now.now_s - prev.now_s
        if period_s <= 0 or not snap.matches(prev.snapshot, max(abs(now.now_s), period_s)):
            return
        keep = _kept_repetitions(ex, prev, now)
        times = ex.cursor.last_repetition(frame) - keep + 1 - frame.k
        if keep > 0 and times > 0 and _Jump(ex, frame, prev, now, times, period_s, region[1]).apply():
            self.skipped += times
            del self.seen[id(frame)]
            self._inner_moved(frame, {cid: times * (now.accesses[cid] - prev.accesses[cid]) for cid in now.accesses})

    def _inner_moved(self, frame: Frame, delta: dict[str, int]) -> None:
        """The repeats inside ``frame`` moved on with it: their earlier starts are void, and where
        they began in a persistent cache's sequence moved on by ``delta``."""
        frames = self.ex.cursor.frames
        for inner in frames[frames.index(frame) + 1:]:
            self.seen.pop(id(inner), None)
            entry = self.regions.get(id(inner))
            if entry is None:
                continue
            starts = dict(entry[1])
            for cid, cache in self.ex.caches.items():
                if isinstance(cache, PolicyCache) and cache.spec.persistent:
                    starts[str(cid)] += delta.get(str(cid), 0)
            self.regions[id(inner)] = (inner, starts)


def _accesses(ex: Executor, frame: Frame) -> dict[str, int]:
    """Per policy cache, the accesses numbered so far in the sequence the repetition is in."""
    out = {}
    for cid, cache in ex.caches.items():
        if isinstance(cache, PolicyCache):
            out[str(cid)] = cache.counters.get(_key(cache, frame), 0)
    return out


def _key(cache: PolicyCache, frame: Frame) -> int:
    """The sequence (per iteration, or 0 when persistent) of the repetition ``frame`` is in."""
    return 0 if cache.spec.persistent else frame.iteration


def _moves_positions(cache: PolicyCache, frame: Frame) -> bool:
    """Do the cache's positions move on with the repetitions (False: a sequence per iteration,
    and the repetitions are iterations)?"""
    return cache.spec.persistent or (frame.repeat is not None and frame.repeat.axis != "iteration")


def _horizon(cache: PolicyCache) -> int | None:
    """Accesses ahead a cache's policies read beyond the next use (None: not known)."""
    eviction = cache.policy.eviction
    if not type(eviction).__module__.startswith("offsim.policies."):
        return None
    prefetch = cache.policy.prefetch
    if prefetch is None:
        return 0
    if not type(prefetch).__module__.startswith("offsim.policies."):
        return None
    if type(prefetch).__name__ == "NoPrefetch":
        return 0
    for attr in ("depth", "max_ops"):
        value = getattr(prefetch, attr, None)
        if isinstance(value, int):
            return value + 1
    return None


def _kept_repetitions(ex: Executor, prev: _Seen, now: _Seen) -> int:
    """Repetitions to simulate at the end (0: take no shortcut): the last, and as many more as a
    prefetch policy reads ahead of a skipped one."""
    keep = 1
    for cid, cache in ex.caches.items():
        if not isinstance(cache, PolicyCache):
            continue
        horizon = _horizon(cache)
        if horizon is None:
            return 0
        per_period = now.accesses[str(cid)] - prev.accesses[str(cid)]
        if per_period > 0 and _moves_positions(cache, now.frame):
            keep = max(keep, 1 + math.ceil(horizon / per_period))
    return keep


# ---------------------------------------------------------------- snapshots
class _Canon:
    """Builds a :class:`Snapshot`: turns the state into comparable values, relative to a
    repetition's start (time ``t0_s``, repetition ``frame.k`` along ``frame``'s axis)."""

    def __init__(self, ex: Executor, frame: Frame, region: dict[str, int]) -> None:
        self.ex, self.frame, self.region = ex, frame, region
        self.t0_s = ex.clock.now_s
        self.by_iteration = frame.repeat is not None and frame.repeat.axis == "iteration"
        self.times: list[float] = []
        self.values: list[float] = []
        self.node_index: dict[int, int] = {}
        self.nodes: list[Node] = []
        self.flow_index: dict[int, int] = {}
        self.described: list[Any] = []
        self._start_positions = _accesses(ex, frame)
        self.known: dict[int, str] = {id(ex): "executor", id(ex.net): "network", id(ex.memory): "memory",
                                      id(ex.clock): "clock", id(ex.copy_engines): "copy_engines",
                                      id(ex.rec): "recorder"}
        for name, pool in ex.pools.items():
            self.known[id(pool)] = f"pool {name}"
        for name, queue in ex.queues.items():
            self.known[id(queue)] = f"queue {name}"
        for cid, cache in ex.caches.items():
            self.known[id(cache)] = f"cache {cid}"
            if isinstance(cache, PolicyCache):
                self.known[id(cache.policy.eviction)] = f"eviction {cid}"
                if cache.policy.prefetch is not None:
                    self.known[id(cache.policy.prefetch)] = f"prefetch {cid}"
        for choice, policy in ex.choice_policies.items():
            self.known[id(policy)] = f"choice {choice}"

    # ---- coordinates
    def t(self, t_s: float) -> None:
        self.times.append(t_s - self.t0_s)

    def iteration(self, iteration: int) -> int:
        return iteration - self.frame.k if self.by_iteration else iteration - self.frame.iteration

    def micro_batch(self, micro_batch: int) -> int:
        if self.by_iteration or micro_batch < 0:
            return micro_batch
        return micro_batch - self.frame.k

    def ref(self, ref: Any) -> Any:
        if isinstance(ref, TensorRef):
            return (str(ref.kind), ref.unit, ref.group, self.micro_batch(ref.mb))
        raise OpaqueStateError(f"held by {type(ref).__name__}")

    # ---- values
    def val(self, x: Any) -> Any:
        if x is None or isinstance(x, bool | int | str | float | Enum):
            return x
        if isinstance(x, Node):
            return self.node(x)
        if isinstance(x, types.MethodType | types.FunctionType):
            return self.fn(x)
        if isinstance(x, tuple | list):
            return tuple(self.val(v) for v in x)
        if isinstance(x, dict):
            return tuple((self.val(k), self.val(v)) for k, v in x.items())
        if isinstance(x, NetFlow):
            return self.flow(x)
        if isinstance(x, Ask):
            return ("ask", x.amount, self.val(x.call), self.val(x.arg))
        if isinstance(x, WakeToken):
            return "live wake" if x is self.ex.net.wake_token else "stale wake"
        name = self.known.get(id(x))
        if name is not None:
            return name
        if type(x).__module__ == "offsim.schedule.ops":  # templates: the same objects each repetition
            return ("template", id(x))
        raise OpaqueStateError(f"cannot compare a {type(x).__name__}")

    def fn(self, f: Any) -> Any:
        if isinstance(f, types.MethodType):
            return ("method", f.__func__, self.val(f.__self__))
        try:
            cells = tuple(self.val(c.cell_contents) for c in f.__closure__ or ())
        except ValueError as exc:  # an empty cell
            raise OpaqueStateError("a callback with an empty cell") from exc
        return ("fn", f.__code__, cells)

    def node(self, n: Node) -> Any:
        if n.finished:
            return "done"
        index = self.node_index.get(id(n))
        if index is None:
            index = self.node_index[id(n)] = len(self.nodes)
            self.nodes.append(n)
        return ("node", index)

    def describe_nodes(self) -> None:
        """Describe every unfinished node met (describing one may meet more)."""
        k = 0
        while k < len(self.nodes):
            n = self.nodes[k]
            self.t(n.head_s)
            self.t(n.start_s)
            position: Any = n.position
            if position >= 0 and isinstance(n.op.body, Access):
                position = self.pos(n.op.body.cache, position)
            self.described.append((id(n.op), self.iteration(n.iteration), self.micro_batch(n.micro_batch),
                                   n.phase, n.pending, self.val(n.then), position, self.val(n.stream_pred),
                                   self.val(n.request), tuple(self.val(w) for w in n.waiters)))
            k += 1

    def flow(self, f: NetFlow) -> Any:
        index = self.flow_index.get(id(f))
        if index is not None:
            return ("flow", index)
        self.flow_index[id(f)] = len(self.flow_index)
        self.t(f.start_s)
        self.values += [f.remaining_bytes, f.rate_bytes_per_s]
        return ("flow", f.name, f.size_bytes, tuple(f.usage.items()), f.cap_bytes_per_s, self.val(f.meta),
                self.val(f.done), self.val(f.arg))

    # ---- caches
    def pos(self, cache_id: Any, position: int) -> Any:
        """A position of a cache's sequence, comparable between repetitions: relative to the
        repetition's first access if it lies in the repeat (where the sequence is periodic), as
        it is if it lies before (it does not move)."""
        cache = self.ex.caches[cache_id]
        if not isinstance(cache, PolicyCache) or not _moves_positions(cache, self.frame):
            return position
        if position < self.region[str(cache_id)]:
            return ("before the repeat", position)
        return position - self._start_positions[str(cache_id)]

    def reads_uses(self, cache_id: Any) -> bool:
        """Does the cache's eviction policy read how often a resident was used (LFU)? The others
        of :mod:`offsim.policies` do not, and a count that grows must not block the shortcut."""
        cache = self.ex.caches[cache_id]
        policy = cache.policy.eviction if isinstance(cache, PolicyCache) else None
        while policy is not None:
            if type(policy).__name__ == "Lfu":
                return True
            policy = getattr(policy, "then", None)
        return False

    def cache_key(self, cache: PolicyCache, key: int) -> int:
        return key if cache.spec.persistent else self.iteration(key)


def take_snapshot(ex: Executor, frame: Frame, region: dict[str, int]) -> Snapshot:
    """The state of ``ex`` relative to the start of ``frame``'s current repetition (``region``:
    per cache, the position where the repeat began); raises :class:`OpaqueStateError` when it
    holds something that cannot be compared."""
    c = _Canon(ex, frame, region)
    shape = (_program_counter(c), _queue(c), _resources(c), _memory(c), _writers(c), _caches(c), _phases(c))
    c.describe_nodes()
    return Snapshot((shape, tuple(c.described)), c.times, c.values, c.nodes)


def _program_counter(c: _Canon) -> Any:
    cur = c.ex.cursor
    inner = cur.frames.index(c.frame)  # the frames around it do not move with its repetitions
    frames = tuple((id(f.items), f.index, f.k, f.iteration, f.micro_batch) for f in cur.frames[:inner])
    frames += tuple((id(f.items), f.index, f.k - c.frame.k if f is c.frame else f.k, c.iteration(f.iteration),
                     c.micro_batch(f.micro_batch)) for f in cur.frames[inner:])
    return (frames, id(cur.block), cur.op_index, c.iteration(cur.iteration), c.micro_batch(cur.micro_batch),
            tuple(c.val(n) for n in cur.nodes), c.ex.iterations, c.iteration(len(c.ex.rec.iteration_starts_s)))


def _queue(c: _Canon) -> Any:
    """The calls queued, in the order they will be processed; a superseded wake-up of the flow
    network is left out (it does nothing, and it neither moves nor reorders the others)."""
    out = []
    for t_s, _eid, call, arg in sorted(c.ex.clock.queue, key=lambda q: (q[0], q[1])):
        if isinstance(arg, WakeToken) and arg is not c.ex.net.wake_token:
            continue
        c.t(t_s)
        out.append((c.val(call), c.val(arg)))
    return tuple(out)


def _resource(c: _Canon, res: Any) -> Any:
    if isinstance(res, Slots):
        return (res.used, c.val(list(res.waiting)))
    if isinstance(res, Pool):
        return (res.level, c.val(list(res.puts)), c.val(list(res.gets)))
    raise OpaqueStateError(f"cannot compare a {type(res).__name__}")


def _resources(c: _Canon) -> Any:
    ex = c.ex
    net = ex.net
    if net.flows:  # the last advance matters only to flows in progress
        c.t(net._last_s)
    flows = tuple(c.val(f) for f in net.flows)
    pools = tuple((name, _resource(c, p)) for name, p in ex.pools.items())
    queues = tuple((name, _resource(c, q)) for name, q in ex.queues.items())
    return (flows, _resource(c, ex.copy_engines), pools, queues)


def _memory(c: _Canon) -> Any:
    mem = c.ex.memory
    held = sorted((str(tier), c.ref(key), n) for (tier, key), n in mem.held.items())
    return (tuple(held), tuple(sorted((str(t), n) for t, n in mem.rank_bytes.items())))


def _writers(c: _Canon) -> Any:
    """The last writers not finished (a finished one is no dependency), and the streams' last ops."""
    writers = sorted((c.ref(ref), node) for ref, node in c.ex.last_write.items() if not node.finished)
    streams = sorted((name, node) for name, node in c.ex.stream_last.items() if not node.finished)
    return (tuple((r, c.val(n)) for r, n in writers), tuple((s, c.val(n)) for s, n in streams))


def _caches(c: _Canon) -> Any:
    out: list[Any] = []
    for cid, cache in c.ex.caches.items():
        if isinstance(cache, FetchTracker):
            fetches = sorted(((c.iteration(it), c.micro_batch(mb), unit), node)
                             for (it, mb, unit), node in cache.present.items())
            out.append((str(cid), tuple((k, c.val(n)) for k, n in fetches)))
            continue
        current = _key(cache, c.frame)
        counters = tuple(sorted((c.cache_key(cache, k), c.pos(cid, n) if k == current else n)
                                for k, n in cache.counters.items() if c.cache_key(cache, k) >= -1))
        present = tuple((unit, c.val(node)) for unit, node in cache.present.items())
        open_ = tuple(sorted((unit, tuple(c.pos(cid, p) for p in q)) for unit, q in cache.open.items()))
        key = None if cache.cache is None else c.cache_key(cache, cache.cache_key)
        out.append((str(cid), key, c.pos(cid, cache.issued), c.iteration(cache.iteration), counters, present, open_,
                    _cache(c, cid, cache.cache)))
    return tuple(out)


def _cache(c: _Canon, cid: Any, cache: Cache | None) -> Any:
    if cache is None:
        return None
    resident = []
    for t, r in cache.resident.items():
        nxt = cache._next[r.last_use]
        resident.append((t, r.size_bytes, c.pos(cid, r.inserted_at), c.pos(cid, r.last_use),
                         r.uses if c.reads_uses(cid) else None, None if nxt is None else c.pos(cid, nxt)))
    c.values.append(cache.used_bytes)
    return (tuple(resident), tuple(sorted((t, n) for t, n in cache.pins.items() if n > 0)))


def _phases(c: _Canon) -> Any:
    """The phases of the previous repetition on (earlier ones are final); the previous
    repetition's must be final too (no op of its on the main stream is left).

    Along iterations: those of the previous iteration on; along micro-batches: those of the
    current micro-batch on, in the repeat's iteration. Tested on the absolute keys, made relative
    only for those kept: a run that skipped many repetitions holds a phase per skipped one, and
    every snapshot after walks them all (issue 16, 10,000 micro-batches)."""
    out = []
    k = c.frame.k
    if c.by_iteration:
        for (it, mb, phase), (start_s, end_s) in c.ex.phases.items():
            if it - k >= -1:
                c.t(start_s)
                c.t(end_s)
                out.append((it - k, mb, phase))
        return tuple(out)
    iteration = c.frame.iteration
    for (it, mb, phase), (start_s, end_s) in c.ex.phases.items():
        if it == iteration and mb >= k:
            c.t(start_s)
            c.t(end_s)
            out.append((0, mb - k, phase))
    return tuple(out)


# ---------------------------------------------------------------- the jump
class _Jump:
    """Moves the run on ``times`` periods from the start of repetition ``now.k``: the state
    shifted by ``times x period_s`` seconds and ``times`` repetitions, the skipped repetitions
    recorded as copies of the last one."""

    def __init__(self, ex: Executor, frame: Frame, prev: _Seen, now: _Seen, times: int, period_s: float,
                 region: dict[str, int]) -> None:
        self.ex, self.frame, self.prev, self.now, self.times = ex, frame, prev, now, times
        self.region = region
        self.period_s, self.dt_s = period_s, times * period_s
        self.by_iteration = frame.repeat is not None and frame.repeat.axis == "iteration"

    def apply(self) -> bool:
        """Move the run on; False (and nothing changed) while a phase of the previous repetition
        is still open (its end is not final yet)."""
        ex = self.ex
        if any(self._axis_of(n) < 0 and n.op.stream == ex.main for n in self.now.snapshot.nodes):
            return False
        if self.by_iteration and len(ex.rec.iteration_starts_s) < self.frame.k:
            return False  # the previous iteration's start is not known yet
        ex.rec.repeat(self.prev.mark, self.times, self.period_s, 1 if self.by_iteration else 0)
        ex.events += self.times * (self.now.events - self.prev.events)
        self._phases()
        self._iteration_starts()
        self._clock()
        self._nodes()
        self._tensors()
        self._caches()
        ex.cursor.move(self.frame, self.times)
        return True

    def _axis_of(self, n: Node) -> int:
        """Repetitions from the current one to the one ``n`` belongs to."""
        if self.by_iteration:
            return n.iteration - self.frame.k
        return n.micro_batch - self.frame.k if n.micro_batch >= 0 else 0

    def _moved(self, it: int, mb: int) -> tuple[int, int]:
        if self.by_iteration:
            return it + self.times, mb
        return it, (mb + self.times if mb >= 0 else mb)

    def _phases(self) -> None:
        """Copies of the previous repetition's phases, and the live ones moved on."""
        ex, period = self.ex, self.period_s
        old = ex.phases
        ex.phases = {}
        live: list[tuple[tuple[int, int, str], list[float]]] = []
        template: list[tuple[tuple[int, int, str], list[float]]] = []
        for key, value in old.items():
            rel = self._phase_repetition(key)
            if rel is not None and rel >= 0:
                live.append((key, value))
                continue
            ex.phases[key] = value
            if rel == -1:
                template.append((key, value))
        for j in range(1, self.times + 1):
            for (it, mb, phase), (start_s, end_s) in template:
                key = (it + j, mb, phase) if self.by_iteration else (it, mb + j, phase)
                ex.phases[key] = [start_s + j * period, end_s + j * period]
        for (it, mb, phase), (start_s, end_s) in live:
            ex.phases[(*self._moved(it, mb), phase)] = [start_s + self.dt_s, end_s + self.dt_s]

    def _phase_repetition(self, key: tuple[int, int, str]) -> int | None:
        it, mb, _ = key
        if self.by_iteration:
            return it - self.frame.k
        if it != self.frame.iteration or mb < 0:
            return None
        return mb - self.frame.k

    def _iteration_starts(self) -> None:
        if not self.by_iteration:
            return
        ex, k = self.ex, self.frame.k
        assert len(ex.rec.iteration_starts_s) >= k, "checked by apply"
        starts = ex.rec.iteration_starts_s
        before = len(starts)
        tail = starts[k:]
        del starts[k:]
        starts += [starts[k - 1] + j * self.period_s for j in range(1, self.times + 1)]
        starts += [t + self.dt_s for t in tail]
        if ex.on_iteration is not None:
            for i in range(before, len(starts)):
                ex.on_iteration(i, ex.iterations)

    def _clock(self) -> None:
        ex, dt = self.ex, self.dt_s
        clock = ex.clock
        queue = [(t + dt, eid, call, arg) for t, eid, call, arg in clock.queue]
        heapq.heapify(queue)
        clock.queue[:] = queue
        clock.now_s += dt
        ex.net.shift(dt)
        ex.end_s += dt

    def _nodes(self) -> None:
        for n in self.now.snapshot.nodes:
            n.head_s += self.dt_s
            n.start_s += self.dt_s
            n.iteration, n.micro_batch = self._moved(n.iteration, n.micro_batch)

    def _tensors(self) -> None:
        """Tensors of a micro-batch are named by it: move those held and those being written."""
        ex = self.ex
        live = {ref: n for ref, n in ex.last_write.items() if not n.finished}
        if self.by_iteration:
            ex.last_write = live
            return
        ex.last_write = {self._ref(ref): n for ref, n in live.items()}
        ex.memory.held = {(tier, self._ref(ref)): n for (tier, ref), n in ex.memory.held.items()}
        for cache in ex.caches.values():
            if isinstance(cache, FetchTracker):
                cache.present = {(it, *self._moved(it, mb)[1:], unit): n
                                 for (it, mb, unit), n in cache.present.items()}

    def _ref(self, ref: Any) -> Any:
        if isinstance(ref, TensorRef) and ref.mb >= 0:
            return TensorRef(ref.kind, ref.unit, ref.group, ref.mb + self.times)
        return ref

    def _caches(self) -> None:
        for cid, cache in self.ex.caches.items():
            if isinstance(cache, FetchTracker):
                if self.by_iteration:
                    cache.present = {(it + self.times, mb, unit): n for (it, mb, unit), n in cache.present.items()}
                continue
            if _moves_positions(cache, self.frame):
                per_period = self.now.accesses[str(cid)] - self.prev.accesses[str(cid)]
                cache.shift_positions(_key(cache, self.frame), self.times * per_period, self.region[str(cid)],
                                      [n for n in self.now.snapshot.nodes if isinstance(n.op.body, Access)
                                       and n.op.body.cache == cid])
            if self.by_iteration:
                cache.shift_iterations(self.frame.k - 1, self.times)
