"""The executor: runs a :class:`~offsim.schedule.ops.Schedule` on a machine's shared resources.

It reads no strategy, workload or hardware model: what to do is the schedule, what it runs on is
a :class:`Machine` (plain numbers), and the run-time decisions go to the policies of the caches
the schedule names (:mod:`offsim.engine.hooks`).

An op instance starts when the op issued before it on its stream has finished, its ``after`` ops
of the same block instance have, and the last writer of each tensor it reads has (the version
table binds a read to the last write issued before it). Then, by kind: a ``Delay`` is a timeout; a
``Flow`` shares bandwidth max-min fair with the others (:mod:`offsim.engine.flows`), holding a
copy engine while it runs if it is a DMA; ``Alloc``/``Free`` change :mod:`offsim.engine.memory`;
``Acquire``/``Release`` take and give back pool units, first come first served; the cache hooks
ask the policies. Records go to a :class:`~offsim.trace.Recorder`, attributed by the ops' fields:
spans of kernels and flows, stalls of the stream that records them (waits of ops that declare
what they wait for), the per-micro-batch phases and the iteration starts of that stream, memory
levels and cache events.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from heapq import heappop

from offsim.core.enums import Activity, CacheId, ChoiceId, Phase, StreamKind
from offsim.engine import layers as layer_period
from offsim.engine import reuse
from offsim.engine.cursor import Cursor
from offsim.engine.flows import Flow as NetFlow
from offsim.engine.flows import FlowNetwork
from offsim.engine.hooks import CachePolicy, ChoicePolicy, FetchTracker, PolicyCache
from offsim.engine.memory import Memory
from offsim.engine.node import Node
from offsim.engine.slots import Pool, Slots
from offsim.engine.soon import Clock
from offsim.engine.steady import SteadyState
from offsim.schedule.analysis import bind
from offsim.schedule.ops import (
    CUR_MB,
    Access,
    Acquire,
    Alloc,
    Block,
    Choose,
    Delay,
    Done,
    Flow,
    Flush,
    Free,
    Join,
    Op,
    Prefetch,
    Ready,
    Release,
    Schedule,
    TensorRef,
)
from offsim.trace import CacheEvent, Recorder, Span


@dataclass(frozen=True)
class Machine:
    """What the schedule runs on, as plain numbers.

    Attributes:
        capacity: per shared resource, its capacity (bytes/s, or the units its flows use).
        duplex_efficiency: the share of each PCIe direction's rate left when both are busy.
        copy_engines: the GPU's DMA engines (a pool).
        memory_bytes: capacity per reported tier (``gpu``, ``host_pinned``, ``host``, ``nvme``, ``pfs``).
        ranks_per_node / nodes: multipliers from rank levels to node and job levels.
    """

    capacity: dict[str, float]
    duplex_efficiency: float
    copy_engines: int
    memory_bytes: dict[str, float]
    ranks_per_node: int = 1
    nodes: int = 1


def duplex_rule(efficiency: float) -> Callable[[set[str], dict[str, float]], dict[str, float]]:
    """Capacity rule: both PCIe directions busy keeps ``efficiency`` of each one's rate."""
    def rule(busy: set[str], capacity: dict[str, float]) -> dict[str, float]:
        if efficiency >= 1.0 or not ("h2d" in busy and "d2h" in busy):
            return capacity
        return {**capacity, "h2d": capacity["h2d"] * efficiency, "d2h": capacity["d2h"] * efficiency}
    return rule


#: the span resource of a kernel (``Delay``) on a CPU stream: the host thread's time, not the
#: GPU's (metrics count only ``gpu`` spans as GPU busy, ``cpu`` ones as the CPU optimizer's)
HOST = "host"

#: the meta of the executor's flows (each flow's op instance is its ``arg``)
_NO_META: dict[str, object] = {}

#: span names: what an activity moves (display only)
_NOUN = {
    Activity.PARAM_FETCH: "params", Activity.PARAM_GATHER: "params all-gather", Activity.PARAM_UPDATE: "params",
    Activity.GRAD_REDUCE: "grads", Activity.GRAD_OFFLOAD: "grads", Activity.GRAD_ACCUMULATE: "grads accumulate",
    Activity.GRAD_CAST: "grads to fp32", Activity.ACT_OFFLOAD: "activations", Activity.ACT_FETCH: "activations",
    Activity.OPT_SWAP_IN: "state in", Activity.OPT_SWAP_OUT: "state out", Activity.OPT_H2D: "state to GPU",
    Activity.OPT_D2H: "state to host", Activity.OPTIMIZER: "CPU Adam",
}


class _OpInfo:
    """What the executor reads of a template op at each of its instances, worked out once per op
    (issue 16: an op runs once per layer, micro-batch and iteration; its phase, stream, span name
    and flow usage do not change).

    Attributes:
        op: the op (kept, so that its ``id`` names it while this lives).
        phase: the span phase of an instance issued by the program counter.
        main: it runs on the stream that records stalls (phases and iteration starts come from it).
        ordered: it runs on an in-order stream (after the op issued before it there).
        queue: the slot of the out-of-order stream it runs on (None: none).
        access: it is a cache :class:`~offsim.schedule.ops.Access`.
        start: what starting it does.
        then: what an instance does once its dependencies have finished (start, or queue on its stream).
        name: the span name of a kernel or a flow ("": another op).
        usage: a flow's usage per resource name (None: not a flow).
        flow_key: a flow's usage and cap as the network keys them (-1: not started yet).
        after: the op's ``after`` (indices in its block).
        activity: the op's activity, as spans name it.
        links: a flow's links, as spans name them (one span each).
        resource: a kernel's span resource (:data:`HOST` on a CPU stream, else ``gpu``).
    """

    __slots__ = ("access", "activity", "after", "flow_key", "links", "main", "name", "op", "ordered", "phase", "queue",
                 "resource", "start", "then", "usage")

    def __init__(self, ex: Executor, op: Op) -> None:
        body, tag = op.body, op.tag
        self.op = op
        self.after = op.after
        self.flow_key = -1  # a flow's key in the network's memo of rates, once checked (-1: not yet)
        role = ex._roles.get((type(body), op.stream, tag.phase))
        if role is None:
            role = ex._role(body, op.stream, tag.phase)
        self.phase, self.main, self.queue, self.ordered, self.access, self.start, self.then, flow, kernel = role
        # a kernel's span resource: the host thread's for a kernel on a CPU stream (the host
        # issue of :mod:`offsim.mechanisms.host_dispatch`), the GPU's otherwise
        self.resource = HOST if op.stream in ex.host_streams else "gpu"
        if flow or kernel:
            self.name = ex._what_op(op)
            self.activity = ex._str(tag.activity)
        else:  # not recorded as a span (:meth:`Executor._what` names them)
            self.name = self.activity = ""
        if flow:  # the same dict and tuple for every flow of equal usage and links
            self.usage: dict[str, float] | None = ex._usage(body.usage)  # type: ignore[union-attr]
            self.links: tuple[str, ...] = ex._links(body.links)  # type: ignore[union-attr]
        else:
            self.usage, self.links = None, ()


#: what an op's body type, stream and phase decide of its :class:`_OpInfo`: phase (as spans name
#: it), main, queue, ordered, access, start, then, it is a flow, it is a kernel (a ``Delay``)
_Role = tuple[str, bool, "Slots | None", bool, bool, Callable[["Node"], None], Callable[["Node"], None], bool, bool]


class Executor:
    """One run of a schedule; :meth:`run` returns the events processed (the entries of its
    :class:`~offsim.engine.soon.Clock`, each the SimPy event the engine processed before)."""

    def __init__(self, schedule: Schedule, machine: Machine, policies: dict[CacheId, CachePolicy],
                 recorder: Recorder, on_iteration: Callable[[int, int], None] | None = None,
                 choices: dict[ChoiceId, ChoicePolicy] | None = None) -> None:
        self.schedule, self.machine, self.rec, self.on_iteration = schedule, machine, recorder, on_iteration
        self.cache_policies = policies
        self.choice_policies = choices or {}
        self.clock = clock = Clock()
        self.net = FlowNetwork(clock, machine.capacity, duplex_rule(machine.duplex_efficiency), self._flow_done)
        # the clock alone: a closure over the executor would keep it in a cycle
        self.memory = Memory(lambda: clock.now_s, machine.memory_bytes, machine.ranks_per_node, machine.nodes,
                             recorder.level)
        self.copy_engines = Slots(clock, machine.copy_engines)
        self.pools = {p.name: Pool(clock, max(p.capacity, 1), max(p.capacity, 1)) for p in schedule.pools}
        self.main = next((s.name for s in schedule.streams if s.records_stalls), None)
        self.host_streams = frozenset(s.name for s in schedule.streams if s.kind == StreamKind.CPU)
        self.caches: dict[CacheId, PolicyCache | FetchTracker] = {}
        for spec in schedule.caches:
            policy = policies.get(spec.id)
            if policy is None:
                self.caches[spec.id] = FetchTracker(spec, self._program, self.memory.gpu_free_bytes)
            else:
                self.caches[spec.id] = PolicyCache(spec, policy, self._program, self._cache_event,
                                                   self._peak_noter(str(spec.id)), self.memory.gpu_free_bytes)
        self.queues = {s.name: Slots(clock, 1) for s in schedule.streams if not s.in_order}
        self.stream_last: dict[str, Node] = {}
        self._bound: dict[tuple[TensorRef, int], TensorRef] = {}
        self.last_write: dict[TensorRef, Node] = {}
        self.phases: dict[tuple[int, int, str], list[float]] = {}
        self.iterations = 0
        self.end_s = 0.0
        self.events = 0
        self.choices_taken = 0  # decisions a choice policy took (the shortcut skips no period with one)
        self.cursor = Cursor(schedule.body)
        self.steady: SteadyState | None = None  # the shortcut's watcher, while a run with it lasts
        self.layers: layer_period.LayerShortcut | None = None  # the layer shortcut's, likewise
        self.layer_runs_skipped = 0  # the runs it skipped (kept once the run is over)
        self._end_ops: dict[int, Op] = {}
        self._starters: dict[type, Callable[[Node], None]] = {
            Delay: self._start_delay, Flow: self._start_flow, Alloc: self._start_alloc, Free: self._start_free,
            Acquire: self._start_acquire, Release: self._start_release, Join: self._finish, Choose: self._choose}
        self._infos: dict[int, _OpInfo] = {}  # per template op (by id; the info keeps the op alive)
        #: per block of the body: its ops' infos, and the layer shortcut's run starts
        self._block_infos: dict[int, tuple[list[_OpInfo], Block, dict[int, layer_period.Stretch]]] = {}
        self._flow_keys: dict[tuple[int, float], int] = {}  # (id of a usage of ``_usages``, cap) -> network key
        self._strs: dict[object, str] = {}
        self._roles: dict[tuple[type, str | None, Phase], _Role] = {}
        self._usages: dict[tuple[tuple[object, float], ...], dict[str, float]] = {}
        self._link_names: dict[tuple[object, ...], tuple[str, ...]] = {}

    def _str(self, value: object) -> str:
        """``str(value)`` of an enum member, kept once made (for :class:`_OpInfo`)."""
        text = self._strs.get(value)
        if text is None:
            text = self._strs[value] = str(value)
        return text

    def _role(self, body: object, stream: str | None, phase: Phase) -> _Role:
        """What an op's body type, stream and phase decide of its :class:`_OpInfo` (worked out
        once per combination: issue 16). Main: the stream records stalls; queue: the stream's
        slot if it runs out of order; ordered: it runs in order."""
        kind = type(body)
        start = self._starters.get(kind)
        if start is None:  # a hook, or a subclass of a body the executor starts (then kept for its type)
            start = self._starters[kind] = next((f for t, f in self._starters.items() if isinstance(body, t)),
                                                self._hook)
        queue = self.queues.get(stream) if stream is not None else None
        role: _Role = (self._str(phase), stream is not None and stream == self.main, queue,
                       stream is not None and queue is None, kind is Access or isinstance(body, Access), start,
                       self._start if queue is None else self._enqueue,
                       start == self._starters[Flow], start == self._starters[Delay])
        self._roles[(kind, stream, phase)] = role
        return role

    def _usage(self, usage: tuple[tuple[object, float], ...]) -> dict[str, float]:
        """A flow's usage per resource name (one dict per usage met)."""
        named = self._usages.get(usage)
        if named is None:
            named = self._usages[usage] = {str(r): c for r, c in usage}
        return named

    def _links(self, links: tuple[object, ...]) -> tuple[str, ...]:
        """A flow's links as spans name them (one tuple per set met)."""
        names = self._link_names.get(links)
        if names is None:
            names = self._link_names[links] = tuple(map(str, links))
        return names

    def _info(self, op: Op) -> _OpInfo:
        """The op's :class:`_OpInfo` (worked out on its first instance)."""
        info = self._infos.get(id(op))
        if info is None:
            info = self._infos[id(op)] = _OpInfo(self, op)
        return info

    # ------------------------------------------------------------ issue
    def run(self, steady_shortcut: bool = True, layer_shortcut: bool | None = None) -> int:
        """Run to the end; returns the events processed (those of skipped repetitions included).

        ``steady_shortcut``: skip the repetitions of a period that left the run in the state it
        found it (:mod:`offsim.engine.steady`); False simulates every one. ``layer_shortcut``:
        skip the layers of a block that repeat the one before (:mod:`offsim.engine.layers`;
        None: its ``DEFAULT``). Where runs are reused (:mod:`offsim.engine.reuse`) and an
        earlier run had the same inputs, its records are handed out instead."""
        with_layers = layer_period.DEFAULT if layer_shortcut is None else layer_shortcut
        memo = reuse.active()
        key = memo.key(self, steady_shortcut, with_layers) if memo is not None else None
        if memo is not None and key is not None and memo.restore(key, self):
            self._release()
            return self.events
        self._walk_accesses()
        steady = self.steady = SteadyState(self) if steady_shortcut else None
        if steady is not None:
            self.cursor.on_enter = steady.entered
        if with_layers:
            self.layers = layer_period.LayerShortcut(self)
        self._advance()
        self._loop(steady)
        self._close()
        if memo is not None and key is not None:
            memo.store(key, self)
        self._release()
        return self.events

    def _loop(self, steady: SteadyState | None) -> None:
        """Process the clock's entries in order (:meth:`Clock.run`, inlined: issue 16), and let
        the shortcut look at each repetition begun."""
        cursor, clock = self.cursor, self.clock
        queue = clock.queue  # the shortcut moves its entries in place
        events = self.events  # counted here, and in ``self.events`` where the shortcut reads and moves it
        while True:
            if cursor.crossed:
                frames, cursor.crossed = cursor.crossed, []
                self.events = events
                for frame in frames:
                    if isinstance(frame, tuple):  # a run of a layer stretch begun (:meth:`_issue_runs`)
                        assert self.layers is not None
                        self.layers.at_boundary(frame)
                    elif steady is not None:
                        steady.at_boundary(frame)
                events = self.events
            if not queue:
                break
            clock.now_s, _, call, arg = heappop(queue)
            call(arg)
            events += 1
        self.events = events

    def _issue_runs(self, block: Block, infos: list[_OpInfo], starts: dict[int, layer_period.Stretch]) -> bool:
        """:meth:`_advance`'s issue loop for a block with layer stretches: as it, and each op
        that begins a run of a stretch noted for the layer shortcut (in ``cursor.crossed``, looked
        at once the clock's step is over); True where it stopped at an op of the main stream."""
        cursor = self.cursor
        ops, index = block.ops, cursor.op_index
        iteration, micro_batch, nodes = cursor.iteration, cursor.micro_batch, cursor.nodes
        while index < len(ops):
            if index in starts:
                cursor.crossed.append((block, index, nodes))
            op, info = ops[index], infos[index]
            index += 1
            cursor.op_index = index
            node = Node(op, iteration, micro_batch, info.phase, info)
            nodes.append(node)
            after = info.after
            self._issue(node, ([nodes[after[0]]] if len(after) == 1 else [nodes[a] for a in after]) if after
                        else [], micro_batch)
            if info.main and not node.finished:
                node.waiters.append(self._advance)
                return True
        return False

    def _walk_accesses(self) -> None:
        """Give each cache its access sequences (for policies that read ahead), and count the
        iterations."""
        with_access: dict[int, bool] = {}
        for inst in self.schedule.instances():
            self.iterations = max(self.iterations, inst.iteration + 1)
            block = inst.block
            has = with_access.get(id(block))
            if has is None:
                has = with_access[id(block)] = any(isinstance(op.body, Access) for op in block.ops)
            if not has:
                continue
            for op in block.ops:
                if isinstance(op.body, Access):
                    self.caches[op.body.cache].on_walk(inst.iteration, op.body.unit,
                                                       self._where(op, inst.iteration, inst.micro_batch))

    def _advance(self) -> None:
        """Issue ops in program order up to the next op of the main stream that has not finished:
        the main stream is the program counter (what follows it is issued when it is done)."""
        cursor, block_infos = self.cursor, self._block_infos
        while True:  # ``for op in cursor``, a block at a time (issue 16: no call per op)
            block = cursor.block
            if block is None or cursor.op_index >= len(block.ops):
                try:
                    block = cursor.next_block()
                except StopIteration:
                    return
            ops, index = block.ops, cursor.op_index
            infos = block_infos.get(id(block))
            if infos is None:  # every op of a block entered is issued: their infos, in order (the block kept alive),
                # and where a layer stretch's runs begin (:mod:`offsim.engine.layers`)
                infos = block_infos[id(block)] = ([self._info(op) for op in ops], block,
                                                  self.layers.starts(block) if self.layers is not None else {})
            if infos[2]:
                if self._issue_runs(block, infos[0], infos[2]):
                    return
                continue
            iteration, micro_batch, nodes = cursor.iteration, cursor.micro_batch, cursor.nodes
            while index < len(ops):
                op = ops[index]
                info = infos[0][index]
                index += 1
                cursor.op_index = index
                node = Node(op, iteration, micro_batch, info.phase, info)
                nodes.append(node)
                after = info.after
                self._issue(node, ([nodes[after[0]]] if len(after) == 1 else [nodes[a] for a in after]) if after
                            else [], micro_batch)
                if info.main and not node.finished:
                    node.waiters.append(self._advance)
                    return

    def _issue(self, node: Node, deps: list[Node], micro_batch: int,
               stream_last: dict[str, Node] | None = None) -> None:
        """Bind ``node``'s dependencies (``deps``: its ``after`` ops, a list of the caller's that
        this extends); start it if none is pending. ``stream_last``: the last op issued on each
        in-order stream (the run's, unless a program keeps its own)."""
        op, info = node.op, node.info
        last_write = self.last_write
        for x in op.reads:
            w = last_write.get(x if x.mb != CUR_MB else self._bind(x, micro_batch))
            if w is not None:
                deps.append(w)
        if info.ordered:
            if stream_last is None:
                stream_last = self.stream_last
            pred = stream_last.get(op.stream)  # type: ignore[arg-type]
            if pred is not None:
                node.stream_pred = pred
                deps.append(pred)
            stream_last[op.stream] = node  # type: ignore[index]
        for ref in op.writes:
            last_write[ref if ref.mb != CUR_MB else self._bind(ref, micro_batch)] = node
        if info.access:
            self.caches[op.body.cache].on_issue(node)  # type: ignore[union-attr]
        node.head_s = self.clock.now_s
        # :meth:`_wait_all`, inlined (issue 16: once per op instance)
        then = node.then = info.then
        pending = 0
        for d in dict.fromkeys(deps) if len(deps) > 1 else deps:
            if not d.finished:
                d.waiters.append(node)
                pending += 1
        node.pending = pending
        if not pending:
            then(node)

    def _enqueue(self, node: Node) -> None:
        """Wait for the turn of the op's out-of-order stream, then start (the slot is held until
        the op finishes)."""
        queue = node.request = node.info.queue
        queue.request(self._start, node)  # type: ignore[union-attr]

    def _bind(self, ref: TensorRef, micro_batch: int) -> TensorRef:
        """``ref`` with the enclosing micro-batch filled in (memoized: one object per version)."""
        if ref.mb != CUR_MB:
            return ref
        key = (ref, micro_batch)
        bound = self._bound.get(key)
        if bound is None:
            bound = self._bound[key] = bind(ref, micro_batch)
        return bound

    def _wait_all(self, node: Node, deps: list[Node], then: Callable[[Node], None]) -> None:
        """Call ``then(node)`` once every node of ``deps`` has finished (now if they have).

        A node waits by standing in the waiters of each dependency not finished (once each);
        :meth:`_finish` counts it down, and ``then`` is kept on the node until it runs."""
        node.then = then
        pending = 0
        for d in dict.fromkeys(deps) if len(deps) > 1 else deps:
            if not d.finished:
                d.waiters.append(node)
                pending += 1
        node.pending = pending
        if not pending:
            then(node)

    def _program(self, block: Block, origin: Node, after: list[Node]) -> Node:
        """Run a cache's program for the op ``origin`` after ``after``; returns a node that
        finishes when all its ops have."""
        return self._run_program(block, origin, after, None)[1]

    def _run_program(self, block: Block, origin: Node, after: list[Node],
                     stream_last: dict[str, Node] | None) -> tuple[list[Node], Node]:
        """Issue ``block``'s ops for ``origin`` (with ``stream_last``: ordered on in-order streams
        among themselves only); returns its nodes and a node that finishes when all have."""
        nodes: list[Node] = []
        infos = self._infos
        for op in block.ops:
            info = infos.get(id(op)) or self._info(op)
            node = Node(op, origin.iteration, origin.micro_batch, origin.phase, info)
            nodes.append(node)
            self._issue(node, [nodes[a] for a in op.after] + (after if not op.after else []), origin.micro_batch,
                        stream_last)
        end_op = self._end_ops.get(id(block))
        if end_op is None:  # one per program, so that a program's end is the same op each time
            end_op = self._end_ops[id(block)] = Op(-1, Join(), block.ops[0].tag)
        end = Node(end_op, origin.iteration, origin.micro_batch, origin.phase, self._info(end_op))
        end.head_s = self.clock.now_s
        self._wait_all(end, nodes, self._finish)
        return nodes, end

    def _choose(self, node: Node) -> None:
        """Ask the choice's policy (or take its default), run the program chosen in the op's
        place on its stream, and finish when the program has. The policy then learns how long
        the program kept the op's stream."""
        body = node.op.body
        assert isinstance(body, Choose)
        spec = self.schedule.choice(body.choice)
        assert spec is not None, f"no spec for choice {body.choice}"
        policy = self.choice_policies.get(body.choice)
        option = spec.default if policy is None else policy.choose(node.iteration, self.memory.gpu_free_bytes())
        if policy is not None:
            self.choices_taken += 1
        nodes, end = self._run_program(spec.program(body.variant, option), node, [], {})
        last = next((n for n in reversed(nodes) if n.op.stream == node.op.stream), None)
        if policy is not None and last is not None:
            if last.finished:
                policy.observe(option, 0.0)
            else:  # the op started now: its start is the program's
                last.waiters.append(lambda: policy.observe(option, self.clock.now_s - node.start_s))
        self._wait_all(node, [end], self._finish)

    # ------------------------------------------------------------ start and finish
    def _start(self, node: Node) -> None:
        node.start_s = self.clock.now_s
        info = node.info
        if info.main:
            self._track_start(node)
        info.start(node)

    def _start_delay(self, node: Node) -> None:
        self.clock.call_in(node.op.body.seconds, self._kernel_done, node)  # type: ignore[union-attr]

    def _start_alloc(self, node: Node) -> None:
        body = node.op.body
        assert isinstance(body, Alloc)
        self.memory.hold(body.tier, self._bind(body.tensor, node.micro_batch), body.nbytes,
                         lambda: self._what(node), node.op.tag.mechanism)
        self._finish(node)

    def _start_free(self, node: Node) -> None:
        body = node.op.body
        assert isinstance(body, Free)
        self.memory.free(body.tier, self._bind(body.tensor, node.micro_batch))
        self._finish(node)

    def _start_acquire(self, node: Node) -> None:
        body = node.op.body
        assert isinstance(body, Acquire)
        self.pools[body.pool].get(body.amount, self._finish, node)

    def _start_release(self, node: Node) -> None:
        body = node.op.body
        assert isinstance(body, Release)
        self.pools[body.pool].put(body.amount)
        self._finish(node)

    def _hook(self, node: Node) -> None:
        body = node.op.body
        cache = self.caches[body.cache]  # type: ignore[union-attr]
        if isinstance(body, Access):
            cache.access(node)
            self._finish(node)
        elif isinstance(body, Prefetch):
            assert isinstance(cache, FetchTracker)
            cache.prefetch(node, body)
            self._finish(node)
        elif isinstance(body, Ready):
            self._wait_all(node, [cache.ready(node)], self._finish)
        elif isinstance(body, Done):
            self._wait_all(node, cache.done(node), self._finish)
        elif isinstance(body, Flush):
            self._wait_all(node, cache.flush_waits(), self._flush)

    def _flush(self, node: Node) -> None:
        """Empty the cache once the fetches in flight have ended."""
        self.caches[node.op.body.cache].flush(node)  # type: ignore[union-attr]
        self._finish(node)

    def _start_flow(self, node: Node) -> None:
        if node.op.body.copy_engine:  # type: ignore[union-attr]
            self.copy_engines.request(self._dma_go, node)
        else:
            self._flow(node, self._finish)

    def _dma_go(self, node: Node) -> None:
        """A copy engine is granted: the DMA's flow starts, and gives the engine back at its end."""
        self._flow(node, self._dma_end)

    def _flow(self, node: Node, done: Callable[[Node], None]) -> None:
        """Start the op's flow; ``done(node)`` at its end (its usage and cap checked and keyed by
        the network at the op's first instance)."""
        body: Flow = node.op.body  # type: ignore[assignment]
        info = node.info
        usage: dict[str, float] = info.usage  # type: ignore[assignment]
        key = info.flow_key
        if key < 0:
            key = info.flow_key = self._flow_key(info.name, usage, body.cap_bytes_per_s)
        self.net.start_keyed(info.name, body.nbytes, usage, body.cap_bytes_per_s, key, _NO_META, done, node)

    def _flow_key(self, name: str, usage: dict[str, float], cap_bytes_per_s: float) -> int:
        """The network's key of a usage (one of ``_usages``, alive while the executor is) and a cap."""
        key = self._flow_keys.get((id(usage), cap_bytes_per_s))
        if key is None:
            key = self._flow_keys[(id(usage), cap_bytes_per_s)] = self.net.key(name, usage, cap_bytes_per_s)
        return key

    def _dma_end(self, node: Node) -> None:
        self.copy_engines.release()
        self._finish(node)

    def _finish(self, node: Node) -> None:
        """The op has run (a wait of the stream until now is a stall when the op says so); the
        nodes waiting for it count it down, and each that has nothing left to wait for goes on."""
        now = self.clock.now_s
        if node.op.stall is not None:
            self._stall(node, now)
        node.finished = True
        if node.request is not None:
            node.request.release()
        if now > self.end_s:
            self.end_s = now
        if node.info.main:
            self.phases[(node.iteration, node.micro_batch, node.phase)][1] = now
        waiters = node.waiters
        if not waiters:
            return
        node.waiters = []
        for w in waiters:
            if isinstance(w, Node):
                if w.stream_pred is node:
                    w.head_s = now
                w.pending -= 1
                if w.pending == 0:
                    w.then(w)  # type: ignore[misc]  # set by _wait_all
            else:
                w()

    # ------------------------------------------------------------ records
    def _unit(self, op: Op) -> str:
        """The layer's name, or the sub-group, an op works on ("" for neither)."""
        t, names = op.tag, self.schedule.unit_names
        if 0 <= t.layer < len(names):
            return names[t.layer]
        return f"sub-group {t.group}" if t.group >= 0 else ""

    def _label(self, node: Node) -> str:
        return self._unit(node.op)

    def _where(self, op: Op, iteration: int, micro_batch: int) -> str:
        """An op instance, for messages: "forward block3, micro-batch 0, iteration 1"."""
        mb = f", micro-batch {micro_batch}" if micro_batch >= 0 else ""
        return f"{op.tag.phase} {self._unit(op)}{mb}, iteration {iteration}"

    def _what(self, node: Node) -> str:
        """The span name of ``node``'s op (kernels and flows: kept in its info)."""
        return self._info(node.op).name or self._what_op(node.op)

    def _what_op(self, op: Op) -> str:
        """The span name: the layer and the op's label, or the unit and what its activity moves."""
        t = op.tag
        if t.label:
            names = self.schedule.unit_names
            return f"{names[t.layer]} {t.label}" if 0 <= t.layer < len(names) else t.label
        return " ".join(x for x in (self._unit(op), _NOUN.get(t.activity, str(t.activity))) if x)

    def _kernel_done(self, node: Node) -> None:
        info = node.info
        self.rec.spans.append(Span(node.iteration, node.phase, info.resource, info.activity, info.name,
                                   node.op.tag.layer, node.start_s, self.clock.now_s))
        self._finish(node)

    def _flow_done(self, flow: NetFlow) -> None:
        node: Node = flow.arg
        info = node.info
        append, layer, now = self.rec.spans.append, node.op.tag.layer, self.clock.now_s
        for link in info.links:
            append(Span(node.iteration, node.phase, link, info.activity, flow.name, layer, flow.start_s, now,
                        flow.size_bytes))

    def _stall(self, node: Node, end_s: float) -> None:
        """The op's stream waited from its head to ``end_s``: a stall when the op says so."""
        wait = node.op.stall
        if wait is None or end_s <= node.head_s:
            return
        if node.op.stream == self.main:
            self.rec.span(Span(node.iteration, node.phase, "gpu_stall", "stall",
                               f"{self._label(node)} waits for {wait.what}".strip(), node.op.tag.layer,
                               node.head_s, end_s))
        if wait.cache is not None:
            self._cache_event(node.iteration, str(wait.cache), "stall", -1, 0.0, end_s - node.head_s)

    def _cache_event(self, iteration: int, cache: str, kind: str, unit: int, nbytes: float, seconds: float) -> None:
        self.rec.cache(CacheEvent(iteration, cache, kind, unit, nbytes, seconds))

    def _peak_noter(self, cache: str) -> Callable[[float], None]:
        def note(used_bytes: float) -> None:
            info = self.rec.cache_info.get(cache)
            if info is not None:
                info["peak_bytes"] = max(info["peak_bytes"], used_bytes)
        return note

    def _track_start(self, node: Node) -> None:
        """Phases and iteration starts, from the ops of the stream that records stalls (their
        ends: :meth:`_finish`)."""
        key = (node.iteration, node.micro_batch, node.phase)
        if key not in self.phases:
            self.phases[key] = [node.head_s, node.head_s]
            while len(self.rec.iteration_starts_s) <= node.iteration:
                self.rec.iteration_starts_s.append(node.head_s)
                if self.on_iteration is not None and node.iteration > 0:
                    self.on_iteration(node.iteration, self.iterations)

    def _release(self) -> None:
        """Let go of what only the run needed once it is over, so that reference counting frees
        the executor, its op instances and the schedule as soon as the caller drops it. The nodes,
        the caches, the flow network and the shortcut's watcher hold the executor's methods, so
        while it held them they were garbage that only the cycle collector freed, after walking
        all of them (issue 16: a collection over ~28,000 objects after each 175B run; a sweep's
        worker kept every point's schedule until a full collection)."""
        self.cursor.nodes = []
        self.cursor.on_enter = None
        self.last_write = {}
        self.stream_last = {}
        self._infos = {}
        self._block_infos = {}
        self._roles = {}
        self._starters = {}
        for cache in self.caches.values():
            cache.present.clear()
        self.caches = {}
        self.net.on_finish = None
        self.steady = None
        if self.layers is not None:
            self.layer_runs_skipped = self.layers.skipped
        self.layers = None

    def _close(self) -> None:
        for (it, _mb, phase), (start, end) in self.phases.items():
            if phase != str(Phase.INIT):
                self.rec.phases.append((it, phase, start, end))
        self.rec.end_s = self.end_s
        if self.on_iteration is not None:
            self.on_iteration(self.iterations, self.iterations)
