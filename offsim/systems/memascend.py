"""MemAscend (Liaw and Chen, 2025, arXiv 2505.23254): ZeRO-Infinity's NVMe offload with its host
memory fixes: exact-size pinned buffers, an adaptive parameter pool, pinned allocation without
copies, a fused overflow check.

Mechanisms: those of ZeRO-Infinity, with the host-state knobs (``host_allocator``,
``param_swap_pool``, ``pin_by_copy``, ``overflow_check``) set to MemAscend's.

Shipped strategies: memascend. The shared knobs (placement, ZeRO stage, buffers...) keep working
under it; of the system options (:data:`~offsim.config.strategy.SYSTEM_OPTIONS`) it accepts
``OPTIONS``.
"""

from offsim.config.run import RunConfig
from offsim.plan.footprint import StateSizes
from offsim.systems._compile import System
from offsim.systems._parts import Variants, standard_system

OPTIONS: frozenset[str] = frozenset({"param_swap_pool", "overflow_check"})


def compose(cfg: RunConfig, sz: StateSizes | None = None) -> System:
    """ZeRO-Infinity's mechanisms; its host buffers sized by MemAscend's options."""
    return standard_system(cfg, sz, Variants(deepspeed_grads=True))  # DeepSpeed's partition_grads
