"""GPU compute: each layer's forward, recompute and backward kernels on the compute stream, and
tensor-parallel all-reduces (Megatron-LM, arXiv 1909.08053 Fig. 3: two blocking all-reduces of
a block's 16-bit output in forward and recompute, two of the input gradients in backward)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from offsim.core.enums import Activity, MechanismId, Phase, TensorKind
from offsim.mechanisms.base import BlockBuilder, Need, Setup, Site, SiteKind, Stage, tag
from offsim.schedule.ops import CUR_MB, Delay, Flow, TensorRef, Wait

COMPUTE = "gpu"  # the compute stream


@dataclass(frozen=True)
class LayerCost:
    """One layer's kernels: seconds and FLOPs per micro-batch; ``recompute``: the backward runs
    the forward again first (checkpointed); ``tp_allreduce``: the all-reduces a TP block pays;
    ``backward_cuts``: increasing fractions in (0, 1) of the backward kernels at which a
    parameter's gradient is ready and a :class:`GradientHooks` acts (empty: none inside)."""

    forward_s: float
    backward_s: float
    forward_flops: float
    recompute: bool
    tp_allreduce: Flow | None = None
    backward_cuts: tuple[float, ...] = ()


class GradientHooks(Protocol):
    """What runs in a parameter's gradient hook inside a layer's backward (DeepSpeed ZeRO-3's
    ``reduce_partition_and_remove_grads``, :meth:`offsim.mechanisms.grads.Grads.emit_hook`)."""

    def emit_hook(self, b: BlockBuilder, site: Site, cut: int) -> None:
        """Append the hook's ops after cut ``cut`` of ``site``'s backward kernels (cut
        ``len(backward_cuts)``: after the last of them)."""
        ...


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
    hooks: GradientHooks | None = None
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
            self._backward(b, site)

    def _kernel(self, b: BlockBuilder, layer: int, activity: Activity, phase: Phase, seconds: float,
                flops: float, writes: tuple[TensorRef, ...] = (), reads: tuple[TensorRef, ...] = ()) -> None:
        b.add(Delay(seconds, flops), tag(activity, self.id, phase, layer), COMPUTE, reads=reads, writes=writes)
        self._tp_allreduce(b, layer, activity, phase)

    def _tp_allreduce(self, b: BlockBuilder, layer: int, activity: Activity, phase: Phase) -> None:
        cost = self.layers[layer]
        if cost.tp_allreduce is not None:
            b.add(cost.tp_allreduce, tag(Activity.TP_ALLREDUCE, MechanismId.TENSOR_PARALLEL, phase, layer,
                                         label=f"{activity} all-reduce"), COMPUTE,
                  stall=Wait("tensor-parallel all-reduce"))

    def _forward(self, b: BlockBuilder, layer: int) -> None:
        cost = self.layers[layer]
        self._kernel(b, layer, Activity.FORWARD, Phase.FORWARD, cost.forward_s, cost.forward_flops,
                     writes=(activation(layer),))

    def _backward(self, b: BlockBuilder, site: Site) -> None:
        layer = site.layer
        cost = self.layers[layer]
        if cost.recompute:
            self._kernel(b, layer, Activity.RECOMPUTE, Phase.BACKWARD, cost.forward_s, cost.forward_flops,
                         reads=(activation(layer),))
        if self.hooks is None:
            self._kernel(b, layer, Activity.BACKWARD, Phase.BACKWARD, cost.backward_s, 2 * cost.forward_flops,
                         reads=(activation(layer),), writes=(grad16(layer),))
            return
        self._hooked_backward(b, site, self.hooks)

    def _hooked_backward(self, b: BlockBuilder, site: Site, hooks: GradientHooks) -> None:
        """The backward kernels cut at ``backward_cuts`` (each piece its share of the seconds and
        FLOPs; the last writes the gradient), ``hooks`` acting after each piece: autograd runs a
        parameter's gradient hook on the host as soon as that gradient is ready, inside the
        layer's backward (DeepSpeed ZeRO-3: stage3.py ``reduce_partition_and_remove_grads``)."""
        layer = site.layer
        cost = self.layers[layer]
        bounds = (0.0, *cost.backward_cuts, 1.0)
        last = len(bounds) - 2
        for i in range(last + 1):
            share = bounds[i + 1] - bounds[i]
            b.add(Delay(cost.backward_s * share, 2 * cost.forward_flops * share),
                  tag(Activity.BACKWARD, self.id, Phase.BACKWARD, layer), COMPUTE, reads=(activation(layer),),
                  writes=(grad16(layer),) if i == last else ())
            if i == last:
                self._tp_allreduce(b, layer, Activity.BACKWARD, Phase.BACKWARD)
            hooks.emit_hook(b, site, i)
