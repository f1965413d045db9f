"""Compile a system: walk its order's sites, ask every mechanism for its ops at each stage, and
collect the blocks, repeats, streams, pools and caches into a :class:`~offsim.schedule.ops.Schedule`.

The standard order: an ``init`` block; then per iteration the micro-batches (forward over the
layers, then backward in reverse; the first, middle and last micro-batches are distinct templates
because gradient accumulation differs there) and the step. Iterations whose blocks are the same
are one :class:`~offsim.schedule.ops.Repeat`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from offsim.core.enums import StreamKind
from offsim.mechanisms.base import BlockBuilder, Mechanism, Site, SiteKind, Stage
from offsim.schedule.ops import Block, CacheSpec, ChoiceSpec, PoolSpec, Repeat, Schedule, StreamSpec

#: per site kind, (mechanism name, stage) pairs in the order their ops are emitted
Program = tuple[tuple[str, Stage], ...]


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
    body = (init.build(), *_iterations(system, _micro_batches(system)))
    return Schedule(body, _merge(streams), _merge([p for st in setups for p in st.pools]),
                    _merge([c for st in setups for c in st.caches]), system.notes, system.unit_names,
                    _merge([c for st in setups for c in st.choices]))
