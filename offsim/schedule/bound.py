"""The least time of a steady iteration, read off the compiled schedule (architecture.md §9).

No resource does more work per second than its capacity, and no stream runs two ops at once, so a
steady iteration lasts at least as long as the largest of these terms:

* **a shared resource** (:class:`~offsim.core.enums.Res`: each PCIe direction, the switch uplinks,
  host DRAM, the host memcpy engine, the CPU optimizer's cores, the NVMe array, the PFS, the GPU
  links): the work the iteration's flows put on it, ``sum(coefficient x bytes)``, over its
  capacity. This is how the engine prices a flow (:mod:`offsim.engine.flows`: the flows' rates
  times their coefficients never sum above a capacity; the duplex rule only lowers the PCIe
  capacities), so NVMe reads and writes share the array's time (coefficients ``1/read_rate``,
  ``1/write_rate`` on a capacity of the rank's share) and CPU Adam's DRAM bytes count on ``cpu``
  at ``1/bytes_per_param``;
* **a stream** (the GPU compute stream, a copy or aio queue, a CPU thread): the engine runs its
  ops one at a time (:meth:`offsim.engine.execute.Executor._issue`: an in-order op waits for its
  predecessor; an out-of-order queue holds one slot), so the sum of its ops' least durations: a
  :class:`~offsim.schedule.ops.Delay`'s seconds, a :class:`~offsim.schedule.ops.Flow` alone on
  the machine (its bytes over the least of its cap and each resource's capacity over its
  coefficient, :func:`offsim.engine.flows.fair_rates` with one flow);
* **the GPU's copy engines**: the least durations of the flows that hold one, over their number;
* **the GPU compute stream and what it waits for** (:data:`GPU_CHAIN`, shown when above the
  stream's busy time): the engine issues an op only once every op of the compute stream before
  it has ended (that stream is its program counter), so each block lasts at least the longest
  chain of least durations from its issue to the end of its last compute-stream op, through
  ``after`` ops, in-order stream predecessors and the block's own writers of what an op reads
  (tensors no program writes). A step the GPU waits for (DeepSpeed's, without the delayed
  parameter update) is counted this way; waits on earlier blocks only add time.

Work left to run time counts at its least, from the schedule's specs alone:

* a cache's :class:`~offsim.schedule.ops.CacheSpec`: a cache that is not persistent starts every
  iteration empty, so each unit it serves is fetched at least once, and written back at least
  once when the iteration's :class:`~offsim.schedule.ops.Flush` drops it; a cache without evict
  programs that is not persistent has its units freed by their users (activations brought back
  for backward), so each unit is fetched once per micro-batch that asks for it
  (:class:`offsim.engine.hooks.FetchTracker`); a persistent cache of ``C`` bytes holds at most
  ``C`` when an iteration starts, so at least ``served - C`` bytes miss and, the cache holding as
  much at the end, at least ``served - 2C`` are evicted, each resource's term priced at the
  units cheapest for it (a unit larger than the cache bypasses it: fetched, and written back if
  the cache writes back, every iteration);
* a :class:`~offsim.schedule.ops.Choose`: the options are not listed in its
  :class:`~offsim.schedule.ops.ChoiceSpec`, so its program counts as no work (a weaker bound,
  still a bound).

Work is summed per iteration and averaged over the iterations the metrics average
(:func:`offsim.metrics.steady_iterations`); the init block is left out. Latencies, contention,
the duplex loss, dependencies and stalls only add time.
"""

from __future__ import annotations

import threading
from collections import Counter, OrderedDict
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from offsim.core.enums import CacheId, Res, StreamKind, TensorKind
from offsim.schedule.ops import (
    Access,
    Block,
    CacheSpec,
    Choose,
    Delay,
    Flow,
    Flush,
    Op,
    Ready,
    Repeat,
    Schedule,
    TensorRef,
)

#: the term of the GPU's copy engines
COPY_ENGINES = "GPU copy engines"
#: the term of the stream that records stalls (the GPU's compute stream)
GPU_COMPUTE = "GPU compute"
#: the term of the GPU compute stream's ops and the chains of ops they wait for inside each block
GPU_CHAIN = "GPU compute and its waits"

#: the names terms of shared resources carry
RES_NAMES: dict[Res, str] = {
    Res.H2D: "PCIe H2D", Res.D2H: "PCIe D2H", Res.SWITCH_H2D: "PCIe switch H2D",
    Res.SWITCH_D2H: "PCIe switch D2H", Res.DRAM: "host DRAM", Res.MEMCPY: "host memcpy",
    Res.CPU: "CPU optimizer", Res.NVME: "NVMe array", Res.PFS_READ: "PFS read", Res.PFS_WRITE: "PFS write",
    Res.GPU_LINK_TX: "GPU link TX", Res.GPU_LINK_RX: "GPU link RX",
}
_STREAM_NOUN = {StreamKind.GPU_COMPUTE: "GPU stream", StreamKind.COPY: "copy queue", StreamKind.AIO: "aio queue",
                StreamKind.CPU: "CPU thread"}
#: a cache's budget is enforced to this slack, relative and in bytes (``offsim/engine/cache.py``,
#: ``_SLACK``, in :meth:`~offsim.engine.cache.Cache.cacheable` and ``_fits``)
_SLACK = 1e-9

#: work per term name: capacity units x seconds for a resource, seconds for a stream
Work = dict[str, float]


@dataclass(frozen=True)
class ScheduleBound:
    """A lower bound on the steady iteration time of a schedule on a machine.

    Attributes:
        seconds: the bound (the largest term).
        binding: the name of the largest term ("GPU compute", "PCIe H2D", "NVMe array"...).
        terms_s: every term, seconds.
    """

    seconds: float
    binding: str
    terms_s: dict[str, float]


@dataclass
class _Tally:
    """What one iteration's templates hold: their ops' work, and what they ask of each cache."""

    work: Work = field(default_factory=dict)
    seen: dict[CacheId, set[int]] = field(default_factory=dict)  # units asked for
    per_mb: dict[CacheId, Counter[int]] = field(default_factory=dict)  # micro-batches asking for each
    flushed: set[CacheId] = field(default_factory=set)


def _add(into: Work, work: Mapping[str, float], times: float = 1.0) -> None:
    for k, v in work.items():
        into[k] = into.get(k, 0.0) + times * v


class _Pricer:
    """Least work of ops on one machine (capacities as the engine's flow network has them)."""

    def __init__(self, schedule: Schedule, capacity: Mapping[str, float], copy_engines: int) -> None:
        self.capacity = {str(k): float(v) for k, v in capacity.items()}
        self.copy_engines = max(copy_engines, 1)
        self.stream_term = {s.name: GPU_COMPUTE if s.records_stalls else f"{_STREAM_NOUN[s.kind]} '{s.name}'"
                            for s in schedule.streams}
        self.main = next((st.name for st in schedule.streams if st.records_stalls), None)
        self.in_order = {st.name for st in schedule.streams if st.in_order}
        self.shared_kinds = _program_written_kinds(schedule)
        self._blocks: dict[tuple[int, bool], tuple[Block, Work]] = {}

    def flow_s(self, flow: Flow) -> float:
        """The flow alone on the machine: its bytes over its fastest rate."""
        rate = flow.cap_bytes_per_s
        for res, coef in flow.usage:
            if coef > 0 and str(res) in self.capacity:
                rate = min(rate, self.capacity[str(res)] / coef)
        return flow.nbytes / rate if rate > 0 else 0.0

    def op(self, op: Op) -> tuple[Work, float]:
        """What one op puts on each term, and its least duration (a kernel's seconds, a flow
        alone; 0 for the others: a wait may find what it waits for done)."""
        body, out = op.body, Work()
        if isinstance(body, Delay):
            seconds = body.seconds
        elif isinstance(body, Flow):
            seconds = self.flow_s(body)
            for res, coef in body.usage:
                name = RES_NAMES[res]
                out[name] = out.get(name, 0.0) + coef * body.nbytes
            if body.copy_engine:
                out[COPY_ENGINES] = seconds
        else:
            return out, 0.0
        if op.stream is not None and op.stream in self.stream_term:
            out[self.stream_term[op.stream]] = seconds
        return out, seconds

    def block(self, block: Block, chain: bool = False) -> Work:
        """What every op of ``block`` puts on each term (worked out once per template); with
        ``chain``, the main stream's chain through it too (:meth:`chain_s`)."""
        key = (id(block), chain)
        got = self._blocks.get(key)
        if got is None:
            work, least = Work(), []
            for op in block.ops:
                w, s = self.op(op)
                _add(work, w)
                least.append(s)
            if chain and self.main is not None:
                work[GPU_CHAIN] = self.chain_s(block, least)
            got = self._blocks[key] = (block, work)
        return got[1]

    def chain_s(self, block: Block, least_s: Sequence[float]) -> float:
        """Least time from the block's issue to the end of its last op on the main stream
        (``least_s``: each op's least duration).

        The main stream is the engine's program counter (:meth:`offsim.engine.execute.Executor._advance`):
        an op is issued once every main-stream op before it has ended, so none starts before the
        main stream's earlier ops end; it waits besides for its ``after`` ops, the op before it
        on its in-order stream and the writer in the block of what it reads (a tensor no
        program writes, so that writer is its last). Waits on earlier blocks only add time."""
        end: list[float] = []
        last_on: dict[str, int] = {}
        writer: dict[TensorRef, int] = {}
        pc = 0.0
        for op in block.ops:
            start = pc
            for d in op.after:
                start = max(start, end[d])
            if op.stream in self.in_order and op.stream in last_on:
                start = max(start, end[last_on[op.stream]])
            for r in op.reads:
                if r in writer and r.kind not in self.shared_kinds:
                    start = max(start, end[writer[r]])
            end.append(start + least_s[op.id])
            if op.stream is not None:
                last_on[op.stream] = op.id
            for w in op.writes:
                writer[w] = op.id
            if op.stream == self.main:
                pc = end[-1]
        return pc

    def seconds(self, work: Mapping[str, float]) -> dict[str, float]:
        """Work over capacity, per term (a resource missing on the machine is left out)."""
        res_of = {name: str(r) for r, name in RES_NAMES.items()}
        out: dict[str, float] = {}
        for name, w in work.items():
            if name in res_of:
                cap = self.capacity.get(res_of[name], 0.0)
                if cap > 0:
                    out[name] = w / cap
            elif name == COPY_ENGINES:
                out[name] = w / self.copy_engines
            else:
                out[name] = w
        return out


def _program_written_kinds(schedule: Schedule) -> set[TensorKind]:
    """Kinds of tensors that programs run at run time write (caches' fetch and evict programs,
    the choices' programs at their default option): a read of one may bind to such a write."""
    blocks = [b for c in schedule.caches for progs in (c.fetch, c.evict) for b in progs.values()]
    for choice in schedule.choices:
        for block in schedule.blocks():
            blocks += [choice.program(op.body.variant, choice.default) for op in block.ops
                       if isinstance(op.body, Choose) and op.body.choice == choice.id]
    return {w.kind for b in blocks for op in b.ops for w in op.writes}


def _block_tally(pricer: _Pricer, block: Block, tally: _Tally, scope: dict[CacheId, set[int]]) -> None:
    _add(tally.work, pricer.block(block, chain=True))
    for op in block.ops:
        body = op.body
        if isinstance(body, Access | Ready):
            tally.seen.setdefault(body.cache, set()).add(body.unit)
            scope.setdefault(body.cache, set()).add(body.unit)
        elif isinstance(body, Flush):
            tally.flushed.add(body.cache)


def _tally(pricer: _Pricer, items: Iterable[Block | Repeat]) -> _Tally:
    """The work and cache demands of one iteration's period; units asked for by the blocks of one
    level share a micro-batch, each instance of a micro-batch repeat has its own."""
    out, scope = _Tally(), dict[CacheId, set[int]]()
    for item in items:
        if isinstance(item, Block):
            _block_tally(pricer, item, out, scope)
            continue
        inner = _tally(pricer, item.period)
        _add(out.work, inner.work, item.times)
        out.flushed |= inner.flushed
        for cache, units in inner.seen.items():
            out.seen.setdefault(cache, set()).update(units)
            if item.axis == "micro_batch":
                out.per_mb.setdefault(cache, Counter()).update(dict.fromkeys(units, item.times))
            else:
                scope.setdefault(cache, set()).update(units)
    for cache, units in scope.items():
        out.per_mb.setdefault(cache, Counter()).update(units)
    return out


def _cheapest(need_bytes: float, units: Sequence[tuple[int, Work]], key: str) -> float:
    """The least work on ``key`` of ``need_bytes`` of the units (size, work), fractionally."""
    total = 0.0
    for size, work in sorted(units, key=lambda u: u[1].get(key, 0.0) / u[0] if u[0] else 0.0):
        if need_bytes <= 0:
            break
        share = min(1.0, need_bytes / size) if size else 1.0
        total += share * work.get(key, 0.0)
        need_bytes -= size
    return total


def _least_of(need_bytes: float, units: Sequence[tuple[int, Work]]) -> Work:
    keys = {k for _, w in units for k in w}
    return {k: _cheapest(need_bytes, units, k) for k in keys}


def _cache_work(pricer: _Pricer, spec: CacheSpec, tally: _Tally) -> Work:
    """The least work of one iteration's misses and write-backs of ``spec`` (module docstring)."""
    out = Work()
    seen = sorted(u for u in tally.seen.get(spec.id, set()) if u in spec.fetch)

    def fetch(u: int) -> Work:
        return pricer.block(spec.fetch[u])

    def evict(u: int) -> Work:
        return pricer.block(spec.evict[u]) if u in spec.evict else {}

    if not spec.persistent and not spec.evict:
        for u, times in tally.per_mb.get(spec.id, Counter()).items():
            if u in spec.fetch:
                _add(out, fetch(u), times)
        return out
    cap = float("inf") if spec.capacity_bytes is None else spec.capacity_bytes * (1 + _SLACK) + _SLACK
    bypass = [u for u in seen if spec.unit_bytes[u] > cap]
    kept = [u for u in seen if spec.unit_bytes[u] <= cap]
    for u in bypass:
        _add(out, fetch(u))
        if spec.writes_back:
            _add(out, evict(u))
    if not spec.persistent:
        for u in kept:
            _add(out, fetch(u))
            if spec.id in tally.flushed:
                _add(out, evict(u))
        return out
    served = sum(spec.unit_bytes[u] for u in kept)
    _add(out, _least_of(served - cap, [(spec.unit_bytes[u], fetch(u)) for u in kept]))
    _add(out, _least_of(served - 2 * cap, [(spec.unit_bytes[u], evict(u)) for u in kept]))
    return out


def _iteration_periods(schedule: Schedule) -> dict[int, tuple[Block | Repeat, ...]]:
    """Per iteration, the period its instance runs (the init block left out)."""
    out: dict[int, tuple[Block | Repeat, ...]] = {}
    for item in schedule.body:
        if isinstance(item, Repeat) and item.axis == "iteration":
            for k in range(item.first, item.first + item.times):
                out[k] = item.period
        elif isinstance(item, Repeat):  # micro-batches without an iteration repeat: one iteration
            out.setdefault(0, (item,))
    return out


#: the terms of the schedules bounded last (:func:`iteration_work`), by their inputs
_MEMO: OrderedDict[tuple[Hashable, ...], dict[str, float]] = OrderedDict()
#: how many :data:`_MEMO` keeps (each holds its schedule: a 7B one is some 3,000 ops)
MEMO_KEPT = 64
_MEMO_LOCK = threading.Lock()  # a Dask worker may run points in several threads


def iteration_work(schedule: Schedule, capacity: Mapping[str, float], copy_engines: int,
                   iterations: Sequence[int] | None = None) -> dict[str, float]:
    """Seconds per term of the least work one iteration puts there, averaged over ``iterations``
    (None: every iteration after the first, or the first when there is one).

    A pure function of its inputs: the terms of the last :data:`MEMO_KEPT` inputs are kept, the
    schedule known by its :attr:`~offsim.schedule.ops.Schedule.fingerprint` (a schedule with
    run-time choices, whose programs the fingerprint leaves out, is bounded every time). A
    sweep's points that compile to one schedule on one machine (they differ in the DRAM size
    alone, say) are bounded once (issue 16)."""
    key = None if schedule.choices else (
        schedule.fingerprint, tuple(sorted((str(k), float(v)) for k, v in capacity.items())), copy_engines,
        None if iterations is None else tuple(iterations))
    if key is not None:
        with _MEMO_LOCK:
            held = _MEMO.get(key)
            if held is not None:
                _MEMO.move_to_end(key)
                return dict(held)
    terms = _iteration_work(schedule, capacity, copy_engines, iterations)
    if key is not None:
        with _MEMO_LOCK:
            _MEMO[key] = dict(terms)
            while len(_MEMO) > MEMO_KEPT:
                _MEMO.popitem(last=False)
    return terms


def _iteration_work(schedule: Schedule, capacity: Mapping[str, float], copy_engines: int,
                    iterations: Sequence[int] | None) -> dict[str, float]:
    """:func:`iteration_work`, worked out."""
    pricer = _Pricer(schedule, capacity, copy_engines)
    periods = _iteration_periods(schedule)
    if iterations is None:
        iterations = [k for k in periods if k > 0] or list(periods)
    chosen = [k for k in iterations if k in periods]
    total, tallies = Work(), dict[int, Work]()
    for k in chosen:
        key = id(periods[k])
        if key not in tallies:
            tally = _tally(pricer, periods[k])
            work = dict(tally.work)
            for spec in schedule.caches:
                _add(work, _cache_work(pricer, spec, tally))
            tallies[key] = work
        _add(total, tallies[key], 1.0 / len(chosen))
    if total.get(GPU_CHAIN, 0.0) <= total.get(GPU_COMPUTE, 0.0) * (1 + 1e-12):
        total.pop(GPU_CHAIN, None)  # the stream waits for nothing a block shows: its busy time says it
    return pricer.seconds(total)


def schedule_bound(schedule: Schedule, capacity: Mapping[str, float], copy_engines: int,
                   iterations: Sequence[int] | None = None) -> ScheduleBound:
    """A lower bound on the steady iteration time of ``schedule`` on a machine with ``capacity``
    per resource (as :class:`offsim.engine.execute.Machine` has it) and ``copy_engines`` DMA
    engines, averaged over ``iterations`` (module docstring)."""
    terms = iteration_work(schedule, capacity, copy_engines, iterations)
    if not terms:
        return ScheduleBound(0.0, GPU_COMPUTE, {GPU_COMPUTE: 0.0})
    binding = max(terms, key=lambda k: terms[k])
    return ScheduleBound(terms[binding], binding, terms)
