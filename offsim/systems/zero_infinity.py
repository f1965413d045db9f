"""ZeRO-Infinity (Rajbhandari et al., SC 2021, arXiv 2104.07857, Sec. 5-6): ZeRO-3 with
parameters and optimizer state offloaded to CPU DRAM or NVMe; each layer's parameters are
gathered before use (prefetch bounded by the live-parameter and reuse-distance knobs), the
optimizer steps per sub-group with NVMe swap, DeepSpeed's host buffers set up at start.

Mechanisms: parameter fetch, compute, activations, gradient offload, the CPU optimizer with
its NVMe swap (and a DRAM cache when the strategy gives one), DeepSpeed's host state.

Shipped strategies: zero-infinity-cpu, zero-infinity-nvme. The shared knobs (placement, ZeRO
stage, buffers...) keep working under it; of the system options
(:data:`~offsim.config.strategy.SYSTEM_OPTIONS`) it accepts ``OPTIONS``.
"""

from offsim.config.run import RunConfig
from offsim.plan.footprint import StateSizes
from offsim.systems._compile import System
from offsim.systems._parts import Variants, standard_system

OPTIONS: frozenset[str] = frozenset(())


def compose(cfg: RunConfig, sz: StateSizes | None = None) -> System:
    """The standard ZeRO-3 offload mechanisms, gradients moved as DeepSpeed's partition_grads
    moves them (``Variants.deepspeed_grads``)."""
    return standard_system(cfg, sz, Variants(deepspeed_grads=True))
