"""GPU compute: each layer's forward, recompute and backward kernels on the compute stream, and
tensor-parallel all-reduces (Megatron-LM, arXiv 1909.08053 Fig. 3: two blocking all-reduces of
a block's 16-bit output in forward and recompute, two of the input gradients in backward)."""

from __future__ import annotations

from dataclasses import dataclass

from offsim.core.enums import Activity, MechanismId, Phase, TensorKind
from offsim.mechanisms.base import BlockBuilder, Need, Setup, Site, SiteKind, Stage, tag
from offsim.schedule.ops import CUR_MB, Delay, Flow, TensorRef, Wait

COMPUTE = "gpu"  # the compute stream


@dataclass(frozen=True)
class LayerCost:
    """One layer's kernels: seconds and FLOPs per micro-batch; ``recompute``: the backward runs
    the forward again first (checkpointed); ``tp_allreduce``: the all-reduces a TP block pays."""

    forward_s: float
    backward_s: float
    forward_flops: float
    recompute: bool
    tp_allreduce: Flow | None = None


def activation(layer: int) -> TensorRef:
    """The activations a layer's forward leaves for its backward, in the current micro-batch."""
    return TensorRef(TensorKind.ACTIVATION, unit=layer, mb=CUR_MB)


def grad16(layer: int) -> TensorRef:
    """A layer's 16-bit gradient of the current micro-batch."""
    return TensorRef(TensorKind.GRAD16, unit=layer, mb=CUR_MB)


@dataclass(frozen=True)
class Compute:
    """Forward, recompute and backward kernels per layer."""

    layers: tuple[LayerCost, ...]
    id: MechanismId = MechanismId.COMPUTE

    def footprint(self) -> tuple[Need, ...]:
        return ()  # no memory of its own

    def setup(self) -> Setup:
        return Setup()

    def emit(self, b: BlockBuilder, site: Site, stage: Stage) -> None:
        if stage is not Stage.RUN:
            return
        if site.what is SiteKind.FORWARD:
            self._forward(b, site.layer)
        elif site.what is SiteKind.BACKWARD:
            self._backward(b, site.layer)

    def _kernel(self, b: BlockBuilder, layer: int, activity: Activity, phase: Phase, seconds: float,
                flops: float, writes: tuple[TensorRef, ...] = (), reads: tuple[TensorRef, ...] = ()) -> None:
        b.add(Delay(seconds, flops), tag(activity, self.id, phase, layer), COMPUTE, reads=reads, writes=writes)
        cost = self.layers[layer]
        if cost.tp_allreduce is not None:
            b.add(cost.tp_allreduce, tag(Activity.TP_ALLREDUCE, MechanismId.TENSOR_PARALLEL, phase, layer,
                                         label=f"{activity} all-reduce"), COMPUTE,
                  stall=Wait("tensor-parallel all-reduce"))

    def _forward(self, b: BlockBuilder, layer: int) -> None:
        cost = self.layers[layer]
        self._kernel(b, layer, Activity.FORWARD, Phase.FORWARD, cost.forward_s, cost.forward_flops,
                     writes=(activation(layer),))

    def _backward(self, b: BlockBuilder, layer: int) -> None:
        cost = self.layers[layer]
        if cost.recompute:
            self._kernel(b, layer, Activity.RECOMPUTE, Phase.BACKWARD, cost.forward_s, cost.forward_flops,
                         reads=(activation(layer),))
        self._kernel(b, layer, Activity.BACKWARD, Phase.BACKWARD, cost.backward_s, 2 * cost.forward_flops,
                     reads=(activation(layer),), writes=(grad16(layer),))
