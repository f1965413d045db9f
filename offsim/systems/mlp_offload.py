"""MLP-Offload (Maurya et al., SC 2025, arXiv 2509.02480): optimizer state striped over NVMe
and a parallel file system with one transfer per path, an alternating sub-group order over a
DRAM cache, 16-bit gradients kept in host memory and converted at update time.

Mechanisms: those of ZeRO-Infinity, the optimizer's storage striped (``pfs_share``,
``io_concurrency``), the DRAM cache's order policy.

Shipped strategies: mlp-offload. The shared knobs (placement, ZeRO stage, buffers...) keep working
under it; of the system options (:data:`~offsim.config.strategy.SYSTEM_OPTIONS`) it accepts
``OPTIONS``.
"""

from offsim.config.run import RunConfig
from offsim.mechanisms.base import StorageIO
from offsim.plan.footprint import StateSizes
from offsim.schedule.ops import Flow
from offsim.systems._compile import System
from offsim.systems._parts import Ctx, Variants, standard_system, whole

OPTIONS: frozenset[str] = frozenset({"pfs_share", "io_concurrency", "delayed_grad_conversion"})


def striped_storage(c: Ctx, read: bool, nbytes: float) -> StorageIO:
    """Optimizer-state I/O striped over NVMe and the PFS by ``pfs_share`` (both at once), each
    part under its path's ``io_concurrency`` cap (MLP-Offload, arXiv 2509.02480, Sec. 4)."""
    share = c.st.pfs_share if c.cfg.hardware.pfs is not None else 0.0
    capped = c.v.io_concurrency is not None
    pfs = nbytes * share
    parts: list[tuple[Flow, str | None]] = []
    if nbytes - pfs > 0:
        parts.append((c.paths.nvme(read, whole(nbytes - pfs)), "io_nvme" if capped else None))
    if pfs > 0:
        parts.append((c.paths.pfs(read, whole(pfs)), "io_pfs" if capped else None))
    return tuple(parts)


def variants(cfg: RunConfig) -> Variants:
    """Striped storage when the strategy stripes or caps its I/O, else the plain NVMe array."""
    st = cfg.strategy
    striped = st.pfs_share > 0 or st.io_concurrency is not None
    return Variants(storage=striped_storage if striped else None, io_concurrency=st.io_concurrency,
                    deepspeed_grads=True)  # the DataStates fork of DeepSpeed ZeRO-3: its partition_grads


def compose(cfg: RunConfig, sz: StateSizes | None = None) -> System:
    """ZeRO-Infinity's mechanisms with the optimizer's storage striped and capped."""
    return standard_system(cfg, sz, variants(cfg))
