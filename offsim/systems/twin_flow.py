"""ZeRO-Offload++ Twin-Flow (DeepSpeed blog, 2023): ZeRO-3 with a share of the optimizer state
(``optimizer_gpu_fraction``; DeepSpeed ``offload_optimizer.ratio`` is one minus it) on the
GPU, updated there while the CPU updates the rest.

Mechanisms: compute, activations, gradient offload of the CPU share, the CPU optimizer with
its GPU-resident share.

Shipped strategies: twin-flow. The shared knobs (placement, ZeRO stage, buffers...) keep working
under it; of the system options (:data:`~offsim.config.strategy.SYSTEM_OPTIONS`) it accepts
``OPTIONS``.
"""

from offsim.config.run import RunConfig
from offsim.plan.footprint import StateSizes
from offsim.systems._compile import System
from offsim.systems._parts import standard_system

OPTIONS: frozenset[str] = frozenset({"optimizer_gpu_fraction"})


def compose(cfg: RunConfig, sz: StateSizes | None = None) -> System:
    """The standard mechanisms; the CPU optimizer carries the GPU-resident share."""
    return standard_system(cfg, sz)
