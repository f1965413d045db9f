"""Harmony's virtualised-memory baseline (Li et al., VLDB 2022, arXiv 2202.01306, Sec. 1-2):
data parallel, each GPU swapping its own full model replica through host memory over links
the GPUs share.

Mechanisms: parameter fetch of whole replicas (``replicated_param_swap``), compute,
activations, gradients, the CPU optimizer.

Shipped strategies: virtual-memory-swap. The shared knobs (placement, ZeRO stage, buffers...) keep working
under it; of the system options (:data:`~offsim.config.strategy.SYSTEM_OPTIONS`) it accepts
``OPTIONS``.
"""

from offsim.config.run import RunConfig
from offsim.plan.footprint import StateSizes
from offsim.systems._compile import System
from offsim.systems._parts import Variants, standard_system

OPTIONS: frozenset[str] = frozenset({"replicated_param_swap"})


def compose(cfg: RunConfig, sz: StateSizes | None = None) -> System:
    """The standard mechanisms; with replicated swap no GPU-to-GPU collective: every rank moves
    its own replica over its host link; the CPU step is Harmony's baseline's own (no DeepSpeed
    host passes)."""
    return standard_system(cfg, sz, Variants(gpu_collectives=not cfg.strategy.replicated_param_swap,
                                             deepspeed_step=False))
