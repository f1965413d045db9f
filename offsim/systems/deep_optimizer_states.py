"""Deep Optimizer States (Maurya et al., Middleware 2024, arXiv 2410.21316).

DeepSpeed ZeRO-3 with the optimizer on the CPU, plus two additions (the artifact's
``part_grads_async`` and ``prefetch_optimizer``): gradients flushed to the host during backward
(the ``overlap_grad_offload`` knob), and, each step, a performance model that picks host
sub-groups whose fp32 state and gradient are moved to the GPU, updated there and moved back,
interleaved with CPU Adam on the others.

The split is this system's own mechanism argument: the optimizer's :class:`GpuSplit` (every
sub-group's round trip through the GPU) and the step's run-time choice, decided by
:class:`~offsim.plan.optimizer_split.PerfModelSplit` from the previous step's CPU rate and the GPU
memory free then. ``optimizer_split: fixed`` is the same system without it (vanilla ZeRO-3 offload,
the paper's baseline).
"""

from __future__ import annotations

import dataclasses
from typing import cast

from pydantic import Field

from offsim.config.base import Frozen
from offsim.config.run import RunConfig
from offsim.core.enums import ChoiceId
from offsim.engine.hooks import ChoicePolicy
from offsim.mechanisms.base import Mechanism
from offsim.mechanisms.cpu_optimizer import GpuSplit, StreamedGroup
from offsim.mechanisms.grads import GradBucket, Grads
from offsim.plan.footprint import StateSizes
from offsim.plan.optimizer_split import GapSplit, PerfModelSplit, SplitBytes, SplitRates, gap_gpu_groups
from offsim.systems._compile import System
from offsim.systems._options import read_options
from offsim.systems._parts import Ctx, Variants, build_ctx, gpu_adam_bpp, optimizer_dram_bpp, standard, subgroups, whole

OPTIONS: frozenset[str] = frozenset({"optimizer_split"})



class Options(Frozen):
    """Deep Optimizer States' own knobs (the artifact's DeepSpeed fork, DataStates/DeepSpeed)."""

    #: ``prefetch_optimizer_gap``: the fork's fixed rule instead of the paper's performance model
    #: (stage3.py ``get_opt_update_device``: sub-group x on the GPU iff x % gap != 0 and
    #: (x + 1) % gap == 0; :func:`offsim.plan.optimizer_split.gap_gpu_groups`); the artifact's
    #: sample logs ran gap 2 (``...-opt_gaps2.log``). offsim spreads those sub-groups evenly
    #: through the order (:func:`~offsim.plan.optimizer_split.interleave`), one position earlier
    #: than the fork. None: the performance model.
    prefetch_optimizer_gap: int | None = Field(None, ge=2)


NOTE = ("optimizer_split perf-model: the sub-groups streamed to the GPU are chosen when each step starts, from the "
        "previous step's CPU rate and the GPU memory free then (Deep Optimizer States); the program shown is the "
        "default option's, every sub-group on the CPU")


def compose(cfg: RunConfig, sz: StateSizes | None = None) -> System:
    """The standard mechanisms, the CPU optimizer carrying the GPU split when it is on; with the
    fork's fixed gap, the gradients of the sub-groups it updates on the GPU stay there
    (:func:`kept_on_gpu`)."""
    c = build_ctx(cfg, sz, Variants(deepspeed_grads=True))  # DeepSpeed ZeRO-3's partition_grads
    if c.st.optimizer_split != "perf-model":
        return standard(c)
    system = standard(c, gpu_split(c, subgroups(c)), (NOTE,))
    share = gpu_kept_share(c)
    grads = system.mechanisms["grads"]
    if share <= 0 or not isinstance(grads, Grads) or not grads.buckets:
        return system
    kept = cast("Mechanism", kept_on_gpu(c, grads, share))  # as standard() puts Grads among its mechanisms
    return dataclasses.replace(system, mechanisms={**system.mechanisms, "grads": kept})


def gpu_kept_share(c: Ctx) -> float:
    """The share of the gradient elements whose sub-group the fork's fixed gap updates on the GPU
    (:func:`~offsim.plan.optimizer_split.gap_gpu_groups` of offsim's equal sub-groups); 0 with the
    performance model, whose choice comes at the step, after the boundary."""
    gap = read_options(c.st, Options).prefetch_optimizer_gap
    if gap is None:
        return 0.0
    n = len(subgroups(c))
    return gap_gpu_groups(n, gap) / n


def kept_on_gpu(c: Ctx, grads: Grads, share: float) -> Grads:
    """The fork's boundary for its GPU-only sub-groups (DataStates/DeepSpeed deep-optimizer-states
    stage3.py ``partition_grads``: ``get_opt_update_device(i) == PF_OPT_GPU_ONLY`` ->
    ``gpu_fp32_grad_tensor.copy_(grad_buffer)`` into ``prefetch_optimizer_gpu_fp32_grads[i]``, a
    GPU tensor of ``gradient_accumulation_dtype``, bf16 in the sample logs): ``share`` of each
    bucket's elements skip the fp32 GPU cast and D2H and are copied on the GPU instead (b_acc read
    and written), held on the GPU (b_acc each) until backward ends (the fork frees each as its
    step takes it, ``del prefetch_optimizer_gpu_fp32_grads[next_on_gpu]``)."""
    hg, b_acc = c.sz.host_grad_bytes_per_param, c.bpp_grad
    hbm = c.cfg.hardware.gpu.hbm_bytes_per_s
    out = []
    for bucket in grads.buckets:
        g = bucket.flows
        if g.boundary_d2h is None:
            out.append(bucket)
            continue
        local = g.boundary_d2h.nbytes / hg
        kept = share * local
        d2h = c.paths.dma(False, whole(local * hg) - whole(kept * hg), c.st.pin_memory)
        gpu_s = g.boundary_norm_s + kept * (2 * b_acc - (b_acc + 4.0)) / hbm  # a 16-bit copy, not the fp32 cast
        flows = dataclasses.replace(g, boundary_d2h=d2h, boundary_norm_s=gpu_s,
                                    boundary_kept_gpu_bytes=whole(kept * b_acc))
        out.append(GradBucket(bucket.pieces, bucket.flush_layer, flows, bucket.continues))
    return dataclasses.replace(grads, buckets=tuple(out))


def choice_policies(cfg: RunConfig, sz: StateSizes) -> dict[ChoiceId, ChoicePolicy]:
    """The split's run-time policy (none when the split is off)."""
    if cfg.strategy.optimizer_split != "perf-model":
        return {}
    gap = read_options(cfg.strategy, Options).prefetch_optimizer_gap
    if gap is not None:
        return {ChoiceId.OPTIMIZER_SPLIT: GapSplit(len(subgroups(build_ctx(cfg, sz))), gap)}
    return {ChoiceId.OPTIMIZER_SPLIT: split_policy(cfg, sz)}


def split_bytes(c: Ctx) -> SplitBytes:
    """Bytes per parameter on each path of the split (:class:`~offsim.plan.optimizer_split.SplitBytes`);
    with the fork's fixed gap the GPU sub-groups' gradients are already on the GPU
    (:func:`kept_on_gpu`), so only their state comes up."""
    pl = c.st.placement
    hg, opt = c.sz.host_grad_bytes_per_param, c.sz.optimizer_bytes_per_param
    up = opt if gpu_kept_share(c) > 0 else opt + hg
    return SplitBytes(h2d_gpu=up, d2h_gpu=opt + (c.bpp_param if pl.params != "gpu" else 0.0),
                      hbm_gpu=gpu_adam_bpp(c), h2d_cpu=c.bpp_param if pl.params == "gpu" else 0.0,
                      gpu_buffer=opt + hg)


def gpu_split(c: Ctx, groups: list[float]) -> GpuSplit:
    """Every host sub-group's round trip through the GPU (``groups``: parameters each), for the
    step's run-time choice."""
    sz, b, pinned = c.sz, split_bytes(c), c.st.pin_memory
    hbm = c.cfg.hardware.gpu.hbm_bytes_per_s
    streamed = []
    for p in groups:
        gather = c.collective(p * c.bpp_param * sz.dp, 1.0) if c.st.zero_stage in (1, 2) else None
        streamed.append(StreamedGroup(whole(p * b.gpu_buffer),
                                      c.paths.dma(True, whole(p * b.h2d_gpu), pinned), p * b.hbm_gpu / hbm,
                                      c.paths.dma(False, whole(p * b.d2h_gpu), pinned), gather))
    return GpuSplit(tuple(streamed))


def split_policy(cfg: RunConfig, sz: StateSizes | None = None) -> PerfModelSplit:
    """The split's run-time policy, starting from the profile's rates (CPU Adam also bound by DRAM)."""
    c = build_ctx(cfg, sz)
    hw, groups = cfg.hardware, subgroups(c)
    cpu = min(hw.cpu.optimizer_params_per_s, hw.dram.bandwidth_bytes_per_s / optimizer_dram_bpp(c))
    link, kind = hw.host_link, "pinned" if c.st.pin_memory else "pageable"
    rates = SplitRates(cpu_params_per_s=cpu / c.sz.ranks_per_node,
                       h2d_bytes_per_s=getattr(link.h2d, kind).peak_bytes_per_s,
                       d2h_bytes_per_s=getattr(link.d2h, kind).peak_bytes_per_s,
                       hbm_bytes_per_s=hw.gpu.hbm_bytes_per_s, duplex_efficiency=link.duplex_efficiency)
    return PerfModelSplit(len(groups), groups[0], rates, split_bytes(c), 3 if c.st.optimizer_swap_pipeline else 1)
