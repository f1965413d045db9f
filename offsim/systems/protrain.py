"""ProTrain (Yang et al., arXiv 2406.08334): persistent and prefetched parameter chunks in
pinned DRAM, the persistent chunks' state updated on the GPU, the others' CPU Adam per chunk
overlapped with backward, block-wise activation recompute; its knobs come from a search
(:mod:`offsim.search.protrain`, ``offsim tune``).

Mechanisms: parameter fetch (persistent layers kept by a static eviction policy), compute,
activations, gradients with the layer-wise update (GPU Adam for the persistent share).

Shipped strategies: protrain. The shared knobs (placement, ZeRO stage, buffers...) keep working
under it; of the system options (:data:`~offsim.config.strategy.SYSTEM_OPTIONS`) it accepts
``OPTIONS``.
"""

from offsim.config.run import RunConfig
from offsim.plan.footprint import StateSizes
from offsim.systems._compile import System
from offsim.systems._parts import Variants, standard_system

OPTIONS: frozenset[str] = frozenset({"optimizer_schedule", "optimizer_gpu_fraction"})


def compose(cfg: RunConfig, sz: StateSizes | None = None) -> System:
    """The standard mechanisms with the layer-wise CPU update when its search picks it, and the
    persistent layers' GPU share; its CPU step is its own loop (no DeepSpeed host passes)."""
    return standard_system(cfg, sz, Variants(layerwise_update=cfg.strategy.optimizer_schedule == "layerwise",
                                             deepspeed_step=False))
