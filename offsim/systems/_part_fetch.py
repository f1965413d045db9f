"""Builders of the forward side's mechanisms from a strategy's shared knobs: compute, the
parameter fetch with its GPU budget, and activations.
"""

from __future__ import annotations

import math
from dataclasses import replace

from offsim.config.run import RunConfig
from offsim.core.enums import Tier
from offsim.mechanisms.activations import Activations, LayerActivations
from offsim.mechanisms.base import sum_needs
from offsim.mechanisms.compute import Compute, LayerCost
from offsim.mechanisms.host_dispatch import HostDispatched
from offsim.mechanisms.param_fetch import LayerFetch, ParamFetch
from offsim.plan import footprint as fp
from offsim.plan.policy_plan import (
    gpu_param_window_layers,
    param_window_bytes,
)
from offsim.plan.zero3_fetch import Zero3FetchRule, Zero3Window, window_params
from offsim.policies.lookahead import LookaheadConfig
from offsim.policies.reuse_distance import ReuseDistanceConfig
from offsim.systems._ctx import Ctx, whole
from offsim.systems._part_grads import _swap_buffers_pinned


def compute(c: Ctx) -> Compute | HostDispatched:
    tp = c.cfg.workload.training.tensor_parallel
    hidden = 2.0 * c.cfg.workload.training.tokens_per_micro_batch * c.cfg.workload.model.hidden
    allreduce = c.paths.ring(whole(2 * 2.0 * (tp - 1) / tp * hidden), 2 * 2.0 * (tp - 1)) if tp > 1 else None
    kernels = Compute(tuple(LayerCost(lay.fwd_s, lay.bwd_s, lay.fwd_flop, rc, allreduce if lay.is_block else None)
                            for lay, rc in zip(c.layers, c.recompute, strict=True)))
    per_submodule_s = c.st.zero3_submodule_host_s
    if per_submodule_s <= 0 or not (c.v.deepspeed_grads and c.st.zero_stage == 3):
        return kernels
    n = layer_submodules(c)
    return HostDispatched(kernels, tuple(k * per_submodule_s for k in n),
                          tuple(k * per_submodule_s * (2 if rc else 1) for k, rc in zip(n, c.recompute, strict=True)))


def layer_submodules(c: Ctx) -> tuple[int, ...]:
    """Submodules whose ZeRO-3 hooks fire per layer and pass, in the Hugging Face Llama layout
    (modeling_llama.py): the embedding; per block the block, its two norms, the attention and
    its projections, the MLP and its two or three projections (each projection ``tiles`` times
    with TiledLinear); the final norm and the LM head. Megatron's fused QKV has fewer
    projections but adds the core-attention modules; a mixture of experts counts as dense."""
    m, tiles = c.cfg.workload.model, c.st.zero3_tiles_per_linear
    block = 1 + 2 + 1 + len(m.attention_matrices()) * tiles + 1 + (3 if m.mlp == "gated" else 2) * tiles
    head = 2 if m.lm_head else 1
    return tuple(block if lay.is_block else (1 if lay.name == "embed" else head) for lay in c.layers)


def param_fetch(c: Ctx) -> ParamFetch | None:
    if not fp.params_streamed(c.cfg):
        return None
    out = []
    staging_cap = whole(c.st.pinned_buffer_count * c.st.pinned_buffer_bytes)
    for lay in c.layers:
        full = lay.params * c.bpp_param
        part = full / c.sz.param_part
        home = c.st.placement.params
        if c.layerwise:
            part *= c.host_share[lay.index]
            home = home if part > 0 else "gpu"
        nvme = c.paths.nvme(True, whole(part)) if home == "nvme" else None
        # NVMe-homed parameters arrive in the parameter swapper's buffers: CUDA-pinned before v0.19.4,
        # mlock'd and unregistered since (strategy.nvme_swap_buffers; partitioned_param_swapper.py)
        h2d = c.paths.dma(True, whole(part), pinned=_swap_buffers_pinned(c) if home == "nvme" else c.st.pin_memory) \
            if home in ("nvme", "cpu") else None
        gather = c.collective(full, 1.0) if c.sz.param_part > 1 else None
        out.append(LayerFetch(whole(full), nvme, h2d, gather, min(whole(part), staging_cap)))
    fetch = within_budget(c, ParamFetch(tuple(out), None, released_before_step=releases_before_step(c)),
                          fixed_param_budget_bytes(c.cfg))
    return by_submodules(c, fetch) if on_zero3_submodule_fetch(c) else fetch


def releases_before_step(c: Ctx) -> bool:
    """Whether every gathered parameter is released between the last backward and the step:
    a system on DeepSpeed's ZeRO-3 path (``Variants.deepspeed_grads``) at stage 3 (stage3.py
    ``step`` -> ``_partition_all_parameters``, v0.6.0 on; the end of ``backward`` before). Other
    systems keep their window through the step as before."""
    return c.v.deepspeed_grads and c.st.zero_stage == 3


def on_zero3_submodule_fetch(c: Ctx) -> bool:
    """True when the parameters are gathered as DeepSpeed ZeRO-3 gathers them, per submodule
    (:mod:`offsim.plan.zero3_fetch`): a system on DeepSpeed's ZeRO-3 path (``Variants.deepspeed_grads``),
    stage 3, the built-in policies (release after use within the reuse distance, lookahead
    prefetch, no parameter budget) and no layer-wise update; other systems and policies keep
    offsim's whole-layer units."""
    pol = c.st.policies
    return (c.v.deepspeed_grads and c.st.zero_stage == 3 and not c.layerwise and pol.gpu_param_buffer_gib is None
            and isinstance(pol.eviction, ReuseDistanceConfig) and isinstance(pol.prefetch, LookaheadConfig)
            and pol.prefetch.depth is None)


def zero3_window(c: Ctx) -> Zero3Window:
    """The submodule rule's window for ``c`` (:func:`offsim.plan.zero3_fetch.window_params`):
    tiles from ``strategy.zero3_tiles_per_linear``, two copies in flight when the partition group
    has more than one rank, the strategy's prefetch bucket (none when ``prefetch_depth`` is 0: a
    zero ``stage3_prefetch_bucket_size``), live cap and reuse distance."""
    st = c.st
    rule = Zero3FetchRule(tiles_per_linear=st.zero3_tiles_per_linear,
                          gather_copies=2 if c.sz.param_part > 1 else 1,
                          prefetch_bucket_params=st.zero3_prefetch_bucket_params if st.prefetch_depth > 0 else 0.0,
                          max_live_params=st.zero3_max_live_params,
                          reuse_distance_params=st.reuse_distance_params)
    return window_params(c.cfg.workload.model, c.layers, c.recompute, rule)


def by_submodules(c: Ctx, fetch: ParamFetch) -> ParamFetch:
    """``fetch`` with DeepSpeed's submodule window where it is smaller than the whole-layer one.

    The timeline stays per layer (each layer's fetch moves the whole layer, prefetched and
    released as before: with module-ahead prefetch DeepSpeed overlaps the next modules' gather
    with the current compute, as the layer-ahead prefetch does; the cache's sizes stay whole
    layers, the reuse distance's measure). The memory is the submodule rule: the cache unit holds
    nothing between uses (DeepSpeed releases module by module; what it prefetches across a
    layer boundary is counted in the current layer's peak), and each layer holds its peak of
    gathered submodules on the compute stream from its issue to its done. The footprint's window
    adds the parameters retained at the forward-to-backward turn, which the engine's GPU level
    does not hold (its cache hits still skip their fetches)."""
    w = zero3_window(c)
    window = whole(w.window_params * c.bpp_param)
    if window >= fetch.window_bytes:
        return fetch
    layers = tuple(replace(f, held_bytes=0, working_bytes=whole(peak * c.bpp_param))
                   for f, peak in zip(fetch.layers, w.layer_peak_params, strict=True))
    return replace(fetch, layers=layers, window_bytes=window)


#: Share of GPU memory an ``auto`` parameter budget leaves unused, against the other mechanisms'
#: declared needs being a little short of what the engine allocates at some instant.
AUTO_HEADROOM = 0.02


def fixed_param_budget_bytes(cfg: RunConfig) -> float:
    """The GPU parameter buffer's budget as the strategy sets it: ``gpu_param_buffer_gib`` in
    bytes; ``inf`` without one, and for ``auto`` until :func:`standard` knows what the other
    mechanisms need."""
    b = cfg.strategy.policies.gpu_param_buffer_gib
    return math.inf if b is None or b == "auto" else float(b) * 2**30


def within_budget(c: Ctx, fetch: ParamFetch, budget_bytes: float) -> ParamFetch:
    """``fetch`` with the budget ``budget_bytes`` (``inf``: none) and the window it allows."""
    biggest = max(lay.params for lay in c.layers) * c.bpp_param
    lookahead = gpu_param_window_layers(c.cfg, c.sz) * biggest
    window = param_window_bytes(c.cfg, c.sz, lookahead, budget_bytes)
    return replace(fetch, budget_bytes=None if math.isinf(budget_bytes) else whole(budget_bytes),
                   window_bytes=whole(window))


def auto_param_budget_bytes(c: Ctx, others: list[object]) -> float:
    """An ``auto`` budget: the GPU memory the other mechanisms' needs leave, less
    :data:`AUTO_HEADROOM` (their elastic needs take what the budget leaves in turn)."""
    needs = [n for m in others for n in m.footprint() if n.unit_bytes <= 0]  # type: ignore[attr-defined]
    capacity = c.cfg.hardware.gpu.memory_bytes
    return max(0.0, capacity * (1 - AUTO_HEADROOM) - sum(sum_needs(needs, capacity)["gpu"].values()))


def activations(c: Ctx) -> Activations:
    staging_cap = whole(c.st.pinned_buffer_count * c.st.pinned_buffer_bytes)
    gb = fp.grad_buffer_bytes(c.cfg, c.sz)
    out, reserve = [], []
    for lay, rc, tier, moved in zip(c.layers, c.recompute, c.act_tier, c.offloads, strict=True):
        kept = whole(lay.kept_bytes(rc))
        transient = whole(lay.act_full_bytes) - kept if kept < whole(lay.act_full_bytes) else 0
        work = whole(lay.backward_work_bytes(rc))
        reserve.append(work + whole(gb))
        if not moved:
            out.append(LayerActivations(kept, transient, work, Tier.GPU))
        elif tier is Tier.NVME and c.v.nvme_activations is not None:
            out.append(c.v.nvme_activations(c, kept, transient, work))
        elif tier is Tier.NVME:
            out.append(LayerActivations(kept, transient, work, tier, c.paths.dma(False, kept),
                                        c.paths.nvme(False, kept), c.paths.dma(True, kept), c.paths.nvme(True, kept),
                                        min(kept, staging_cap)))
        else:
            pinned = c.st.pin_memory
            out.append(LayerActivations(kept, transient, work, c.host, c.paths.dma(False, kept, pinned),
                                        back=c.paths.dma(True, kept, pinned)))
    return Activations(tuple(out), c.st.prefetch_depth, tuple(reserve))
