"""What every mechanism shares: the numbers a build starts from, the sites of an order, and a
builder that numbers ops and binds their dependencies.

A mechanism is asked for its ops at every *site* of a system's order (a layer's forward or
backward in one micro-batch, the optimizer step, the iteration's start and end). It takes its
parameters in its constructor (only the system file reads the configuration), computes its
numbers once, and emits ops that read only those numbers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol

from offsim.core.enums import Activity, MechanismId, Phase, Tier
from offsim.schedule.ops import (
    Block,
    Body,
    CacheSpec,
    ChoiceSpec,
    Flow,
    Op,
    PoolSpec,
    StreamSpec,
    Tag,
    TensorRef,
    Wait,
)

#: storage I/O striped over paths that run at once: each flow with the pool slot it holds (or None)
StorageIO = tuple[tuple[Flow, str | None], ...]
#: the pools of the per-path I/O concurrency cap (``io_concurrency`` slots each)
IO_POOLS = ("io_nvme", "io_pfs")


def io_pools(io_concurrency: int | None) -> tuple[PoolSpec, ...]:
    """The slots of the per-path I/O concurrency cap (none without a cap)."""
    return () if io_concurrency is None else tuple(PoolSpec(p, io_concurrency) for p in IO_POOLS)


class SiteKind(StrEnum):
    """Where in the order ops are emitted."""

    INIT = "init"                # once, before the first iteration (static state, host set-up)
    FORWARD = "forward"          # one layer's forward in one micro-batch
    BACKWARD = "backward"        # one layer's backward in one micro-batch
    ITERATION_END = "iteration_end"  # after the last backward, before the step
    STEP = "step"                # the optimizer step


class Stage(StrEnum):
    """A step within a site; a system's order lists (mechanism, stage) pairs per site kind."""

    ISSUE = "issue"    # start fetches (no wait)
    WAIT = "wait"      # wait for what was issued
    BEFORE = "before"  # allocate what the kernels need
    RUN = "run"        # the kernels
    AFTER = "after"    # free, offload, send gradients
    DONE = "done"      # the layer's use of cached units ended


@dataclass(frozen=True, slots=True)
class Site:
    """One place in the order.

    Attributes:
        what: the kind of site.
        layer: the layer (forward / backward sites), else -1.
        position: the layer's position in this pass (0 = the first layer the pass visits).
        first_mb / last_mb: the first / the last micro-batch of the iteration (the last is the
            boundary before the step).
        first_iteration: the first iteration (DeepSpeed's first step creates the moments).
        iteration: the iteration (only for sites whose ops differ per iteration, e.g. the
            optimizer order), else -1.
    """

    what: SiteKind
    layer: int = -1
    position: int = 0
    first_mb: bool = True
    last_mb: bool = True
    first_iteration: bool = False
    iteration: int = -1


@dataclass
class BlockBuilder:
    """Collects one block's ops, numbering them in emission order."""

    name: str
    ops: list[Op] = field(default_factory=list)
    marks: dict[object, int] = field(default_factory=dict)  # op ids a mechanism refers to later

    def add(self, body: Body, tag: Tag, stream: str | None = None, after: Sequence[int] = (),
            reads: Sequence[TensorRef] = (), writes: Sequence[TensorRef] = (), stall: Wait | None = None) -> int:
        """Append an op; returns its id."""
        ops = self.ops
        op_id = len(ops)
        deps = tuple(after) if len(after) < 2 else tuple(sorted(set(after)))  # most ops wait for 0 or 1
        # most callers pass tuples already (``tuple(t)`` of a tuple is the tuple itself, but a call)
        ops.append(Op(op_id, body, tag, stream, deps, reads if type(reads) is tuple else tuple(reads),
                      writes if type(writes) is tuple else tuple(writes), stall))
        return op_id

    def last_on(self, stream: str) -> int | None:
        """The id of the last op emitted on ``stream`` so far, or None."""
        return next((op.id for op in reversed(self.ops) if op.stream == stream), None)

    def build(self) -> Block:
        """The finished template."""
        return Block(self.name, tuple(self.ops))


def parallel(b: BlockBuilder, flows: StorageIO, t: Tag, after: Sequence[int], stream: str | None = None) -> int:
    """Flows that run at once after ``after`` (each with the pool slot it holds, if any: the
    per-path I/O concurrency cap); returns the id of the join that ends when all have."""
    from offsim.schedule.ops import Acquire, Join, Release

    ends = []
    for flow, pool in flows:
        last = b.add(Acquire(pool, 1), t, after=after) if pool else None
        last = b.add(flow, t, after=after if last is None else [last])
        ends.append(b.add(Release(pool, 1), t, after=[last]) if pool else last)
    return b.add(Join(), t, stream, after=ends or after)


#: the tags :func:`tag` has made, by their fields: a tag is frozen, so equal tags can be one
#: object (a 175B schedule makes ~9,500 tags, most of them repeats of a few hundred). Emptied when
#: it reaches :data:`TAGS_KEPT` (labels are free text, so a long sweep could make many).
_TAGS: dict[tuple[Activity, MechanismId, Phase, int, int, str], Tag] = {}
TAGS_KEPT = 1 << 16


def tag(activity: Activity, mechanism: MechanismId, phase: Phase, layer: int = -1, group: int = -1,
        label: str = "") -> Tag:
    """A :class:`Tag` (shorthand); equal fields give the same object (:data:`_TAGS`; a dict
    look-up, ~0.17 us, against ~0.53 us to build one: issue 16)."""
    key = (activity, mechanism, phase, layer, group, label)
    made = _TAGS.get(key)
    if made is None:
        if len(_TAGS) >= TAGS_KEPT:
            _TAGS.clear()
        made = _TAGS[key] = Tag(activity, mechanism, phase, layer, group, label)
    return made


class Moment(StrEnum):
    """When a transient need is held; transients of different moments never coexist.

    ``FORWARD_BACKWARD`` is what forward and backward hold and the last backward frees: the
    activations kept for backward, those in flight and backward's working memory. DeepSpeed's
    step runs after it (engine.py ``DeepSpeedEngine.step`` acts at the boundary, after the last
    micro-batch's ``backward`` has released them; deepspeed_runtime.md §13: fwd, bwd, then the
    step, nothing overlapping), so the GPU's peak is the larger of backward's and the step's
    transients, not their sum. A step that overlaps forward or backward (the delayed parameter
    update, the layer-wise update inside backward, ZenFlow's selective step) declares its needs
    held (moment None) instead.
    """

    START_UP = "start-up"              # the set-up before the first iteration
    FORWARD_BACKWARD = "forward and backward"  # activations and backward's working memory
    STEP_START = "step start"          # the checks before the sub-group loop (overflow check)
    FIRST_STEP = "first step"          # the first step's sub-groups (moments created)
    STEP = "step"                      # a GPU step's per-sub-group temporaries


@dataclass(frozen=True, slots=True)
class Need:
    """Memory a mechanism holds at its peak, per rank, from the numbers it emits its ops with.

    Attributes:
        tier: where.
        what: a readable label (the fit check's breakdown names it).
        nbytes: bytes at the peak.
        moment: None: held through the iteration (added to every other such need); else held only
            at that moment (the footprint adds the largest moment's transients).
        unit_bytes: > 0: an elastic need, whole units of this size taken from what the other needs
            leave free, ``nbytes`` at most (Deep Optimizer States' streamed sub-groups: the run-time
            split sends only what fits, so it never makes a plan infeasible).
    """

    tier: Tier
    what: str
    nbytes: float
    moment: Moment | None = None
    unit_bytes: float = 0.0


@dataclass(frozen=True)
class Setup:
    """What a mechanism owns besides its ops: streams, pools, caches and run-time choices."""

    streams: tuple[StreamSpec, ...] = ()
    pools: tuple[PoolSpec, ...] = ()
    caches: tuple[CacheSpec, ...] = ()
    choices: tuple[ChoiceSpec, ...] = ()


class Mechanism(Protocol):
    """One mechanism: its ops at each site and what it owns."""

    id: MechanismId

    def setup(self) -> Setup:
        """Streams, pools and caches it owns."""
        ...

    def emit(self, b: BlockBuilder, site: Site, stage: Stage) -> None:
        """Append its ops for ``stage`` of ``site`` to ``b``."""
        ...

    def footprint(self) -> tuple[Need, ...]:
        """What it holds at its peak, per rank (:class:`Need`), from the numbers its ops carry."""
        ...


#: the footprint's tiers (per rank), and the one each memory tier is counted in
NEED_TIERS = ("gpu", "host_pinned", "host", "nvme", "pfs")
_NEED_TIER = {Tier.GPU: "gpu", Tier.HOST_PINNED: "host_pinned", Tier.HOST_PAGEABLE: "host", Tier.NVME: "nvme",
              Tier.PFS: "pfs"}


def sum_needs(needs: Sequence[Need], gpu_capacity_bytes: float) -> dict[str, dict[str, float]]:
    """Per footprint tier (:data:`NEED_TIERS`), bytes per item at the peak, per rank: every need
    held through the iteration, plus the transients of the moment that holds the most, plus the
    elastic needs in whole units of what the GPU has left (``gpu_capacity_bytes``).

    The moment is chosen for the GPU on its own and for the host and storage tiers together (the
    host's check adds pinned and pageable bytes, so one moment keeps them consistent): each tier
    is checked against its own capacity, and the GPU's peak (backward or the step) need not be at
    the moment the host's is (start-up, the first step)."""
    bd: dict[str, dict[str, float]] = {t: {} for t in NEED_TIERS}

    def add(n: Need, nbytes: float) -> None:
        if nbytes > 0:
            items = bd[_NEED_TIER[n.tier]]
            items[n.what] = items.get(n.what, 0.0) + nbytes

    for n in needs:
        if n.moment is None and n.unit_bytes <= 0:
            add(n, n.nbytes)
    for on_gpu in (True, False):
        for n in _largest_moment([n for n in needs if (n.tier is Tier.GPU) == on_gpu]):
            add(n, n.nbytes)
    for n in needs:
        if n.unit_bytes > 0:
            free = gpu_capacity_bytes - sum(bd["gpu"].values())
            add(n, max(0, min(n.nbytes // n.unit_bytes, free // n.unit_bytes)) * n.unit_bytes)
    return bd


def _largest_moment(needs: Sequence[Need]) -> list[Need]:
    """The transients (not elastic) of the moment among ``needs`` that holds the most bytes
    (the first such moment on a tie); none without a moment."""
    by_moment: dict[Moment, list[Need]] = {}
    for n in needs:
        if n.moment is not None and n.unit_bytes <= 0:
            by_moment.setdefault(n.moment, []).append(n)
    return max(by_moment.values(), key=lambda ns: sum(n.nbytes for n in ns)) if by_moment else []
