"""What the policies imply for the plan: per-layer activation decisions, the GPU parameter
budget, the DRAM cache size, and the GPU memory the gathered-parameter window may take.

Pure functions of the RunConfig (no SimPy), shared by the footprint check and the engine so
that both see the same decisions.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from offsim.errors import ConfigError, PolicyError
from offsim.policies import ActivationDecision, ActivationPolicy, BuildContext
from offsim.policies.bucket import BucketConfig
from offsim.policies.lookahead import LookaheadConfig
from offsim.policies.no_prefetch import NoPrefetchConfig
from offsim.policies.placement import PlacementConfig
from offsim.policies.reuse_distance import ReuseDistanceConfig

if TYPE_CHECKING:
    from offsim.config.run import RunConfig
    from offsim.plan.footprint import StateSizes

def build_context(cfg: RunConfig, n_tensors: int, bytes_per_param: float) -> BuildContext:
    """The strategy-level defaults a policy may read."""
    st = cfg.strategy
    return BuildContext(n_tensors=n_tensors, bytes_per_param=bytes_per_param,
                        prefetch_depth=st.prefetch_depth, reuse_distance_params=st.reuse_distance_params,
                        checkpointing=cfg.activation_checkpointing,
                        activations_tier=st.placement.activations, has_nvme=cfg.hardware.nvme is not None)


def custom_activations(cfg: RunConfig) -> bool:
    """True when an activation policy other than the strategy's placement is chosen."""
    return not isinstance(cfg.strategy.policies.activations, PlacementConfig)


def activation_policy(cfg: RunConfig, sz: StateSizes) -> ActivationPolicy:
    """The built activation policy (``auto-swap`` with the swap amount its search chose)."""
    return cfg.strategy.policies.activations.build(build_context(cfg, len(sz.layers), 0.0))


def activation_decisions(cfg: RunConfig, sz: StateSizes) -> list[ActivationDecision]:
    """The activation policy's decisions, checked: one per layer, recompute only for blocks,
    NVMe only when the profile has it."""
    layers = sz.layers
    policy = activation_policy(cfg, sz)
    out = list(policy.plan(layers))
    where = f"activations policy '{policy.name}'"
    if [d.layer for d in out] != [lay.index for lay in layers]:
        raise PolicyError(f"{where}: needs one decision per layer, in layer order (got layers "
                          f"{[d.layer for d in out]})")
    for d, lay in zip(out, layers, strict=True):
        if d.recompute and not lay.is_block:
            raise PolicyError(f"{where} at layer {lay.name}: recompute applies to transformer blocks only")
        if d.tier == "nvme" and cfg.hardware.nvme is None:
            raise ConfigError(f"{where} at layer {lay.name}: offloads to nvme but hardware profile "
                              f"'{cfg.hardware.name}' has no nvme block")
    return out


def param_window_bytes(cfg: RunConfig, sz: StateSizes, lookahead_bytes: float, budget_bytes: float) -> float:
    """GPU bytes of gathered parameters at once, for the footprint.

    ``lookahead_bytes`` is the estimate of the built-in rule (lookahead plus reuse distance);
    it stands for the default policies. A budget (``budget_bytes``, the parameter buffer's,
    :func:`offsim.systems._parts.fixed_param_budget_bytes`, or ``auto``) bounds everything; without one, caching
    policies may keep every layer, DeepSpeed's bucket rule holds about a bucket plus the layer
    computing, and a window prefetch may take whatever is free.
    """
    pol = cfg.strategy.policies
    total = sum(lay.params for lay in sz.layers) * sz.param_bytes / sz.params_total
    if pol.gpu_param_buffer_gib is not None:
        return min(total, budget_bytes)
    if not isinstance(pol.eviction, ReuseDistanceConfig):
        return total
    if isinstance(pol.prefetch, LookaheadConfig | NoPrefetchConfig):
        if isinstance(pol.prefetch, NoPrefetchConfig) or (
                pol.prefetch.depth is not None and pol.prefetch.depth != cfg.strategy.prefetch_depth):
            return min(total, _lookahead_estimate(cfg, sz, _depth(pol.prefetch, cfg)))
        return lookahead_bytes
    if isinstance(pol.prefetch, BucketConfig):
        biggest = max(lay.params for lay in sz.layers) * sz.param_bytes / sz.params_total
        bucket_params = min(pol.prefetch.bucket_params, pol.prefetch.max_live_params)
        bucket = bucket_params * sz.param_bytes / sz.params_total
        return min(total, lookahead_bytes + bucket + biggest)
    return total


def _depth(prefetch: LookaheadConfig | NoPrefetchConfig, cfg: RunConfig) -> int:
    if isinstance(prefetch, NoPrefetchConfig):
        return 0
    return cfg.strategy.prefetch_depth if prefetch.depth is None else prefetch.depth


def _lookahead_estimate(cfg: RunConfig, sz: StateSizes, depth: int) -> float:
    st = cfg.strategy.model_copy(update={"prefetch_depth": depth})
    layers = gpu_param_window_layers(cfg.model_copy(update={"strategy": st}), sz)
    return layers * max(lay.params for lay in sz.layers) * sz.param_bytes / sz.params_total


def gpu_param_window_layers(cfg: RunConfig, sz: StateSizes) -> int:
    """Most layers whose gathered parameters are on the GPU at once when params are streamed."""
    block = max(1, max(lay.params for lay in sz.layers[1:-1]) if len(sz.layers) > 2 else sz.layers[0].params)
    reuse = int(cfg.strategy.reuse_distance_params // block)
    return min(len(sz.layers), cfg.strategy.prefetch_depth + 1 + reuse)


def dram_cache_bytes(cfg: RunConfig, sz: StateSizes) -> float:
    """Bytes of the DRAM cache over NVMe-resident optimizer state that can be used: 0 unless the
    state lives on NVMe and is updated by the CPU per sub-group; capped at the state's size; 0 when smaller
    than one sub-group (nothing fits)."""
    st = cfg.strategy
    if st.placement.optimizer_states != "nvme" or st.optimizer_device != "cpu":
        return 0.0
    if st.optimizer_schedule != "after-backward":  # layer-wise updates do not use sub-groups
        return 0.0
    total = sz.local_params * sz.optimizer_bytes_per_param
    n = max(1, math.ceil(sz.local_params / st.sub_group_params))
    if st.policies.dram_cache_bytes < total / n:
        return 0.0
    return min(st.policies.dram_cache_bytes, total)
