"""Harmony (Li et al., VLDB 2022, arXiv 2202.01306): each byte swapped over the host links
once, GPU-to-GPU transfers instead of replicated swaps, the CPU optimizer per layer, and
layer packs that run all micro-batches per swap-in.

Mechanisms: parameter fetch without collectives (replicated swap off), compute, activations,
gradients with the layer-wise CPU update; the order of work is unit-major
(:class:`~offsim.systems._compile.WorkOrder`): a layer pack runs forward (then backward) for
every micro-batch of the minibatch before the next pack (msr-fiddle/harmony
``3_scheduler/task_graph_composor.py``: one FWD / BWD task per pack over the list of
micro-batch sizes ``ubatchszs_fwd`` / ``ubatchszs_bwd``), so a pack's parameters are swapped in
once per pass (:class:`FetchOncePerVisit`) and its gradients accumulate on the GPU over the
micro-batches before they leave.

Shipped strategies: harmony. The shared knobs (placement, ZeRO stage, buffers...) keep working
under it; of the system options (:data:`~offsim.config.strategy.SYSTEM_OPTIONS`) it accepts
``OPTIONS``; its own (``system_options:``): :class:`Options`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from pydantic import Field

from offsim.config.base import Frozen
from offsim.config.run import RunConfig
from offsim.core.enums import Activity, MechanismId, Phase, TensorKind, Tier
from offsim.mechanisms.base import BlockBuilder, Mechanism, Need, Setup, Site, SiteKind, Stage, tag
from offsim.mechanisms.compute import COMPUTE
from offsim.plan.footprint import StateSizes
from offsim.schedule.ops import Alloc, Free, TensorRef
from offsim.systems._compile import OrderKind, System, WorkOrder
from offsim.systems._options import read_options
from offsim.systems._parts import Variants, build_ctx, standard, whole

OPTIONS: frozenset[str] = frozenset({"optimizer_schedule"})


class Options(Frozen):
    """Harmony's own knobs."""

    #: layers per pack (Harmony's ``P``, msr-fiddle/harmony README "layer-pack size"; its search
    #: packs by memory, here a constant size as its manual mode does)
    layer_pack: int = Field(1, ge=1)


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


def unit_major(system: System, unit_layers: int, snake: bool = False, acc_bytes: tuple[int, ...] = ()) -> System:
    """``system`` in unit-major order: its parameters fetched once per visit, and with
    ``acc_bytes`` (per layer) and several micro-batches its gradients accumulated on the GPU over
    the visit (with one micro-batch the gradient leaves as it is computed: no accumulator)."""
    mechs: dict[str, object] = dict(system.mechanisms)
    mechs["params"] = FetchOncePerVisit(system.mechanisms["params"])
    mechs["activations"] = BlockLocalThrottle(system.mechanisms["activations"], system.micro_batches)
    if acc_bytes and system.micro_batches > 1:
        mechs["grads"] = AccumulateOnGpu(system.mechanisms["grads"], acc_bytes)
    return replace(system, mechanisms=mechs, order=WorkOrder(OrderKind.UNIT_MAJOR, unit_layers, snake))  # type: ignore[arg-type]


def compose(cfg: RunConfig, sz: StateSizes | None = None) -> System:
    """The standard mechanisms with the layer-wise CPU update, in layer-pack order."""
    opts = read_options(cfg.strategy, Options)
    c = build_ctx(cfg, sz, Variants(layerwise_update=cfg.strategy.optimizer_schedule == "layerwise"))
    acc = tuple(whole(lay.params * c.bpp_grad) for lay in c.layers)
    return unit_major(standard(c), opts.layer_pack, acc_bytes=acc)
