"""What can be read off a schedule without executing it: op instances with their dependencies
resolved, structural checks (acyclic, every allocation freed), traffic per link and the access
sequence each cache serves.

The static walk treats every cache access as a miss (its fetch program runs where the access is
issued) and a flush as dropping every unit: the most traffic the schedule can cause, and the
allocations its programs make, so that a free without an allocation is caught.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass

from offsim.core.enums import CacheId, Link, Tier
from offsim.core.errors import ScheduleError
from offsim.schedule.ops import (
    CUR_MB,
    Access,
    Alloc,
    Block,
    Choose,
    Flow,
    Flush,
    Free,
    Instance,
    Op,
    Schedule,
    TensorRef,
)


@dataclass(frozen=True, slots=True)
class OpInstance:
    """One op of one block instance, with its dependencies as instance ids.

    Attributes:
        id: its position in issue order.
        op: the template op.
        iteration / micro_batch: from the enclosing repeats (-1: none).
        block: the block's name.
        after: ids of the instances it waits for: its ``after`` ops and the last writer of each
            tensor it reads (stream order is implicit in ``op.stream``).
    """

    id: int
    op: Op
    iteration: int
    micro_batch: int
    block: str
    after: tuple[int, ...]


def bind(ref: TensorRef, micro_batch: int) -> TensorRef:
    """``ref`` with the enclosing micro-batch filled in."""
    if ref.mb != CUR_MB:
        return ref
    return TensorRef(ref.kind, ref.unit, ref.group, micro_batch)


def op_instances(schedule: Schedule) -> Iterator[OpInstance]:
    """Every op instance in issue order, reads resolved to the instance that last wrote them."""
    last_write: dict[TensorRef, int] = {}
    next_id = 0
    for inst in schedule.instances():
        base = next_id
        for op in inst.block.ops:
            deps = {base + a for a in op.after}
            deps |= {last_write[r] for r in (bind(x, inst.micro_batch) for x in op.reads) if r in last_write}
            yield OpInstance(base + op.id, op, inst.iteration, inst.micro_batch, inst.block.name, tuple(sorted(deps)))
            for w in op.writes:
                last_write[bind(w, inst.micro_batch)] = base + op.id
        next_id = base + len(inst.block.ops)


def check_acyclic(schedule: Schedule) -> None:
    """Every op waits only for earlier ops of its block (so the dependency graph is acyclic:
    reads bind to writes issued before them). Raises :class:`ScheduleError`."""
    blocks = list(schedule.blocks())
    blocks += [p for c in schedule.caches for progs in (c.fetch, c.evict) for p in progs.values()]
    blocks += default_programs(schedule)
    for block in blocks:
        for op in block.ops:
            if any(a >= op.id or a < 0 for a in op.after):
                raise ScheduleError(f"block '{block.name}', op {op.id} ({op.tag.activity}): waits for "
                                    f"{op.after}, not all earlier ops")


def _apply(held: dict[tuple[Tier, TensorRef], int], block: Block, mb: int, where: str) -> None:
    for op in block.ops:
        body = op.body
        if isinstance(body, Alloc):
            key = (body.tier, bind(body.tensor, mb))
            if key in held:
                raise ScheduleError(f"{where}: {body.tensor} allocated twice on {body.tier}")
            held[key] = body.nbytes
        elif isinstance(body, Free):
            key = (body.tier, bind(body.tensor, mb))
            if key not in held:
                raise ScheduleError(f"{where}: free of {body.tensor} on {body.tier}, which holds nothing")
            del held[key]


def check_allocations(schedule: Schedule) -> dict[tuple[Tier, TensorRef], int]:
    """Walk the schedule with every access a miss: no free without an allocation, no tensor
    allocated twice. Returns what is still held at the end; the caller checks it is only the
    init block's state and persistent caches' units."""
    held: dict[tuple[Tier, TensorRef], int] = {}
    resident: dict[CacheId, set[int]] = defaultdict(set)
    caches = {c.id: c for c in schedule.caches}
    for inst in schedule.instances():
        where = f"block '{inst.block.name}' (iteration {inst.iteration}, micro-batch {inst.micro_batch})"
        for op in inst.block.ops:
            _apply(held, Block(inst.block.name, (op,)), inst.micro_batch, where)
            body = op.body
            if isinstance(body, Access) and body.unit not in resident[body.cache]:
                resident[body.cache].add(body.unit)
                _apply(held, caches[body.cache].fetch[body.unit], inst.micro_batch, where)
            elif isinstance(body, Flush):
                for unit in sorted(resident.pop(body.cache, set())):
                    _apply(held, caches[body.cache].evict[unit], inst.micro_batch, where)
            elif isinstance(body, Choose):
                choice = schedule.choice(body.choice)
                assert choice is not None
                _apply(held, choice.program(body.variant, choice.default), inst.micro_batch, where)
        for cache_id, spec in caches.items():  # a non-persistent cache without a flush: its users free it
            if not spec.evict and cache_id in resident:
                resident[cache_id].clear()
    return held


def default_programs(schedule: Schedule) -> list[Block]:
    """The programs the run-time choices of the schedule run with their default option."""
    out: dict[tuple[object, object], Block] = {}
    for inst in schedule.instances():
        for op in inst.block.ops:
            if isinstance(op.body, Choose) and (op.body.choice, op.body.variant) not in out:
                spec = schedule.choice(op.body.choice)
                assert spec is not None
                out[(op.body.choice, op.body.variant)] = spec.program(op.body.variant, spec.default)
    return list(out.values())


def instance_counts(schedule: Schedule) -> Counter[str]:
    """How many times each block runs."""
    return Counter(i.block.name for i in schedule.instances())


def traffic_bytes(schedule: Schedule, iteration: int) -> dict[Link, int]:
    """Bytes per link of one iteration's ops, with every cache access a miss (an upper bound on
    what cached units move; the fetch programs' flows counted once per access)."""
    out: dict[Link, int] = defaultdict(int)
    caches = {c.id: c for c in schedule.caches}
    for inst in schedule.instances():
        if inst.iteration != iteration:
            continue
        for op in inst.block.ops:
            for flow in _flows(op, caches):
                for link in flow.links:
                    out[link] += flow.nbytes
    return dict(out)


def _flows(op: Op, caches: dict) -> Iterator[Flow]:  # type: ignore[type-arg]
    if isinstance(op.body, Flow):
        yield op.body
    elif isinstance(op.body, Access):
        for p in caches[op.body.cache].fetch[op.body.unit].ops:
            if isinstance(p.body, Flow):
                yield p.body


def accesses(schedule: Schedule, cache: CacheId, iteration: int) -> list[int]:
    """The units ``cache`` is asked for in one iteration, in issue order (the sequence its
    eviction and prefetch policies see)."""
    return [op.body.unit for inst in schedule.instances() if inst.iteration == iteration
            for op in inst.block.ops if isinstance(op.body, Access) and op.body.cache == cache]


def is_init(inst: Instance) -> bool:
    """True for the init block."""
    return inst.block.name == "init"
