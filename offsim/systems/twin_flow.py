"""ZeRO-Offload++ Twin-Flow (DeepSpeed blog, 2023): ZeRO-3 with a share of the optimizer state
(``optimizer_gpu_fraction``; DeepSpeed ``offload_optimizer.ratio`` is one minus it) on the
GPU, updated there while the CPU updates the rest.

Mechanisms: compute, activations, DeepSpeed ZeRO-3's gradient path (``Variants.deepspeed_grads``:
Twin-Flow is not a separate optimizer but ``offload_optimizer.ratio`` inside stage3.py's
``DeepSpeedZeroOptimizer_Stage3``, so its gradients take the IPG buckets, the reduction stream and
``partition_grads``' host round trip of every partition, GPU sub-groups' included; only the
boundary's fp32 copy is the CPU share's; deepspeed_runtime.md §3, §11), the CPU optimizer with its
GPU-resident share.

Shipped strategies: twin-flow. The shared knobs (placement, ZeRO stage, buffers...) keep working
under it; of the system options (:data:`~offsim.config.strategy.SYSTEM_OPTIONS`) it accepts
``OPTIONS``.
"""

from collections.abc import Sequence

from pydantic import Field

from offsim.config.base import Frozen
from offsim.config.run import RunConfig
from offsim.errors import ConfigError
from offsim.plan import footprint as fp
from offsim.plan.footprint import StateSizes
from offsim.systems._compile import System
from offsim.systems._options import read_options
from offsim.systems._part_grads import with_gradient_hooks
from offsim.systems._parts import Variants, standard_system

OPTIONS: frozenset[str] = frozenset({"optimizer_gpu_fraction"})


class Options(Frozen):
    """Twin-Flow's own knob as DeepSpeed spells it (deepspeed_runtime.md section 11)."""

    #: ``offload_optimizer.ratio``: the CPU's share as DeepSpeed applies it, in whole sub-groups
    #: (stage3.py ``_create_fp32_partitions``: sub-group i on the CPU iff
    #: i >= int((1 - ratio) * n_subgroups)). None: the strategy's ``optimizer_gpu_fraction``, exact.
    ratio: float | None = Field(None, gt=0.0, le=1.0)


def gpu_share_of_ratio(groups: Sequence[int], ratio: float) -> float:
    """Share of a rank's optimizer elements DeepSpeed updates on the GPU for ``ratio``: the first
    ``int((1 - ratio) * len(groups))`` sub-groups (stage3.py ``_create_fp32_partitions``)."""
    return sum(groups[:int((1.0 - ratio) * len(groups))]) / sum(groups)


def with_ratio_share(cfg: RunConfig, sz: StateSizes | None) -> RunConfig:
    """``cfg`` with ``optimizer_gpu_fraction`` set from ``ratio`` over this rank's DeepSpeed
    sub-groups (:func:`offsim.plan.footprint.deepspeed_sub_groups`), unchanged when it is unset;
    a hand-set fraction beside it is refused."""
    ratio = read_options(cfg.strategy, Options).ratio
    if ratio is None:
        return cfg
    if cfg.strategy.optimizer_gpu_fraction > 0:
        raise ConfigError(f"strategy '{cfg.strategy.name}': optimizer_gpu_fraction and system_options ratio "
                          "both set the GPU share; set optimizer_gpu_fraction 0 or drop ratio")
    sizes = sz if sz is not None else fp.state_sizes(cfg)
    groups = fp.deepspeed_sub_groups(fp.param_partitions(cfg, sizes), cfg.strategy.sub_group_params)
    st = cfg.strategy.model_copy(update={"optimizer_gpu_fraction": gpu_share_of_ratio(groups, ratio)})
    return cfg.model_copy(update={"strategy": st})


def compose(cfg: RunConfig, sz: StateSizes | None = None) -> System:
    """The standard mechanisms on DeepSpeed's ZeRO-3 gradient path; the CPU optimizer carries the
    GPU-resident share; the buckets flushed from their gradient hooks inside the backward
    (:func:`~offsim.systems._part_grads.with_gradient_hooks`)."""
    system = standard_system(with_ratio_share(cfg, sz), sz, Variants(deepspeed_grads=True))
    return with_gradient_hooks(system)
