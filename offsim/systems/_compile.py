"""Compile a system: walk its order's sites, ask every mechanism for its ops at each stage, and
collect the blocks, repeats, streams, pools and caches into a :class:`~offsim.schedule.ops.Schedule`.

The standard order: an ``init`` block; then per iteration the micro-batches (forward over the
layers, then backward in reverse; the first, middle and last micro-batches are distinct templates
because gradient accumulation differs there) and the step. Iterations whose blocks are the same
are one :class:`~offsim.schedule.ops.Repeat`.

A system may choose another order of work, as data (:class:`WorkOrder`): *unit-major*
("vertical", Harmony's layer packs, GreedySnake): the layers are cut into units of
``unit_layers``; each unit runs all M micro-batches before the next unit, forward over the units
then backward in reverse; with ``snake`` the micro-batch order reverses at every unit, so the
micro-batch at a turn runs twice in a row (GreedySnake, arXiv 2512.17570; FlexTrain
``npz7yyk/FlexTrain`` @ f855b6ef19), and the turn between the passes runs the last unit's forward
and backward in one block per micro-batch. Each (unit, micro-batch) is one block instance of its
micro-batch, so per-micro-batch tensors (``TensorRef.mb`` = ``CUR_MB``: activations, checkpoints,
gradient accumulation buffers) stay distinct while several micro-batches are live. A site's
``first_mb`` / ``last_mb`` name the first / the last micro-batch that visits its unit in this
pass (in micro-batch-major order: the iteration's first / last micro-batch, as before).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from offsim.core.enums import StreamKind
from offsim.mechanisms.base import BlockBuilder, Mechanism, Site, SiteKind, Stage
from offsim.schedule.ops import Block, CacheSpec, ChoiceSpec, PoolSpec, Repeat, Schedule, StreamSpec

#: per site kind, (mechanism name, stage) pairs in the order their ops are emitted
Program = tuple[tuple[str, Stage], ...]


class OrderKind(StrEnum):
    """How the work of an iteration's micro-batches is ordered."""

    MICRO_BATCH_MAJOR = "micro-batch-major"  # each micro-batch over all layers, then the next
    UNIT_MAJOR = "unit-major"                # each unit of layers over all micro-batches, then the next


@dataclass(frozen=True)
class WorkOrder:
    """The order of work of an iteration, as data.

    Attributes:
        kind: micro-batch-major (every system's default) or unit-major.
        unit_layers: layers per unit (unit-major only: Harmony's layer pack, GreedySnake's
            ``checkpoint_interval``).
        snake: unit-major only: the micro-batch order reverses at every unit (GreedySnake).
    """

    kind: OrderKind = OrderKind.MICRO_BATCH_MAJOR
    unit_layers: int = 1
    snake: bool = False


@dataclass(frozen=True)
class System:
    """A composition: named mechanisms, and per site kind the (mechanism name, stage) pairs in
    the order their ops are emitted (the order of work inside a site, as data)."""

    mechanisms: dict[str, Mechanism]
    sites: dict[SiteKind, Program]
    n_layers: int
    micro_batches: int
    iterations: int
    #: iterations whose step differs (an optimizer order that changes per iteration), else 1
    step_period: int = 1
    notes: tuple[str, ...] = ()
    unit_names: tuple[str, ...] = ()
    order: WorkOrder = field(default_factory=WorkOrder)


def emit_site(system: System, b: BlockBuilder, site: Site) -> None:
    """Ask the mechanisms for ``site``'s ops, in the system's order."""
    for name, stage in system.sites.get(site.what, ()):
        system.mechanisms[name].emit(b, site, stage)


def micro_batch_block(system: System, first: bool, last: bool) -> Block:
    """Forward over the layers, then backward in reverse, for one kind of micro-batch."""
    which = "only" if first and last else "first" if first else "last" if last else "middle"
    b = BlockBuilder(f"micro-batch ({which})")
    n = system.n_layers
    for k in range(n):
        emit_site(system, b, Site(SiteKind.FORWARD, k, k, first, last))
    for k, layer in enumerate(reversed(range(n))):
        emit_site(system, b, Site(SiteKind.BACKWARD, layer, k, first, last))
    return b.build()


def step_block(system: System, iteration: int, first_iteration: bool) -> Block:
    """The iteration's end and its optimizer step."""
    b = BlockBuilder("step (first iteration)" if first_iteration else f"step (iteration {iteration})")
    emit_site(system, b, Site(SiteKind.ITERATION_END, iteration=iteration, first_iteration=first_iteration))
    emit_site(system, b, Site(SiteKind.STEP, iteration=iteration, first_iteration=first_iteration))
    return b.build()


def _micro_batches(system: System) -> tuple[Block | Repeat, ...]:
    m = system.micro_batches
    if m == 1:
        return (Repeat("micro_batch", 1, (micro_batch_block(system, True, True),), 0),)
    first, last = micro_batch_block(system, True, False), micro_batch_block(system, False, True)
    middle = () if m == 2 else (Repeat("micro_batch", m - 2, (micro_batch_block(system, False, False),), 1),)
    return (Repeat("micro_batch", 1, (first,), 0), *middle, Repeat("micro_batch", 1, (last,), m - 1))


def _units(n_layers: int, unit_layers: int) -> list[range]:
    """The layers cut into units of ``unit_layers`` (the last may be shorter)."""
    return [range(lo, min(lo + unit_layers, n_layers)) for lo in range(0, n_layers, max(1, unit_layers))]


#: one visit of unit-major order: per pass (forward, backward), the layers it runs in that order
Visit = tuple[tuple[SiteKind, tuple[int, ...]], ...]


def unit_visits(system: System) -> list[Visit]:
    """The unit-major visits in order: forward units, then backward units in reverse (layers
    reversed inside); with ``snake`` the last forward unit and the first backward unit are one
    visit (the turn: each micro-batch runs its loss between them)."""
    units = _units(system.n_layers, system.order.unit_layers)
    fwd: list[Visit] = [((SiteKind.FORWARD, tuple(u)),) for u in units]
    bwd: list[Visit] = [((SiteKind.BACKWARD, tuple(reversed(u))),) for u in reversed(units)]
    if system.order.snake:
        return [*fwd[:-1], fwd[-1] + bwd[0], *bwd[1:]]
    return fwd + bwd


def visit_block(system: System, visit: Visit, first: bool, last: bool) -> Block:
    """One micro-batch's sites of one visit (``first`` / ``last``: the first / last micro-batch
    that visits this unit in this pass)."""
    which = "only" if first and last else "first" if first else "last" if last else "middle"
    names = ", ".join(f"{kind} {layers[0]}-{layers[-1]}" for kind, layers in visit)
    b = BlockBuilder(f"unit {names} ({which} micro-batch)")
    n = system.n_layers
    for kind, layers in visit:
        for layer in layers:
            position = layer if kind is SiteKind.FORWARD else n - 1 - layer
            emit_site(system, b, Site(kind, layer, position, first, last))
    return b.build()


def mb_sequence(micro_batches: int, snake: bool, visit: int) -> list[int]:
    """The micro-batches of the ``visit``-th unit visit in order (reversed on odd visits with
    ``snake``)."""
    order = list(range(micro_batches))
    return order[::-1] if snake and visit % 2 else order


def _unit_major(system: System) -> tuple[Block | Repeat, ...]:
    """An iteration's body in unit-major order: per visit, its micro-batches, each a repeat of
    one along the micro-batch axis (so its blocks bind per-micro-batch tensors to it); the middle
    micro-batches share one template."""
    m, out = system.micro_batches, []
    for v, visit in enumerate(unit_visits(system)):
        if m == 1:
            out.append(Repeat("micro_batch", 1, (visit_block(system, visit, True, True),), 0))
            continue
        first, last = visit_block(system, visit, True, False), visit_block(system, visit, False, True)
        middle = visit_block(system, visit, False, False) if m > 2 else None
        seq = mb_sequence(m, system.order.snake, v)
        if seq[0] == 0 and middle is not None:  # ascending: the middle ones are one repeat
            out += [Repeat("micro_batch", 1, (first,), 0), Repeat("micro_batch", m - 2, (middle,), 1),
                    Repeat("micro_batch", 1, (last,), m - 1)]
            continue
        for i, mb in enumerate(seq):
            block = first if i == 0 else last if i == m - 1 else middle
            out.append(Repeat("micro_batch", 1, (block,), mb))  # type: ignore[arg-type]
    return tuple(out)


def _iterations(system: System, mbs: tuple[Block | Repeat, ...]) -> tuple[Block | Repeat, ...]:
    """Iteration 0 (its step may differ: DeepSpeed's first step), then the others: one repeat
    when every step is the same, else one per iteration with the step of its variant."""
    out: list[Block | Repeat] = [Repeat("iteration", 1, (*mbs, step_block(system, 0, True)), 0)]
    if system.iterations == 1:
        return tuple(out)
    if system.step_period == 1:
        out.append(Repeat("iteration", system.iterations - 1, (*mbs, step_block(system, 1, False)), 1))
        return tuple(out)
    variants: dict[int, Block] = {}
    for it in range(1, system.iterations):
        step = variants.setdefault(it % system.step_period, step_block(system, it, False))
        out.append(Repeat("iteration", 1, (*mbs, step), it))
    return tuple(out)


def _merge(items: Sequence[StreamSpec | PoolSpec | CacheSpec | ChoiceSpec]) -> tuple:  # type: ignore[type-arg]
    seen: dict[object, object] = {}
    for item in items:
        key = getattr(item, "name", None) or getattr(item, "id", None)
        seen.setdefault(key, item)
    return tuple(seen.values())


def compile_system(system: System) -> Schedule:
    """The schedule of ``system``."""
    init = BlockBuilder("init")
    emit_site(system, init, Site(SiteKind.INIT, first_iteration=True))
    setups = [m.setup() for m in system.mechanisms.values()]
    streams = [StreamSpec("init", StreamKind.CPU), StreamSpec("gpu", StreamKind.GPU_COMPUTE, records_stalls=True)]
    streams += [s for st in setups for s in st.streams]
    unit_major = system.order.kind is OrderKind.UNIT_MAJOR
    body = (init.build(), *_iterations(system, _unit_major(system) if unit_major else _micro_batches(system)))
    return Schedule(body, _merge(streams), _merge([p for st in setups for p in st.pools]),
                    _merge([c for st in setups for c in st.caches]), system.notes, system.unit_names,
                    _merge([c for st in setups for c in st.choices]))
