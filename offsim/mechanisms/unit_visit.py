"""Mechanisms for a unit-major order of work: every micro-batch of a unit (a layer, a pack of
layers) runs before the next unit (:class:`~offsim.systems._compile.WorkOrder`,
``OrderKind.UNIT_MAJOR``), so a unit's parameters can stay on the GPU for the whole visit and
its gradients can be summed there before they leave.

Each mechanism here wraps a standard one (parameter fetch, activations, gradients) and changes
only what the visit changes; :func:`visit_mechanisms` applies the three to a system's
mechanisms. Shared by Harmony (msr-fiddle/harmony ``3_scheduler/task_graph_composor.py``: one
FWD / BWD task per layer pack over every micro-batch, :mod:`offsim.systems.harmony`) and
GreedySnake (arXiv 2512.17570, FlexTrain ``npz7yyk/FlexTrain`` @ f855b6ef19: vertical
scheduling, :mod:`offsim.systems.greedysnake`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from offsim.core.enums import Activity, MechanismId, Phase, TensorKind, Tier
from offsim.mechanisms.base import BlockBuilder, Mechanism, Need, Setup, Site, SiteKind, Stage, tag
from offsim.mechanisms.compute import COMPUTE
from offsim.schedule.ops import Alloc, Free, TensorRef


@dataclass(frozen=True)
class FetchOncePerVisit:
    """A parameter mechanism whose units stay on the GPU across the micro-batches of one
    unit-major visit: the demand is issued by the first micro-batch that visits the layer in a
    pass and its use ends with the last (Harmony's pack swap-in, GreedySnake's once-per-unit
    fetch); in micro-batch-major order every site is first and last, so it is the inner one."""

    inner: Mechanism
    id: MechanismId = MechanismId.PARAM_FETCH

    def setup(self) -> Setup:
        return self.inner.setup()

    def footprint(self) -> tuple[Need, ...]:
        return self.inner.footprint()

    def emit(self, b: BlockBuilder, site: Site, stage: Stage) -> None:
        if site.what in (SiteKind.FORWARD, SiteKind.BACKWARD):
            if stage is Stage.ISSUE and not site.first_mb:
                return
            if stage is Stage.DONE and not site.last_mb:
                return
        self.inner.emit(b, site, stage)


#: the activation needs held once per micro-batch (:meth:`Activations.footprint`'s labels)
PER_MICRO_BATCH = frozenset({"activations kept for backward", "offloaded activations"})


@dataclass(frozen=True)
class BlockLocalThrottle:
    """The activation mechanism with its forward offload throttle kept inside one block: in
    unit-major order the layers before a unit ran in earlier blocks (their ``("off_gpu", v)``
    marks are not in this one), so this forward does not wait for their offloads.
    Approximation: the throttle across units is lost (the offloads still take their links).
    Its footprint holds every micro-batch's kept activations at once (``micro_batches`` x the
    inner's one micro-batch: in unit-major order all M checkpoints wait for backward;
    new_systems.md §3 "Caveats": activation memory grows with M)."""

    inner: Mechanism
    micro_batches: int = 1
    id: MechanismId = MechanismId.ACTIVATIONS

    def setup(self) -> Setup:
        return self.inner.setup()

    def footprint(self) -> tuple[Need, ...]:
        return tuple(replace(n, nbytes=n.nbytes * self.micro_batches) if n.what in PER_MICRO_BATCH else n
                     for n in self.inner.footprint())

    def emit(self, b: BlockBuilder, site: Site, stage: Stage) -> None:
        if site.what is SiteKind.FORWARD and stage is Stage.AFTER and b.ops:
            for v in range(site.layer):
                b.marks.setdefault(("off_gpu", v), 0)
        self.inner.emit(b, site, stage)


@dataclass(frozen=True)
class AccumulateOnGpu:
    """Gradients accumulated on the GPU over the micro-batches of a unit-major visit, then sent
    once: the first micro-batch that visits a layer in backward holds its accumulation buffer
    (``acc_bytes[layer]``), the later ones add into it (an in-place add, not costed), and the
    last hands the sum to the inner gradient mechanism as a single micro-batch's gradient (so
    one reduce, one D2H and no host-side accumulation per layer and iteration). Harmony: the BWD
    task of a pack runs every micro-batch before its dW is swapped out for the UPD task
    (msr-fiddle/harmony ``3_scheduler/task_graph_composor.py``); GreedySnake: the fp32 unit
    gradient buffer (arXiv 2512.17570; FlexTrain ``npz7yyk/FlexTrain`` @ f855b6ef19)."""

    inner: Mechanism
    acc_bytes: tuple[int, ...]
    id: MechanismId = MechanismId.GRADS

    def setup(self) -> Setup:
        return self.inner.setup()

    def footprint(self) -> tuple[Need, ...]:
        return (*self.inner.footprint(), Need(Tier.GPU, "unit gradient accumulation", max(self.acc_bytes, default=0)))

    def emit(self, b: BlockBuilder, site: Site, stage: Stage) -> None:
        if site.what is not SiteKind.BACKWARD or stage is not Stage.AFTER:
            self.inner.emit(b, site, stage)
            return
        u = site.layer
        acc = TensorRef(TensorKind.BUFFER, unit=u, group=1)
        t = tag(Activity.GRAD_ACCUMULATE, self.id, Phase.BACKWARD, u, label="gradient accumulation on the GPU")
        if site.first_mb and not site.last_mb:
            b.add(Alloc(Tier.GPU, self.acc_bytes[u], acc), t, COMPUTE)
        if site.last_mb:
            start = len(b.ops)
            self.inner.emit(b, replace(site, first_mb=True), stage)
            if not site.first_mb:
                b.add(Free(Tier.GPU, acc), t, after=[_copied(b, start, u)])


def _copied(b: BlockBuilder, start: int, layer: int) -> int:
    """The op after which ``layer``'s gradient has left the GPU: the inner mechanism's free of its
    copy buffer when it emitted one since op ``start``, else its last op."""
    frees = [op.id for op in b.ops[start:] if isinstance(op.body, Free) and op.body.tier is Tier.GPU
             and op.body.tensor.kind is TensorKind.BUFFER and op.body.tensor.unit == layer]
    return frees[0] if frees else len(b.ops) - 1


def visit_mechanisms(mechanisms: Mapping[str, Mechanism], micro_batches: int,
                     acc_bytes: tuple[int, ...] = ()) -> dict[str, object]:
    """``mechanisms`` (a system's, by name) for a unit-major order: parameters fetched once per
    visit, the activation throttle kept inside a block, and with ``acc_bytes`` (per layer) and
    several micro-batches the gradients accumulated on the GPU over the visit (with one
    micro-batch the gradient leaves as it is computed: no accumulator). Names and their order
    are kept. (Values typed ``object`` as the systems' mechanism dicts are: a frozen dataclass's
    read-only ``id`` does not match the protocol's settable one.)"""
    mechs: dict[str, object] = dict(mechanisms)
    mechs["params"] = FetchOncePerVisit(mechanisms["params"])
    mechs["activations"] = BlockLocalThrottle(mechanisms["activations"], micro_batches)
    if acc_bytes and micro_batches > 1:
        mechs["grads"] = AccumulateOnGpu(mechanisms["grads"], acc_bytes)
    return mechs
