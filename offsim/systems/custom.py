"""A strategy file's knobs, composed in the standard order: a user's file, or one imported from a
DeepSpeed, Accelerate or Megatron configuration, that names no system. It accepts every system
option (:data:`~offsim.config.strategy.SYSTEM_OPTIONS`) and takes each variant from its knob,
with the owning system's own pieces, so a user can combine mechanisms no published system has.
"""

from dataclasses import replace

from offsim.config.run import RunConfig
from offsim.config.strategy import SYSTEM_OPTIONS
from offsim.plan.footprint import StateSizes
from offsim.systems import deep_optimizer_states, mlp_offload, zero_offload
from offsim.systems._compile import System
from offsim.systems._parts import Variants, build_ctx, standard, subgroups
from offsim.systems.deep_optimizer_states import choice_policies
from offsim.systems.tba_ssdtrain import gds_activations

OPTIONS: frozenset[str] = frozenset(SYSTEM_OPTIONS)

__all__ = ["OPTIONS", "choice_policies", "compose", "variants"]


def variants(cfg: RunConfig) -> Variants:
    """Every variant as the strategy's knobs set it."""
    st = cfg.strategy
    storage = mlp_offload.variants(cfg)
    return Variants(layerwise_update=st.optimizer_schedule == "layerwise",
                    grad_compression_ratio=st.grad_compression_ratio,
                    grad_compression_flop_per_param=st.grad_compression_flop_per_param,
                    gpu_collectives=not st.replicated_param_swap,
                    nvme_activations=gds_activations if st.gpudirect_storage else None,
                    storage=storage.storage, io_concurrency=storage.io_concurrency,
                    deepspeed_grads=True)  # DeepSpeed ZeRO-3's partition_grads where its offload path is on


def compose(cfg: RunConfig, sz: StateSizes | None = None) -> System:
    """The standard mechanisms with the variants the knobs set (and Deep Optimizer States' split
    when ``optimizer_split`` is ``perf-model``); DeepSpeed's ZeRO-2 offload gradient path
    (:func:`offsim.systems.zero_offload.zero2_grads`) where it applies, so an imported ds_config
    runs as the shipped ``zero-offload`` strategy does."""
    c = build_ctx(cfg, sz, variants(cfg))
    if c.st.optimizer_split != "perf-model":
        system = standard(c)
    else:
        system = standard(c, deep_optimizer_states.gpu_split(c, subgroups(c)), (deep_optimizer_states.NOTE,))
    if not zero_offload.on_deepspeed_z2_grads(cfg):
        return system
    # a DeepSpeed ZeRO-2 offload configuration takes DeepSpeed's gradient path, as zero-offload does
    mechs: dict[str, object] = {**system.mechanisms, "grads": zero_offload.zero2_grads(c)}
    return replace(system, mechanisms=mechs)  # type: ignore[arg-type]
