"""A schedule is data: typed ops in blocks, blocks repeated per micro-batch and iteration.

A *system* compiles a run configuration into a :class:`Schedule`; the engine executes it on the
machine's resources without reading any strategy or workload. Each op has one body (what it
does), a :class:`Tag` (what it is, for attribution only: nothing branches on it), a stream (ops
on one stream run in issue order: a CUDA stream, an aio queue, a CPU thread) and its
dependencies:

* ``after``: ids of earlier ops of the same block (control dependencies);
* ``reads`` / ``writes``: tensors. A read binds to *the last write of that tensor issued before
  it*, in whichever block, micro-batch or iteration that was. This is how templates repeat
  without index arithmetic: the fetch of a layer's parameters in iteration *i+1* reads what the
  optimizer step of iteration *i* wrote.

Bytes are integers (rounded once, at compile time), so a free is exact: :class:`Free` releases
what the :class:`Alloc` of the same tensor on the same tier holds, and a free of what is not
held is a :class:`~offsim.core.errors.ScheduleError`.

Runtime decisions go through the policy hooks the schedule names: :class:`Access` (a
policy-managed cache must hold a unit: a miss runs the unit's fetch program, the eviction policy
names victims) and :class:`Prefetch` (the prefetch policy may start later accesses early).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from offsim.core.enums import (
    Activity,
    CacheId,
    ChoiceId,
    Link,
    MechanismId,
    OpKind,
    Phase,
    Res,
    StreamKind,
    TensorKind,
    Tier,
)
from offsim.schedule.fast_init import fast_init

#: ``TensorRef.mb`` of a tensor that belongs to the micro-batch of the block instance it is named in
CUR_MB = -2


@fast_init
@dataclass(frozen=True, slots=True)
class TensorRef:
    """A named piece of training state; its versions are implicit (the last write wins).

    Attributes:
        kind: what it is.
        unit: layer index (-1: not per layer).
        group: optimizer sub-group (-1: not per group).
        mb: micro-batch (-1: not per micro-batch; :data:`CUR_MB`: the enclosing one).
    """

    kind: TensorKind
    unit: int = -1
    group: int = -1
    mb: int = -1

    def __str__(self) -> str:
        parts = [str(self.kind)]
        parts += [f"{k}{v}" for k, v in (("u", self.unit), ("g", self.group), ("mb", self.mb)) if v >= 0]
        if self.mb == CUR_MB:
            parts.append("mb*")
        return ".".join(parts)


@fast_init
@dataclass(frozen=True, slots=True)
class Tag:
    """What an op is, for spans, stalls and metrics. The engine never branches on it.

    Attributes:
        activity: the span kind.
        mechanism: the mechanism that emitted the op.
        phase: forward, backward or optimizer (init for set-up).
        layer: the layer it works on (-1: none).
        group: the optimizer sub-group it works on (-1: none).
        label: display text, never parsed.
    """

    activity: Activity
    mechanism: MechanismId
    phase: Phase
    layer: int = -1
    group: int = -1
    label: str = ""


# ---------------------------------------------------------------- op bodies
@fast_init
@dataclass(frozen=True, slots=True)
class Delay:
    """Busy for ``seconds`` (a GPU kernel, costed from ``flops`` or from HBM bytes)."""

    seconds: float
    flops: float = 0.0
    kind: OpKind = field(default=OpKind.DELAY, init=False)


@fast_init
@dataclass(frozen=True, slots=True)
class Flow:
    """Move ``nbytes`` over shared resources.

    Attributes:
        nbytes: bytes moved (for CPU Adam: DRAM bytes touched).
        usage: (resource, coefficient): the flow uses ``coefficient x rate`` of each resource.
        cap_bytes_per_s: the flow's own limit (transfer curve, latency), bytes/s.
        links: the traffic columns its bytes count on; the first is the track its span lies on.
        copy_engine: it holds one of the GPU's copy engines while it runs (a DMA).
    """

    nbytes: int
    usage: tuple[tuple[Res, float], ...]
    cap_bytes_per_s: float
    links: tuple[Link, ...]
    copy_engine: bool = False
    kind: OpKind = field(default=OpKind.FLOW, init=False)


@fast_init
@dataclass(frozen=True, slots=True)
class Alloc:
    """Hold ``nbytes`` of ``tier`` for ``tensor`` (an error if the tier overflows)."""

    tier: Tier
    nbytes: int
    tensor: TensorRef
    kind: OpKind = field(default=OpKind.ALLOC, init=False)


@fast_init
@dataclass(frozen=True, slots=True)
class Free:
    """Release what ``tensor`` holds on ``tier`` (an error if it holds nothing)."""

    tier: Tier
    tensor: TensorRef
    kind: OpKind = field(default=OpKind.FREE, init=False)


@fast_init
@dataclass(frozen=True, slots=True)
class Acquire:
    """Take ``amount`` of a pool (staging bytes, buffer slots); waits while it lacks them."""

    pool: str
    amount: int
    kind: OpKind = field(default=OpKind.ACQUIRE, init=False)


@fast_init
@dataclass(frozen=True, slots=True)
class Release:
    """Give ``amount`` back to a pool."""

    pool: str
    amount: int
    kind: OpKind = field(default=OpKind.RELEASE, init=False)


@fast_init
@dataclass(frozen=True, slots=True)
class Access:
    """Policy hook: issue the demand for ``unit`` (a hit, or a miss that runs the unit's fetch
    program, :class:`CacheSpec`, after the victims the eviction policy names), then the fetches
    the prefetch policy asks for. It does not wait: :class:`Ready` does."""

    cache: CacheId
    unit: int
    kind: OpKind = field(default=OpKind.ACCESS, init=False)


@fast_init
@dataclass(frozen=True, slots=True)
class Ready:
    """Wait until the cache holds ``unit`` (issued earlier by an :class:`Access` or a prefetch);
    a wait on a stream that records stalls is a stall caused by this cache."""

    cache: CacheId
    unit: int
    kind: OpKind = field(default=OpKind.READY, init=False)


@fast_init
@dataclass(frozen=True, slots=True)
class Prefetch:
    """Policy hook: start fetching the first of ``units`` not yet fetched, in order, while the
    tier keeps ``reserve_bytes`` free besides (activations brought back ahead of backward)."""

    cache: CacheId
    units: tuple[int, ...]
    reserve_bytes: int
    kind: OpKind = field(default=OpKind.PREFETCH, init=False)


@fast_init
@dataclass(frozen=True, slots=True)
class Done:
    """Policy hook: the ops that used ``unit`` have run; the eviction policy may release it."""

    cache: CacheId
    unit: int
    kind: OpKind = field(default=OpKind.DONE, init=False)


@fast_init
@dataclass(frozen=True, slots=True)
class Flush:
    """Wait for the cache's fetches in flight and drop every unit (an iteration's end)."""

    cache: CacheId
    kind: OpKind = field(default=OpKind.FLUSH, init=False)


@fast_init
@dataclass(frozen=True, slots=True)
class Join:
    """Does nothing: a point other ops wait for, or a wait on the stream it sits on."""

    kind: OpKind = field(default=OpKind.JOIN, init=False)


@fast_init
@dataclass(frozen=True, slots=True)
class Choose:
    """A decision taken when the op starts: the policy of ``choice`` picks an option from the
    run so far (GPU memory free now, how long earlier choices kept the stream), the schedule's
    program for (``variant``, option) runs, and the op ends when every op of it has. The
    program's ops on this op's stream run in its place there (after what precedes it, before
    what follows it).

    Attributes:
        choice: which decision (its :class:`ChoiceSpec` and its policy).
        variant: what the programs differ by besides the option (e.g. the iteration's
            sub-group order), passed to :attr:`ChoiceSpec.program`.
    """

    choice: ChoiceId
    variant: Hashable = 0
    kind: OpKind = field(default=OpKind.CHOOSE, init=False)


Body = Delay | Flow | Alloc | Free | Acquire | Release | Access | Ready | Prefetch | Done | Flush | Join | Choose


@fast_init
@dataclass(frozen=True, slots=True)
class Wait:
    """What an op's stream waits for at this op, when it has to wait: its dependencies (and, for
    a flow, the flow itself) are then a stall, reported on streams that record stalls and, with
    ``cache``, counted against that cache.

    Attributes:
        what: what is waited for, for display ("params", "a free gradient buffer").
        cache: the cache the wait is counted against (None: none).
    """

    what: str
    cache: CacheId | None = None


@fast_init
@dataclass(frozen=True, slots=True)
class Op:
    """One op of a block.

    Attributes:
        id: its index in the block.
        body: what it does.
        tag: what it is.
        stream: the in-order queue it runs on; None: it runs as soon as its dependencies allow.
        after: ids of earlier ops of the same block it waits for.
        reads: tensors whose last write it waits for.
        writes: tensors it writes (later reads wait for this op).
        stall: a wait here is a stall on this (None: a wait that is not a stall, e.g. for the step).
    """

    id: int
    body: Body
    tag: Tag
    stream: str | None = None
    after: tuple[int, ...] = ()
    reads: tuple[TensorRef, ...] = ()
    writes: tuple[TensorRef, ...] = ()
    stall: Wait | None = None


# ---------------------------------------------------------------- structure
@dataclass(frozen=True, slots=True)
class Block:
    """A template of ops; ``name`` is display only."""

    name: str
    ops: tuple[Op, ...]


@dataclass(frozen=True, slots=True)
class Instance:
    """One execution of a block: which iteration and micro-batch it belongs to."""

    block: Block
    iteration: int
    micro_batch: int


@dataclass(frozen=True, slots=True)
class Repeat:
    """``times`` executions of ``period`` (blocks or nested repeats) along ``axis``
    (``iteration`` or ``micro_batch``); instance numbers start at ``first``."""

    axis: str
    times: int
    period: tuple[Block | Repeat, ...]
    first: int = 0


@dataclass(frozen=True, slots=True)
class StreamSpec:
    """Where ops run one at a time.

    Attributes:
        name: the stream.
        kind: what it is (GPU compute, copy, aio, CPU thread).
        records_stalls: waits of its ops are reported as stalls (the compute stream).
        in_order: its ops start in issue order, each after the one issued before it (a CUDA
            stream, a thread running a program); False: a queue that serves its ops first come,
            first served as they become ready (copies and aio submitted by host threads when
            their data is there: DeepSpeed's swappers and prefetchers).
    """

    name: str
    kind: StreamKind
    records_stalls: bool = False
    in_order: bool = True


@dataclass(frozen=True, slots=True)
class PoolSpec:
    """A counted resource: copy engines, staging bytes, buffer slots."""

    name: str
    capacity: int


@dataclass(frozen=True, slots=True)
class CacheSpec:
    """A policy-managed cache of units (layers' parameters, optimizer sub-groups).

    Attributes:
        id: which cache.
        tier: where its units live while cached.
        capacity_bytes: its budget (None: unbounded).
        unit_bytes: bytes of each unit.
        fetch: per unit, the program a miss runs (its last op makes the unit resident).
        evict: per unit, the program that drops it (write-back and free).
        persistent: units stay cached across iterations (else emptied at each iteration end).
        writes_back: units are modified while used (optimizer state): a unit that bypassed the
            cache (it does not fit, or the capacity is 0) is written back when its use ends.
    """

    id: CacheId
    tier: Tier
    capacity_bytes: int | None
    unit_bytes: dict[int, int]
    fetch: dict[int, Block]
    evict: dict[int, Block]
    persistent: bool = False
    writes_back: bool = False


@dataclass(frozen=True)
class ChoiceSpec:
    """A run-time decision and the programs it chooses among.

    Attributes:
        id: which decision.
        default: the option taken without a policy, and the one ``offsim schedule`` shows.
        program: (variant, option) -> the program that runs; a pure function of its arguments
            (the schedule builds each program once, on first use).
    """

    id: ChoiceId
    default: Hashable
    program: Callable[[Hashable, Hashable], Block]


@dataclass(frozen=True)
class Schedule:
    """What a system compiled: the body, and the streams, pools and caches its ops name.

    ``iteration_of_block`` and ``micro_batch_of_block`` come from the enclosing repeats when
    instances are enumerated (:meth:`instances`)."""

    body: tuple[Block | Repeat, ...]
    streams: tuple[StreamSpec, ...] = ()
    pools: tuple[PoolSpec, ...] = ()
    caches: tuple[CacheSpec, ...] = ()
    notes: tuple[str, ...] = ()
    unit_names: tuple[str, ...] = ()  # display names of the units (layers), by index
    choices: tuple[ChoiceSpec, ...] = ()

    @cached_property
    def fingerprint(self) -> Fingerprint:
        """What the executor reads of this schedule apart from its run-time choices (the body,
        streams, pools, caches and unit names), as one value hashed once: equal exactly when
        those are equal (``==`` field by field; a cache's dicts compared item by item, in order).
        Worked out on first use and kept (the schedule is frozen); the run memo
        (:mod:`offsim.engine.reuse`) and the time bound's memo (:mod:`offsim.schedule.bound`) key
        on it, so a schedule thousands of ops long is hashed once, not at every look-up (issue 16)."""
        caches = tuple((c.id, c.tier, c.capacity_bytes, tuple(c.unit_bytes.items()), tuple(c.fetch.items()),
                        tuple(c.evict.items()), c.persistent, c.writes_back) for c in self.caches)
        return Fingerprint((self.body, self.streams, self.pools, self.unit_names, caches))

    def instances(self) -> Iterator[Instance]:
        """Every block execution in issue order."""
        yield from _walk(self.body, 0, -1)

    def blocks(self) -> list[Block]:
        """The distinct templates, in first-use order."""
        seen: dict[int, Block] = {}
        for b in _templates(self.body):
            seen.setdefault(id(b), b)
        return list(seen.values())

    def cache(self, cache_id: CacheId) -> CacheSpec | None:
        """The spec of one cache, or None when the schedule has no such cache."""
        return next((c for c in self.caches if c.id == cache_id), None)

    def choice(self, choice_id: ChoiceId) -> ChoiceSpec | None:
        """The spec of one run-time decision, or None when the schedule takes none."""
        return next((c for c in self.choices if c.id == choice_id), None)


class Fingerprint:
    """A hashable value with its hash worked out once (:attr:`Schedule.fingerprint`): equal to
    another when it is the same object, or when the hashes and then the values are equal."""

    __slots__ = ("hash", "parts")

    def __init__(self, parts: tuple[Any, ...]) -> None:
        self.parts = parts
        self.hash = hash(parts)

    def __hash__(self) -> int:
        return self.hash

    def __eq__(self, other: object) -> bool:
        return other is self or (isinstance(other, Fingerprint) and self.hash == other.hash
                                 and self.parts == other.parts)

    def __reduce__(self) -> tuple[type[Fingerprint], tuple[tuple[Any, ...]]]:
        return Fingerprint, (self.parts,)  # hashed again where unpickled (strings hash per process)


def _walk(items: tuple[Block | Repeat, ...], iteration: int, micro_batch: int) -> Iterator[Instance]:
    for item in items:
        if isinstance(item, Block):
            yield Instance(item, iteration, micro_batch)
            continue
        for k in range(item.first, item.first + item.times):
            if item.axis == "iteration":
                yield from _walk(item.period, k, micro_batch)
            else:
                yield from _walk(item.period, iteration, k)


def _templates(items: tuple[Block | Repeat, ...]) -> Iterator[Block]:
    for item in items:
        if isinstance(item, Block):
            yield item
        else:
            yield from _templates(item.period)
