"""No offload: parameters, gradients, optimizer state and activations in GPU memory, Adam on
the GPU (mixed precision, Micikevicius et al., ICLR 2018; ZeRO stage 0, arXiv 1910.02054).

Mechanisms: compute, activations kept on the GPU, gradients reduced on the GPU, the GPU
optimizer step; no parameter fetch.

Shipped strategies: gpu-only. The shared knobs (placement, ZeRO stage, buffers...) keep working
under it; of the system options (:data:`~offsim.config.strategy.SYSTEM_OPTIONS`) it accepts
``OPTIONS``.
"""

from offsim.config.run import RunConfig
from offsim.plan.footprint import StateSizes
from offsim.systems._compile import System
from offsim.systems._parts import standard_system

OPTIONS: frozenset[str] = frozenset(())


def compose(cfg: RunConfig, sz: StateSizes | None = None) -> System:
    """The standard mechanisms with every state on the GPU: no variant."""
    return standard_system(cfg, sz)
