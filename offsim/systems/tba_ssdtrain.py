"""TBA / SSDTrain (Wu et al., arXiv 2408.10013, DAC 2025, Sec. III-IV): activations offloaded to
NVMe (GPUDirect Storage where the profile has it) and prefetched back in reverse order for
backward; model state on the GPU.

Mechanisms: compute, activations offloaded to storage (``gpudirect_storage``), gradients and
the optimizer on the GPU.

Shipped strategies: tba-ssdtrain. The shared knobs (placement, ZeRO stage, buffers...) keep working
under it; of the system options (:data:`~offsim.config.strategy.SYSTEM_OPTIONS`) it accepts
``OPTIONS``.
"""

from offsim.config.run import RunConfig
from offsim.core.enums import Tier
from offsim.mechanisms.activations import LayerActivations
from offsim.plan.footprint import StateSizes
from offsim.systems._compile import System
from offsim.systems._parts import Ctx, Variants, standard_system

OPTIONS: frozenset[str] = frozenset({"gpudirect_storage"})


def gds_activations(c: Ctx, kept: int, transient: int, work: int) -> LayerActivations:
    """A layer's kept activations written to NVMe and read back by GPUDirect Storage, with no
    host bounce (TBA Sec. IV; the path's rate is the profile's ``gds`` link)."""
    return LayerActivations(kept, transient, work, Tier.NVME, out_storage=c.paths.gds(False, kept),
                            back_storage=c.paths.gds(True, kept))


def compose(cfg: RunConfig, sz: StateSizes | None = None) -> System:
    """The standard mechanisms; NVMe-homed activations move by GPUDirect Storage when it is on."""
    gds = gds_activations if cfg.strategy.gpudirect_storage else None
    return standard_system(cfg, sz, Variants(nvme_activations=gds))
