"""The layer-periodic shortcut (issue 16): inside a block, skip layers that repeat the one before.

A block's ops are cut into runs of one (phase, layer) (:func:`plan_block`); a *stretch* is a
sequence of consecutive runs that are equal op for op once layer numbers are taken relative to the
run's layer and ``after`` indices relative to its first op, the layer moving by the same step
(+1 in a forward, -1 in a backward) from run to run. As the cursor issues the first op of a run
inside a stretch, :class:`LayerShortcut` takes a :class:`_Boundary` (the executor's state relative
to that run, once the clock's step that issued it has run) and compares it with the previous
run's; when they match, every later run of the stretch would repeat it, shifted by the period
and by one layer, and the run is moved on by whole runs, keeping the stretch's last two
simulated.

It is exact only where what it does not compare cannot change what the skipped runs do, so it is
conservative (anything else: simulated as before):

* the stretch's ops are kernels (``Delay``) and allocations (``Alloc``/``Free``) on the stream
  that records stalls, each ``after`` inside its own run: no cache hook, no policy, no choice, no
  flow, no pool reads the state while the skipped runs would run;
* at both boundaries nothing else is in flight: every clock entry is the end of one of the
  stretch's kernels, no flow runs, no pool, queue or copy engine has a request waiting, and what
  waits for the stretch's op instances is the stretch's own op instances or the program counter;
* the memory held is not compared (activation checkpoints make it grow by a layer's tensors a
  layer, which is what a stretch does): nothing in a stretch reads it, and the skipped runs'
  allocations and frees are applied to the ledger in their order (so its levels, peaks, owner
  peaks and holdings are those of the full run, and a level over a tier's capacity raises the
  full run's error, at the same op and time).

The skipped runs' records are written out (not held as :class:`~offsim.trace.Repeat` s): spans
copied from the previous run's with the layer and the name of the op the same distance into the
target run, and levels as the ledger reports them while the skipped runs' allocations and frees
are applied. Their times are not the template's shifted by a multiple of the period (that would
differ from the full run in the last bits): the stretch runs on one in-order stream, so the clock
moves only by its kernels' ends, one after the other, and each copy's clock values are worked out
by the same additions the full run makes (:class:`_Jump`). So the records are the full run's bit
for bit: ``benchmarks/engine_equivalence.py --layer-shortcut=on`` hashes every configuration as
the run without it does, which is why the switch (``Executor.run(layer_shortcut=...)``, default
:data:`DEFAULT`) is on by default.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from itertools import pairwise
from typing import TYPE_CHECKING, Any

from offsim.engine.node import Node
from offsim.engine.steady import TIME_TOLERANCE
from offsim.schedule.ops import Alloc, Block, Delay, Free, Op, TensorRef
from offsim.trace import Span

if TYPE_CHECKING:
    from offsim.engine.execute import Executor

#: whether ``Executor.run`` takes the shortcut when not told (on: every configuration of
#: ``benchmarks/engine_equivalence.py`` hashes the same with it as without it)
DEFAULT = True
#: a stretch needs at least this many runs (fewer leave nothing to skip after the kept ones)
MIN_RUNS = 5
#: runs simulated at a stretch's end
KEPT_RUNS = 2
#: the op bodies a stretch may hold
_ALLOWED = (Delay, Alloc, Free)


@dataclass(frozen=True)
class Stretch:
    """Consecutive runs of a block equal up to the layer.

    Attributes:
        first: the index in the block of the first run's first op.
        ops: ops per run (the period, in ops).
        runs: runs in the stretch.
        layer: the first run's layer.
        step: the layer's change from a run to the next (+1 or -1).
    """

    first: int
    ops: int
    runs: int
    layer: int
    step: int

    def run_of(self, index: int) -> int:
        """The run an op index of the stretch is in."""
        return (index - self.first) // self.ops


def _rel(value: int, origin: int) -> int:
    return value - origin if value >= 0 else value


def _ref(r: TensorRef, layer: int) -> tuple[Any, ...]:
    return (r.kind, _rel(r.unit, layer), r.group, r.mb)


def canon(op: Op, layer: int, first: int) -> tuple[Any, ...] | None:
    """``op`` relative to its run (layer ``layer``, first op at block index ``first``), or None
    where it cannot be in a stretch (a body it does not skip, or an ``after`` out of its run)."""
    if not isinstance(op.body, _ALLOWED) or any(a < first for a in op.after):
        return None
    fields: list[Any] = []
    for f in dataclasses.fields(op.body):
        v = getattr(op.body, f.name)
        if f.name == "unit":
            v = _rel(v, layer)
        elif isinstance(v, TensorRef):
            v = _ref(v, layer)
        fields.append((f.name, v))
    t = op.tag
    return (type(op.body), tuple(fields), t.activity, t.mechanism, t.phase, t.label, _rel(t.layer, layer), t.group,
            op.stream, tuple(a - first for a in op.after), tuple(_ref(r, layer) for r in op.reads),
            tuple(_ref(r, layer) for r in op.writes), op.stall)


def plan_block(block: Block, main: str | None) -> list[Stretch]:
    """The block's stretches (ops on the stream ``main`` only)."""
    firsts: list[int] = []
    previous = None
    for i, op in enumerate(block.ops):
        tag = op.tag
        if tag is not previous and (previous is None or tag.layer != previous.layer or tag.phase != previous.phase):
            firsts.append(i)
        previous = tag
    firsts.append(len(block.ops))
    runs = [(a, b - a, block.ops[a].tag.layer) for a, b in pairwise(firsts)]  # (first, ops, layer)
    canons: list[tuple[Any, ...] | None] = []
    for first, n, layer in runs:
        ops = block.ops[first:first + n]
        if layer < 0 or not all(op.stream == main and type(op.body) in _ALLOWED for op in ops):
            canons.append(None)  # the cheap tests first (a 175B block has 13,627 ops, most in no stretch)
            continue
        c = [canon(op, layer, first) for op in ops]
        canons.append(None if None in c else tuple(c))
    out: list[Stretch] = []
    i = 0
    while i < len(runs):
        j = i
        step = runs[i + 1][2] - runs[i][2] if i + 1 < len(runs) else 0
        while (canons[i] is not None and j + 1 < len(runs) and abs(step) == 1 and canons[j + 1] == canons[i]
               and runs[j + 1][2] - runs[j][2] == step):
            j += 1
        if j + 1 - i >= MIN_RUNS:
            out.append(Stretch(runs[i][0], runs[i][1], j + 1 - i, runs[i][2], step))
            i = j
        else:
            i += 1
    return out


@dataclass
class _Boundary:
    """The state as a run of a stretch begins, relative to it.

    Attributes:
        shape: everything discrete. times_s: times relative to the boundary.
        run: the run's number in the stretch; index: its first op's in the block. now_s: the clock.
        marks: the recorder's marks. events: events processed. started: block index of the
        first op instance not started.
    """

    shape: tuple[Any, ...]
    times_s: list[float]
    run: int
    index: int
    now_s: float
    marks: Any
    events: int
    started: int

    def matches(self, other: _Boundary, scale_s: float) -> bool:
        if self.shape != other.shape or len(self.times_s) != len(other.times_s):
            return False
        tol_s = TIME_TOLERANCE * scale_s
        return all(a == b or abs(a - b) <= tol_s for a, b in zip(self.times_s, other.times_s, strict=True))


class _OpaqueError(Exception):
    """Something at the boundary the shortcut does not take."""


class LayerShortcut:
    """Watches the runs of stretches begin and skips those that repeat (see the module)."""

    def __init__(self, ex: Executor) -> None:
        self.ex = ex
        self.plans: dict[int, dict[int, Stretch]] = {}  # per block: its stretches by run start index
        self.seen: tuple[int, Stretch, _Boundary] | None = None  # (nodes list id, stretch, boundary)
        self.skipped = 0  # runs skipped, for tests and benchmarks
        self.indices: dict[int, dict[int, int]] = {}  # per block: its ops' indices, by id

    def starts(self, block: Block) -> dict[int, Stretch]:
        """The block's run starts inside stretches (the first run's left out: nothing to compare)."""
        plan = self.plans.get(id(block))
        if plan is None:
            plan = self.plans[id(block)] = {}
            for s in plan_block(block, self.ex.main):
                for r in range(1, s.runs):
                    plan[s.first + r * s.ops] = s
        return plan

    def at_boundary(self, begun: tuple[Block, int, list[Node]]) -> None:
        """A run begun in the last clock step (its block, its first op's index, the block
        instance's op instances): compare with the run before, and skip what repeats."""
        block, index, nodes = begun
        ex = self.ex
        stretch = self.plans[id(block)][index]
        if ex.cursor.nodes is not nodes or ex.cursor.block is not block:
            self.seen = None
            return
        if stretch.run_of(index) >= stretch.runs - KEPT_RUNS - 1:  # nothing left to skip after it
            self.seen = None
            return
        try:
            now = _take(ex, stretch, index, nodes)
        except _OpaqueError:
            self.seen = None
            return
        prev = self.seen
        self.seen = (id(nodes), stretch, now)
        if prev is None or prev[0] != id(nodes) or prev[1] is not stretch or prev[2].run != now.run - 1:
            return
        period_s = now.now_s - prev[2].now_s
        times = stretch.runs - KEPT_RUNS - now.run
        if period_s <= 0 or times <= 0 or not now.matches(prev[2], max(abs(now.now_s), period_s)):
            return
        indices = self.indices.get(id(block))
        if indices is None:
            indices = self.indices[id(block)] = {id(op): i for i, op in enumerate(block.ops)}
        if _Jump(ex, block, stretch, prev[2], now, times, indices).apply():
            self.skipped += times
            self.seen = None


def _take(ex: Executor, stretch: Stretch, index: int, nodes: list[Node]) -> _Boundary:
    """The boundary of the run starting at block index ``index`` (raises :class:`_OpaqueError`)."""
    t0 = ex.clock.now_s
    low = index - stretch.ops  # the run before: its op instances may still be referred to
    times: list[float] = []
    if ex.net.flows or ex.copy_engines.waiting or any(q.waiting for q in ex.queues.values()):
        raise _OpaqueError
    if any(p.gets or p.puts for p in ex.pools.values()):
        raise _OpaqueError

    def rel(n: Any) -> Any:
        if isinstance(n, Node):
            if n.finished:
                return "done"
            for k in range(low, len(nodes)):
                if nodes[k] is n:
                    return k - index
            raise _OpaqueError
        if n == ex._advance:
            return "advance"
        raise _OpaqueError

    queue = []
    for t, eid, call, arg in sorted(ex.clock.queue):
        if call != ex._kernel_done:
            raise _OpaqueError
        queue.append((eid, rel(arg)))
        times.append(t - t0)
    order = tuple(q[1] for q in sorted(queue))  # the entries' order among equal times
    described = []
    started = len(nodes)
    for k in range(low, len(nodes)):
        n = nodes[k]
        if n.start_s == -math.inf and started == len(nodes):
            started = k
        if n.finished:
            continue
        times += [n.head_s - t0, n.start_s - t0 if n.start_s > -math.inf else -math.inf]
        described.append((k - index, n.pending, rel(n.stream_pred) if n.stream_pred is not None else None,
                          n.then.__name__ if n.then is not None else None,  # type: ignore[attr-defined]
                          tuple(rel(w) for w in n.waiters)))
    streams = tuple(sorted((s, rel(n)) for s, n in ex.stream_last.items() if not n.finished))
    writers = tuple(sorted((_ref(r, 0), rel(n)) for r, n in ex.last_write.items() if not n.finished))
    shape = (ex.cursor.op_index - index, started - index, order, tuple(described), streams,
             tuple((w[0][0], w[0][2], w[0][3], w[1]) for w in writers), ex.choices_taken)
    return _Boundary(shape, times, stretch.run_of(index), index, t0, ex.rec.mark(), ex.events, started)


class _Jump:
    """Moves the run on ``times`` runs of a stretch from the boundary ``now`` (see the module).

    The stretch runs on one in-order stream, so between two boundaries the clock only moves by
    the ends of its kernels, one after the other: the clock values of the template (the previous
    boundary's ``c_0``, then ``c_{i+1} = c_i + seconds_i`` of the kernel started at ``c_i``, up to
    the boundary's) are a chain, checked bit for bit. Each copy's clock values are the same chain
    from the previous copy's end, added in the same order as the full run adds them, so every
    time recorded (a kernel's span, a level's change) is the full run's, not a time shifted by a
    multiple of the period."""

    def __init__(self, ex: Executor, block: Block, stretch: Stretch, prev: _Boundary, now: _Boundary, times: int,
                 indices: dict[int, int]) -> None:
        self.ex, self.block, self.stretch, self.prev, self.now = ex, block, stretch, prev, now
        self.times = times
        self.shift_ops = times * stretch.ops
        self.indices = indices

    def apply(self) -> bool:
        """Move on; False (nothing changed) where the template is not the chain above, or its
        records are not all kernels and levels at its clock values."""
        ex = self.ex
        marks_prev, marks_now = self.prev.marks, self.now.marks
        if any(a.repeats != b.repeats or a.items > b.items for a, b in zip(marks_prev, marks_now, strict=True)):
            return False
        if marks_now[1].items != marks_prev[1].items:  # a cache event (a stall's): not a chain
            return False
        spans = ex.rec.spans.items[marks_prev[0].items:marks_now[0].items]
        chain = self._chain()
        executed = ex.cursor.nodes[self.prev.started:self.now.started]
        if chain is None or self.prev.started < self.stretch.first:
            return False
        seconds, at = chain
        names = self._names()
        if any(s.resource != "gpu" or (s.layer, s.name) not in names or s.start_s not in at or s.end_s not in at
               for s in spans):
            return False
        if any(isinstance(n.op.body, Alloc | Free) and n.start_s not in at for n in executed):
            return False
        if not self._still(ex.clock.now_s):
            return False
        template = [(s, names[(s.layer, s.name)], at[s.start_s], at[s.end_s]) for s in spans]
        memory = [(self._index(n), n.micro_batch, at[n.start_s]) for n in executed
                  if isinstance(n.op.body, Alloc | Free)]
        t_s = ex.clock.now_s
        mem, now = ex.memory, ex.memory.now
        try:
            for j in range(1, self.times + 1):
                clock = [t_s]
                for s in seconds:
                    clock.append(clock[-1] + s)
                self._copy(j * self.stretch.ops, template, memory, clock)
                t_s = clock[-1]
        finally:
            mem.now = now
        ex.events += self.times * (self.now.events - self.prev.events)
        self._move(t_s)
        return True

    def _chain(self) -> tuple[list[float], dict[float, int]] | None:
        """The template's kernels' seconds, and each clock value's place in the chain (None:
        the template is not a chain)."""
        t_prev, t_now = self.prev.now_s, self.now.now_s
        nodes = self.ex.cursor.nodes
        first = max(self.stretch.first, self.prev.index - self.stretch.ops)
        c = t_prev
        seconds: list[float] = []
        values = [c]
        for n in nodes[first:self.now.started]:
            body = n.op.body
            if not isinstance(body, Delay) or n.start_s < t_prev:
                continue
            if n.start_s != c:
                return None
            if not n.finished:
                break
            c = c + body.seconds
            seconds.append(body.seconds)
            values.append(c)
        else:
            return None
        if c != t_now:
            return None
        at: dict[float, int] = {}
        for i, v in enumerate(values):
            if v in at and values[at[v]] != v:
                return None
            at.setdefault(v, i)
        if len(at) != len(values) and any(s != 0.0 for s in seconds):
            return None  # a kernel too short to move the clock: its place is ambiguous
        return seconds, at

    def _still(self, t_now: float) -> bool:
        """What is in flight began at the boundary: the kernel running started then (its end
        queued at its seconds from then), the ops waiting were let go then, the phase and the
        run's end were last moved then."""
        ex, nodes = self.ex, self.ex.cursor.nodes
        for t, _, _, n in ex.clock.queue:
            if n.start_s != t_now or t != t_now + n.op.body.seconds:
                return False
        for n in nodes[self.now.index - self.stretch.ops:]:
            if not n.finished and (n.head_s != t_now or n.start_s not in (t_now, -math.inf)):
                return False
        last = nodes[-1]
        return ex.phases[(last.iteration, last.micro_batch, last.phase)][1] == t_now and ex.end_s == t_now

    def _names(self) -> dict[tuple[int, str], int]:
        """(layer, span name) -> block index of the op that records it, over the runs a template
        span can come from (the two before the boundary's and its own)."""
        ex, s = self.ex, self.stretch
        out: dict[tuple[int, str], int] = {}
        first = max(s.first, self.now.started - 3 * s.ops)
        for i in range(first, min(len(self.block.ops), self.now.started + s.ops)):
            op = self.block.ops[i]
            out.setdefault((op.tag.layer, ex._info(op).name), i)
        return out

    def _copy(self, shift: int, spans: list[tuple[Span, int, int, int]], memory: list[tuple[int, int, int]],
              clock: list[float]) -> None:
        """Record a copy of the template run ``shift`` ops on at the copy's clock values
        (``clock``, by their place in the template's chain), and apply its allocations and frees
        in their order. The ledger checks each as in the full run: a level over a capacity, or a
        free of what is not held, raises there the error the full run raises (same op, same
        time, same level)."""
        ex = self.ex
        ops, infos = self.block.ops, ex._block_infos[id(self.block)][0]
        append = ex.rec.spans.append
        for s, i, start, end in spans:
            target = ops[i + shift]
            append(Span(s.iteration, s.phase, s.resource, s.kind, infos[i + shift].name, target.tag.layer,
                        clock[start], clock[end], s.bytes))
        mem = ex.memory
        for i, micro_batch, at in memory:
            op = ops[i + shift]
            body = op.body
            mem.now = _at(clock[at])
            if isinstance(body, Alloc):
                mem.hold(body.tier, ex._bind(body.tensor, micro_batch), body.nbytes, _namer(ex, op), op.tag.mechanism)
            else:
                assert isinstance(body, Free)
                mem.free(body.tier, ex._bind(body.tensor, micro_batch))

    def _index(self, n: Node) -> int:
        """The block index of a template op instance."""
        return self.indices[id(n.op)]

    def _move(self, t_new: float) -> None:
        """The clock, the op instances in flight, the cursor, the writers and the phase moved on
        to ``t_new`` (the last copy's end)."""
        ex = self.ex
        t_now = ex.clock.now_s
        dt = t_new - t_now
        clock = ex.clock
        clock.queue[:] = [(t_new + n.op.body.seconds, eid, call, n) for _, eid, call, n in clock.queue]  # order kept
        clock.now_s = t_new
        ex.net.shift(dt)
        ex.end_s = t_new
        cursor = ex.cursor
        nodes = cursor.nodes
        low = self.now.index - self.stretch.ops  # the run before the boundary's (as :func:`_take` describes)
        infos = ex._block_infos[id(self.block)][0]
        writes: dict[Any, Any] = {}
        for i in range(low, len(nodes)):
            n = nodes[i]
            n.head_s = t_new if n.head_s == t_now else n.head_s + dt
            n.start_s = t_new if n.start_s == t_now else n.start_s + dt
            old = n.op
            n.op, n.info = self.block.ops[i + self.shift_ops], infos[i + self.shift_ops]
            for a, b in zip(old.writes, n.op.writes, strict=True):
                writes[ex._bind(a, n.micro_batch)] = ex._bind(b, n.micro_batch)
        filler = Node(self.block.ops[low], -1, -1, "")  # stands for the skipped op instances (never read:
        filler.finished = True  # no ``after`` leaves its run)
        cursor.nodes = nodes[:low] + [filler] * self.shift_ops + nodes[low:]
        cursor.op_index += self.shift_ops
        ex.last_write = {writes.get(r, r): n for r, n in ex.last_write.items() if not n.finished}
        last = nodes[-1]
        ex.phases[(last.iteration, last.micro_batch, last.phase)][1] = t_new


def _namer(ex: Executor, op: Op) -> Any:
    """What the ledger names an allocation by in its messages (:meth:`Executor._what`)."""
    return lambda: ex._info(op).name or ex._what_op(op)


def _at(t_s: float) -> Any:
    """A clock that reads ``t_s``."""
    return lambda: t_s
