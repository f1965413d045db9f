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

import simpy

from offsim.core.enums import Activity, CacheId, ChoiceId, Phase
from offsim.engine.cursor import Cursor
from offsim.engine.flows import Flow as NetFlow
from offsim.engine.flows import FlowNetwork
from offsim.engine.hooks import CachePolicy, ChoicePolicy, FetchTracker, PolicyCache
from offsim.engine.memory import Memory
from offsim.engine.node import Node
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


#: span names: what an activity moves (display only)
_NOUN = {
    Activity.PARAM_FETCH: "params", Activity.PARAM_GATHER: "params all-gather", Activity.PARAM_UPDATE: "params",
    Activity.GRAD_REDUCE: "grads", Activity.GRAD_OFFLOAD: "grads", Activity.GRAD_ACCUMULATE: "grads accumulate",
    Activity.GRAD_CAST: "grads to fp32", Activity.ACT_OFFLOAD: "activations", Activity.ACT_FETCH: "activations",
    Activity.OPT_SWAP_IN: "state in", Activity.OPT_SWAP_OUT: "state out", Activity.OPT_H2D: "state to GPU",
    Activity.OPT_D2H: "state to host", Activity.OPTIMIZER: "CPU Adam",
}


class Executor:
    """One run of a schedule; :meth:`run` returns the SimPy events processed."""

    def __init__(self, schedule: Schedule, machine: Machine, policies: dict[CacheId, CachePolicy],
                 recorder: Recorder, on_iteration: Callable[[int, int], None] | None = None,
                 choices: dict[ChoiceId, ChoicePolicy] | None = None) -> None:
        self.schedule, self.rec, self.on_iteration = schedule, recorder, on_iteration
        self.choice_policies = choices or {}
        self.env = simpy.Environment()
        self.net = FlowNetwork(self.env, machine.capacity, duplex_rule(machine.duplex_efficiency), self._flow_done)
        self.memory = Memory(lambda: self.env.now, machine.memory_bytes, machine.ranks_per_node, machine.nodes,
                             recorder.level)
        self.copy_engines = simpy.Resource(self.env, capacity=machine.copy_engines)
        self.pools = {p.name: simpy.Container(self.env, capacity=max(p.capacity, 1), init=max(p.capacity, 1))
                      for p in schedule.pools}
        self.main = next((s.name for s in schedule.streams if s.records_stalls), None)
        self.caches: dict[CacheId, PolicyCache | FetchTracker] = {}
        for spec in schedule.caches:
            policy = policies.get(spec.id)
            if policy is None:
                self.caches[spec.id] = FetchTracker(spec, self._program, self.memory.gpu_free_bytes)
            else:
                self.caches[spec.id] = PolicyCache(spec, policy, self._program, self._cache_event,
                                                   self._peak_noter(str(spec.id)), self.memory.gpu_free_bytes)
        self.queues = {s.name: simpy.Resource(self.env, capacity=1) for s in schedule.streams if not s.in_order}
        self.stream_last: dict[str, Node] = {}
        self._bound: dict[tuple[TensorRef, int], TensorRef] = {}
        self.last_write: dict[TensorRef, Node] = {}
        self.phases: dict[tuple[int, int, str], list[float]] = {}
        self.iterations = 0
        self.end_s = 0.0
        self.events = 0
        self.choices_taken = 0  # decisions a choice policy took (the shortcut skips no period with one)
        self.cursor = Cursor(schedule.body)
        self.steady: SteadyState | None = None  # the shortcut's watcher, while and after a run with it
        self._end_ops: dict[int, Op] = {}

    # ------------------------------------------------------------ issue
    def run(self, steady_shortcut: bool = True) -> int:
        """Run to the end; returns the events processed (those of skipped repetitions included).

        ``steady_shortcut``: skip the repetitions of a period that left the run in the state it
        found it (:mod:`offsim.engine.steady`); False simulates every one."""
        self._walk_accesses()
        steady = self.steady = SteadyState(self) if steady_shortcut else None
        if steady is not None:
            self.cursor.on_enter = steady.entered
        self._advance()
        cursor, step = self.cursor, self.env.step
        while True:
            if cursor.crossed:
                frames, cursor.crossed = cursor.crossed, []
                if steady is not None:
                    for frame in frames:
                        steady.at_boundary(frame)
            try:
                step()
            except simpy.core.EmptySchedule:
                break
            self.events += 1
        self._close()
        return self.events

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
        cursor = self.cursor
        for op in cursor:
            micro_batch = cursor.micro_batch
            node = Node(op, cursor.iteration, micro_batch, str(op.tag.phase))
            nodes = cursor.nodes
            nodes.append(node)
            self._issue(node, [nodes[a] for a in op.after], micro_batch)
            if op.stream is not None and op.stream == self.main and not node.finished:
                node.waiters.append(self._advance)
                return

    def _issue(self, node: Node, after: list[Node], micro_batch: int,
               stream_last: dict[str, Node] | None = None) -> None:
        """Bind ``node``'s dependencies; start it if none is pending. ``stream_last``: the last
        op issued on each in-order stream (the run's, unless a program keeps its own)."""
        op = node.op
        if stream_last is None:
            stream_last = self.stream_last
        deps = list(after)
        for x in op.reads:
            w = self.last_write.get(self._bind(x, micro_batch))
            if w is not None:
                deps.append(w)
        queue = self.queues.get(op.stream) if op.stream is not None else None
        if op.stream is not None and queue is None:
            pred = stream_last.get(op.stream)
            if pred is not None:
                node.stream_pred = pred
                deps.append(pred)
            stream_last[op.stream] = node
        for ref in op.writes:
            self.last_write[self._bind(ref, micro_batch)] = node
        if isinstance(op.body, Access):
            self.caches[op.body.cache].on_issue(node)
        node.head_s = self.env.now
        if queue is None:
            self._wait_all(node, deps, lambda: self._start(node))
        else:
            self._wait_all(node, deps, lambda: self._enqueue(node, queue))

    def _enqueue(self, node: Node, queue: simpy.Resource) -> None:
        """Wait for the queue's turn, then start (the slot is held until the op finishes)."""
        req = queue.request()
        node.request = (queue, req)
        req.callbacks.append(lambda _e: self._start(node))

    def _bind(self, ref: TensorRef, micro_batch: int) -> TensorRef:
        """``ref`` with the enclosing micro-batch filled in (memoized: one object per version)."""
        if ref.mb != CUR_MB:
            return ref
        key = (ref, micro_batch)
        bound = self._bound.get(key)
        if bound is None:
            bound = self._bound[key] = bind(ref, micro_batch)
        return bound

    def _wait_all(self, node: Node, deps: list[Node], then: Callable[[], None]) -> None:
        """Call ``then`` once every node of ``deps`` has finished (now if they have)."""
        open_deps = [d for d in set(deps) if not d.finished]
        node.pending = len(open_deps)
        if not open_deps:
            then()
            return

        def one_done(dep: Node) -> Callable[[], None]:
            def cb() -> None:
                if dep is node.stream_pred:
                    node.head_s = self.env.now
                node.pending -= 1
                if node.pending == 0:
                    then()
            return cb

        for d in open_deps:
            d.waiters.append(one_done(d))

    def _program(self, block: Block, origin: Node, after: list[Node]) -> Node:
        """Run a cache's program for the op ``origin`` after ``after``; returns a node that
        finishes when all its ops have."""
        return self._run_program(block, origin, after, None)[1]

    def _run_program(self, block: Block, origin: Node, after: list[Node],
                     stream_last: dict[str, Node] | None) -> tuple[list[Node], Node]:
        """Issue ``block``'s ops for ``origin`` (with ``stream_last``: ordered on in-order streams
        among themselves only); returns its nodes and a node that finishes when all have."""
        nodes: list[Node] = []
        for op in block.ops:
            node = Node(op, origin.iteration, origin.micro_batch, origin.phase)
            nodes.append(node)
            self._issue(node, [nodes[a] for a in op.after] + (after if not op.after else []), origin.micro_batch,
                        stream_last)
        end_op = self._end_ops.get(id(block))
        if end_op is None:  # one per program, so that a program's end is the same op each time
            end_op = self._end_ops[id(block)] = Op(-1, Join(), block.ops[0].tag)
        end = Node(end_op, origin.iteration, origin.micro_batch, origin.phase)
        end.head_s = self.env.now
        self._wait_all(end, nodes, lambda: self._finish(end))
        return nodes, end

    def _choose(self, node: Node, body: Choose) -> None:
        """Ask the choice's policy (or take its default), run the program chosen in the op's
        place on its stream, and finish when the program has. The policy then learns how long
        the program kept the op's stream."""
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
                last.waiters.append(lambda: policy.observe(option, self.env.now - node.start_s))
        self._wait_all(node, [end], lambda: self._finish(node))

    # ------------------------------------------------------------ start and finish
    def _start(self, node: Node) -> None:
        node.start_s = self.env.now
        self._track_main(node)
        body = node.op.body
        if isinstance(body, Delay):
            self.env.timeout(body.seconds).callbacks.append(lambda _e: self._kernel_done(node))
        elif isinstance(body, Flow):
            self._start_flow(node, body)
        elif isinstance(body, Alloc):
            self.memory.hold(body.tier, self._bind(body.tensor, node.micro_batch), body.nbytes,
                             lambda: self._what(node))
            self._finish(node)
        elif isinstance(body, Free):
            self.memory.free(body.tier, self._bind(body.tensor, node.micro_batch))
            self._finish(node)
        elif isinstance(body, Acquire):
            self.pools[body.pool].get(body.amount).callbacks.append(lambda _e: self._finish(node))
        elif isinstance(body, Release):
            self.pools[body.pool].put(body.amount)
            self._finish(node)
        elif isinstance(body, Join):
            self._finish(node)
        elif isinstance(body, Choose):
            self._choose(node, body)
        else:
            self._hook(node)

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
            self._wait_all(node, [cache.ready(node)], lambda: self._finish(node))
        elif isinstance(body, Done):
            self._wait_all(node, cache.done(node), lambda: self._finish(node))
        elif isinstance(body, Flush):
            def flush() -> None:
                cache.flush(node)
                self._finish(node)
            self._wait_all(node, cache.flush_waits(), flush)

    def _start_flow(self, node: Node, body: Flow) -> None:
        meta = {"node": node, "name": self._what(node)}
        usage = {str(r): c for r, c in body.usage}
        if not body.copy_engine:
            self.net.start(body.nbytes, usage, body.cap_bytes_per_s, meta).callbacks.append(
                lambda _e: self._finish(node))
            return
        req = self.copy_engines.request()

        def go(_e: simpy.Event) -> None:
            def end(_d: simpy.Event) -> None:
                self.copy_engines.release(req)
                self._finish(node)
            self.net.start(body.nbytes, usage, body.cap_bytes_per_s, meta).callbacks.append(end)
        req.callbacks.append(go)

    def _finish(self, node: Node) -> None:
        """The op has run (a wait of the stream until now is a stall when the op says so)."""
        if node.op.stall is not None:
            self._stall(node, self.env.now)
        node.finished = True
        if node.request is not None:
            queue, req = node.request
            queue.release(req)
        self.end_s = max(self.end_s, self.env.now)
        self._track_main(node, end=True)
        waiters, node.waiters = node.waiters, []
        for w in waiters:
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
        """The span name: the layer and the op's label, or the unit and what its activity moves."""
        t = node.op.tag
        if t.label:
            names = self.schedule.unit_names
            return f"{names[t.layer]} {t.label}" if 0 <= t.layer < len(names) else t.label
        return " ".join(x for x in (self._label(node), _NOUN.get(t.activity, str(t.activity))) if x)

    def _kernel_done(self, node: Node) -> None:
        t = node.op.tag
        self.rec.span(Span(node.iteration, node.phase, "gpu", str(t.activity), self._what(node), t.layer, node.start_s,
                           self.env.now))
        self._finish(node)

    def _flow_done(self, flow: NetFlow) -> None:
        node: Node = flow.meta["node"]
        body = node.op.body
        assert isinstance(body, Flow)
        for link in body.links:
            self.rec.span(Span(node.iteration, node.phase, str(link), str(node.op.tag.activity), flow.name,
                               node.op.tag.layer, flow.start_s, self.env.now, body.nbytes))

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

    def _track_main(self, node: Node, end: bool = False) -> None:
        """Phases and iteration starts, from the ops of the stream that records stalls."""
        if node.op.stream != self.main or node.op.stream is None:
            return
        key = (node.iteration, node.micro_batch, node.phase)
        if end:
            self.phases[key][1] = self.env.now
            return
        if key not in self.phases:
            self.phases[key] = [node.head_s, node.head_s]
            while len(self.rec.iteration_starts_s) <= node.iteration:
                self.rec.iteration_starts_s.append(node.head_s)
                if self.on_iteration is not None and node.iteration > 0:
                    self.on_iteration(node.iteration, self.iterations)

    def _close(self) -> None:
        for (it, _mb, phase), (start, end) in self.phases.items():
            if phase != str(Phase.INIT):
                self.rec.phases.append((it, phase, start, end))
        self.rec.end_s = self.end_s
        if self.on_iteration is not None:
            self.on_iteration(self.iterations, self.iterations)
