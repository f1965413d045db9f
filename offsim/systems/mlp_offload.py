"""MLP-Offload (Maurya et al., SC 2025, arXiv 2509.02480): optimizer state striped over NVMe
and a parallel file system with one transfer per path, an alternating sub-group order over a
DRAM cache, 16-bit gradients kept in host memory and converted at update time.

Mechanisms: those of ZeRO-Infinity, the optimizer's storage striped (``pfs_share``,
``io_concurrency``), the DRAM cache's order policy. The PFS share is either set by hand
(``pfs_share``) or taken from the artifact's own sub-group rule (``system_options:
{dist_opt_ratio: r}``, :class:`Options`).

Shipped strategies: mlp-offload. The shared knobs (placement, ZeRO stage, buffers...) keep working
under it; of the system options (:data:`~offsim.config.strategy.SYSTEM_OPTIONS`) it accepts
``OPTIONS``.
"""

from collections.abc import Sequence

from pydantic import Field

from offsim.config.base import Frozen
from offsim.config.run import RunConfig
from offsim.errors import ConfigError
from offsim.mechanisms.base import StorageIO
from offsim.plan import footprint as fp
from offsim.plan.footprint import StateSizes
from offsim.schedule.ops import Flow
from offsim.systems._compile import System
from offsim.systems._options import read_options
from offsim.systems._parts import Ctx, Variants, standard_system, whole

OPTIONS: frozenset[str] = frozenset({"pfs_share", "io_concurrency", "delayed_grad_conversion"})


class Options(Frozen):
    """MLP-Offload's own knobs (the artifact's DeepSpeed fork, DataStates/DeepSpeed branch
    dist_nvme_opt, ``offload_optimizer`` keys)."""

    #: ``dist_opt_ratio``: with ``nvme_path: "NVMe;PFS"`` sub-group i goes to the second path (the
    #: PFS) iff ``i % r == 0``, else to the first (stage3.py ``_get_opt_swapper_id``); the artifact
    #: sets 3 (scripts/launch-expt.sh ``-O 3``, "Node-local NVMe to PFS offloading ratio").
    #: None: the strategy's hand-set ``pfs_share``.
    dist_opt_ratio: int | None = Field(None, ge=1)


def pfs_share_of_ratio(groups: Sequence[int], ratio: int) -> float:
    """Share of the optimizer-state elements on the PFS when sub-group i (elements ``groups[i]``)
    goes there iff ``i % ratio == 0`` (DataStates/DeepSpeed dist_nvme_opt, stage3.py
    ``_get_opt_swapper_id``); ratio 1 puts every sub-group on the PFS."""
    return sum(groups[::ratio]) / sum(groups)


def with_ratio_share(cfg: RunConfig, sz: StateSizes | None) -> RunConfig:
    """``cfg`` with ``pfs_share`` set from ``dist_opt_ratio`` over this rank's DeepSpeed sub-groups
    (:func:`offsim.plan.footprint.deepspeed_sub_groups`), unchanged when the option is unset; the
    striped I/O and the PFS tier's bytes then both follow the artifact's rule. offsim stripes every
    transfer by the share instead of sending whole sub-groups down one path: the same bytes per
    path per step. A hand-set ``pfs_share`` beside the ratio is refused."""
    ratio = read_options(cfg.strategy, Options).dist_opt_ratio
    if ratio is None:
        return cfg
    if cfg.strategy.pfs_share > 0:
        raise ConfigError(f"strategy '{cfg.strategy.name}': pfs_share {cfg.strategy.pfs_share} and "
                          f"system_options dist_opt_ratio {ratio} both set the PFS share; set pfs_share 0 "
                          "to take it from the ratio, or drop dist_opt_ratio")
    sizes = sz if sz is not None else fp.state_sizes(cfg)
    groups = fp.deepspeed_sub_groups(fp.param_partitions(cfg, sizes), cfg.strategy.sub_group_params)
    st = cfg.strategy.model_copy(update={"pfs_share": pfs_share_of_ratio(groups, ratio)})
    return cfg.model_copy(update={"strategy": st})


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
    cfg = with_ratio_share(cfg, sz)
    return standard_system(cfg, sz, variants(cfg))
