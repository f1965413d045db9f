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
from offsim.core.units import GiB
from offsim.errors import ConfigError
from offsim.mechanisms.base import StorageIO
from offsim.plan import footprint as fp
from offsim.plan.footprint import StateSizes
from offsim.schedule.ops import Flow
from offsim.systems._compile import System
from offsim.systems._options import read_options
from offsim.systems._part_static import cached_subgroups_per_path, swap_paths
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
    #: ``dist_opt_enable_caching`` as the fork implements it: the DRAM cache is the sub-groups each
    #: path's swapper keeps in its own pinned swap buffers, ``buffer_count // 4 - 1`` per path
    #: (:func:`fork_cache_bytes`); the cache's budget (``policies.dram_cache_gib``) is then derived,
    #: not set. False: the hand-set ``policies.dram_cache_gib``.
    cache_in_swap_buffers: bool = False


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


def fork_cache_bytes(cfg: RunConfig, sz: StateSizes) -> float:
    """Optimizer-state bytes per rank the fork's DRAM cache holds: on each storage path
    (:func:`~offsim.systems._part_static.swap_paths`) ``buffer_count // 4 - 1`` sub-groups
    (:func:`~offsim.systems._part_static.cached_subgroups_per_path`; DataStates/DeepSpeed dist_nvme_opt,
    stage3.py ``_configure_tensor_swapping`` and ``_create_next_swappable_fp32_groups``: the last ones
    of the update order per swapper are not flushed), each at most the largest sub-group, whose fp32
    master and moments offsim's cache counts (``optimizer_bytes_per_param``). 70B at dp 4 with the
    log's buffer_count 25 over NVMe and the PFS: 2 x 5 x largest sub-group x 12 B. ``cfg`` as
    :func:`with_ratio_share` leaves it (the PFS share, hence the second path, read from the ratio)."""
    groups = fp.deepspeed_sub_groups(fp.param_partitions(cfg, sz), cfg.strategy.sub_group_params)
    per_path = cached_subgroups_per_path(cfg.strategy.optimizer_buffer_count)
    return swap_paths(cfg) * per_path * max(groups) * sz.optimizer_bytes_per_param


def with_fork_cache(cfg: RunConfig, sz: StateSizes | None) -> RunConfig:
    """``cfg`` with ``policies.dram_cache_gib`` set to :func:`fork_cache_bytes` when the option
    ``cache_in_swap_buffers`` is on (unchanged otherwise); a hand-set budget beside it is refused."""
    if not read_options(cfg.strategy, Options).cache_in_swap_buffers:
        return cfg
    pol = cfg.strategy.policies
    if pol.dram_cache_gib > 0:
        raise ConfigError(f"strategy '{cfg.strategy.name}': policies.dram_cache_gib {pol.dram_cache_gib} and "
                          "system_options cache_in_swap_buffers both size the DRAM cache; set dram_cache_gib 0 "
                          "to take it from the swap buffers, or drop cache_in_swap_buffers")
    gib = fork_cache_bytes(cfg, sz if sz is not None else fp.state_sizes(cfg)) / GiB
    st = cfg.strategy.model_copy(update={"policies": pol.model_copy(update={"dram_cache_gib": gib})})
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
    cfg = with_fork_cache(with_ratio_share(cfg, sz), sz)
    return standard_system(cfg, sz, variants(cfg))
