"""SuperOffload (DeepSpeed blog; ``../shared/reference/offload_systems.md``): on a superchip, the
CPU optimizer overlapped with backward layer by layer over NVLink-C2C.

Mechanisms: compute, activations, gradients with the layer-wise CPU update.

Shipped strategies: superoffload. The shared knobs (placement, ZeRO stage, buffers...) keep working
under it; of the system options (:data:`~offsim.config.strategy.SYSTEM_OPTIONS`) it accepts
``OPTIONS``.
"""

from offsim.config.run import RunConfig
from offsim.plan.footprint import StateSizes
from offsim.systems._compile import System
from offsim.systems._parts import Variants, standard_system

OPTIONS: frozenset[str] = frozenset({"optimizer_schedule"})


def compose(cfg: RunConfig, sz: StateSizes | None = None) -> System:
    """The standard mechanisms with the layer-wise CPU update (off: ZeRO-3 offload, clipping on)."""
    return standard_system(cfg, sz, Variants(layerwise_update=cfg.strategy.optimizer_schedule == "layerwise"))
