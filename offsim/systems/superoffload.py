"""SuperOffload (DeepSpeed blog; ``../shared/reference/offload_systems.md``): on a superchip, the
CPU optimizer overlapped with backward layer by layer over NVLink-C2C.

Mechanisms: compute, activations, gradients with the layer-wise CPU update.

SuperOffload runs inside DeepSpeed ZeRO-3 (``SuperOffloadOptimizer_Stage3`` subclasses
``DeepSpeedZeroOptimizer_Stage3``; deepspeed/runtime/superoffload/superoffload_stage3.py at
edaa722126): its gradients take stage 3's IPG buckets and reduction stream, and its
``partition_grads`` override keeps the base class's host round trip (micro-batch 0: D2H into the
16-bit host buffer and ``.to(device)`` back; later ones: H2D, add on the GPU, D2H) and, at the
boundary, the fp64 norm and a non_blocking fp32 copy into the CPU gradient. With clipping on
(``optimizer_schedule`` after-backward, DeepSpeed's default since v0.19.3) that is DeepSpeed's
ZeRO-3 gradient path exactly, so it is composed (``Variants.deepspeed_grads``). With the
speculative step (``layerwise``, ``gradient_clipping`` 0) the override also blocks the host on the
stream when a sub-group's last gradient lands and enqueues that sub-group's CPU Adam; offsim models
that step as its layer-wise update, which hangs off the per-layer gradient path, so there the
gradients take offsim's per-layer copy, not the IPG buckets: the bucket window, the
three-in-flight throttle and the round trip are not modelled in that mode (a known gap,
deepspeed_runtime.md §11).

Shipped strategies: superoffload. The shared knobs (placement, ZeRO stage, buffers...) keep working
under it; of the system options (:data:`~offsim.config.strategy.SYSTEM_OPTIONS`) it accepts
``OPTIONS``.
"""

from offsim.config.run import RunConfig
from offsim.plan.footprint import StateSizes
from offsim.systems._compile import System
from offsim.systems._part_grads import with_gradient_hooks
from offsim.systems._parts import Variants, standard_system

OPTIONS: frozenset[str] = frozenset({"optimizer_schedule"})


def compose(cfg: RunConfig, sz: StateSizes | None = None) -> System:
    """The standard mechanisms with the layer-wise CPU update (off: DeepSpeed's ZeRO-3 offload
    with its gradient path, its buckets flushed from their gradient hooks, clipping on)."""
    layerwise = cfg.strategy.optimizer_schedule == "layerwise"
    system = standard_system(cfg, sz, Variants(layerwise_update=layerwise, deepspeed_grads=not layerwise))
    return with_gradient_hooks(system)
