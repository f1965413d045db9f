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
import math
from typing import cast

from pydantic import Field

from offsim.config.base import Frozen
from offsim.config.run import RunConfig
from offsim.config.workload import DTYPE_BYTES
from offsim.core.enums import ChoiceId, TensorKind, Tier
from offsim.engine.hooks import ChoicePolicy
from offsim.mechanisms.base import Mechanism
from offsim.mechanisms.cpu_optimizer import CpuOptimizer, GpuSplit, GroupIO, StreamedGroup
from offsim.mechanisms.grads import Grads
from offsim.mechanisms.static_state import StaticItem, StaticState
from offsim.plan import footprint as fp
from offsim.plan.footprint import StateSizes
from offsim.plan.optimizer_split import (
    GapSplit,
    PerfModelSplit,
    SplitBytes,
    SplitRates,
    fork_host_state,
    gap_gpu_share,
    gap_on_gpu,
    interleave_layout,
)
from offsim.systems._compile import System
from offsim.systems._options import read_options
from offsim.systems._part_optimizer import _group_io as group_io
from offsim.systems._part_optimizer import _step_period as step_period
from offsim.systems._part_optimizer import optimizer
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
    #: the model's parameters as Megatron-DeepSpeed registers them (the artifact's launcher):
    #: per block the input norm, the fused QKV, the attention output, the second norm, the fused
    #: SwiGLU fc1 (gate and up), fc2 (megatron/model/transformer.py ``ParallelTransformerLayer``,
    #: ``ParallelAttention``, ``ParallelMLP``), which decides DeepSpeed's sub-groups
    #: (:func:`megatron_tensors`); False: offsim's Hugging Face per-matrix list.
    megatron_layout: bool = False


NOTE = ("optimizer_split perf-model: the sub-groups streamed to the GPU are chosen when each step starts, from the "
        "previous step's CPU rate and the GPU memory free then (Deep Optimizer States); the program shown is the "
        "default option's, every sub-group on the CPU")
FORK_NOTE = ("prefetch_optimizer_gap: the fork's fixed split over DeepSpeed's own sub-groups, laid out so that the "
             "step's spread picks the fork's GPU-only ones (each side in the fork's order)")


def compose(cfg: RunConfig, sz: StateSizes | None = None) -> System:
    """The standard mechanisms, the CPU optimizer carrying the GPU split when it is on; with the
    fork's fixed gap, the fork's own sub-groups and step (:func:`fork_system`); the fixed split with
    ``megatron_layout``, DeepSpeed's own sub-groups of that layout (:func:`layout_system`)."""
    c = build_ctx(cfg, sz, Variants(deepspeed_grads=True))  # DeepSpeed ZeRO-3's partition_grads
    if c.st.optimizer_split != "perf-model":
        return layout_system(c) if read_options(c.st, Options).megatron_layout else standard(c)
    gap = read_options(c.st, Options).prefetch_optimizer_gap
    if gap is None:
        return standard(c, gpu_split(c, subgroups(c)), (NOTE,))
    return fork_system(c, gap)


def fork_groups(c: Ctx) -> list[int]:
    """The rank's optimizer sub-groups as DeepSpeed forms them (elements each, in order:
    :func:`~offsim.plan.footprint.deepspeed_sub_groups`) over the partitions of the model's
    tensors (:func:`megatron_tensors` with ``megatron_layout``); the artifact's 7B: 130 of 16.8M
    to 206M elements at sub_group_size 1e7, as its log counts (``After creating fp16
    partitions: 130``)."""
    tensors = megatron_tensors(c) if read_options(c.st, Options).megatron_layout else None
    if tensors is None:
        return fp.deepspeed_sub_groups(fp.param_partitions(c.cfg, c.sz), c.st.sub_group_params)
    parts = [math.ceil(n / c.sz.param_part) for n in tensors]
    return fp.deepspeed_sub_groups(parts, c.st.sub_group_params)


def layout_system(c: Ctx) -> System:
    """The fixed split (every sub-group on the CPU: vanilla ZeRO-3 offload, the artifact's
    ``prefetch_optimizer 0`` run) on DeepSpeed's own sub-groups of the Megatron layout
    (:func:`fork_groups`), not offsim's equal ones: the sub-group loop of stage3.py ``step`` (CPU
    Adam, the 16-bit cast and its blocking upload, one per sub-group) and each sub-group's fp32
    gradient, pinned on its own and so rounded up on its own by the caching host allocator
    (``initialize_optimizer_states``: zeros + pinned copy per sub-group, deepspeed_runtime.md 13).
    The vanilla 7B log counts 130 (``After creating fp16 partitions: 130``)."""
    system = standard(c)
    static = system.mechanisms["static"]
    groups = [float(p) for p in fork_groups(c)]
    layout_opt = optimizer(c, None, groups)
    on_cpu = isinstance(system.mechanisms["optimizer"], CpuOptimizer) and c.st.optimizer_gpu_fraction == 0.0
    if not (on_cpu and isinstance(layout_opt, CpuOptimizer) and isinstance(static, StaticState)):
        return system  # a share kept on the GPU: fork_groups covers every parameter, so the equal ones stay
    mechs = {**system.mechanisms, "optimizer": cast("Mechanism", layout_opt),
             "static": cast("Mechanism", layout_static(c, static, groups))}
    return dataclasses.replace(system, mechanisms=mechs, step_period=step_period(layout_opt.orders))


def layout_static(c: Ctx, static: StaticState, groups: list[float]) -> StaticState:
    """``static`` with the pinned host gradients (``grads (optimizer format)``) rounded per
    sub-group of ``groups`` (parameters each) instead of per equal sub-group: the fp32 gradient of
    every sub-group is its own pinned tensor (:func:`layout_system`)."""
    st, what = c.st, "grads (optimizer format)"
    if not (st.pin_memory and st.host_allocator == "caching"):
        return static
    hg = c.sz.host_grad_bytes_per_param
    items = tuple(dataclasses.replace(i, nbytes=whole(sum(fp.round_pinned(p * hg, "caching") for p in groups)))
                  if i.what == what and i.tier is Tier.HOST_PINNED else i for i in static.items)
    return dataclasses.replace(static, items=items)


def megatron_tensors(c: Ctx) -> list[int] | None:
    """Elements of each parameter tensor in the order DeepSpeed receives Megatron-DeepSpeed's GPT
    (the word embedding (and learned positions), per block a norm, ``self_attention.dense``,
    ``self_attention.query_key_value`` (Wq, Wk, Wv fused), the second norm,
    ``mlp.dense_h_to_4h`` (gate and up fused with SwiGLU), ``mlp.dense_4h_to_h``, then
    ``final_layernorm`` and the untied ``output_layer``); a block's biases, if any, are counted
    with its norms. The order within the attention is the one both 7B sample logs' sub-groups
    imply (stage3.py ``_create_fp16_partitions_with_defragmentation``: 'Subgroup 1, numel:
    16781312', 'Subgroup 2, numel: 20971520', then 90181632 and 45088768 per block: a norm with
    the 4096 x 4096 matrix, the fused QKV alone), not the modules' registration order (norm +
    QKV, then dense, would give 20975616 and 16777216); which step of Megatron-DeepSpeed's
    parameter grouping puts the dense first is not identified. None for a mixture of experts
    or latent attention (no such layout here) or a layer split by tensor parallelism."""
    model = c.cfg.workload.model
    if model.moe is not None or model.mla is not None:
        return None
    out: list[int] = []
    wq, wk, wv, wo = model.attention_matrices()
    for lay in c.sz.layers:
        if lay.name in ("embed", "head"):  # the embedding; the final norm, then the output layer
            out += fp.layer_tensors(model, lay)
            continue
        mlp = [model.hidden * model.ffn_hidden] * (3 if model.mlp == "gated" else 2)
        rest = lay.params - (wq + wk + wv + wo + sum(mlp))
        if rest < 0:
            return None
        fc1 = sum(mlp[:-1])
        out += [rest - rest // 2, wo, wq + wk + wv, rest // 2, fc1, mlp[-1]]
    return [n for n in out if n > 0]


def fork_layout(c: Ctx, gap: int) -> tuple[list[int], list[bool]]:
    """The fork's sub-groups laid out for the step's split (:func:`~offsim.plan.optimizer_split.
    interleave_layout`: the mechanism's spread picks exactly the fork's GPU-only sub-groups, and
    each side keeps the fork's order), and per position whether it is on the GPU."""
    groups = fork_groups(c)
    on_gpu = gap_on_gpu(len(groups), gap)
    layout = interleave_layout(on_gpu)
    return [groups[x] for x in layout], [on_gpu[x] for x in layout]


def fork_system(c: Ctx, gap: int) -> System:
    """The artifact fork's hybrid step (DataStates/DeepSpeed deep-optimizer-states 4570a955,
    stage3.py ``step``) on DeepSpeed's own sub-groups (:func:`fork_groups`), not offsim's equal
    ones: the GPU-only sub-groups (:func:`~offsim.plan.optimizer_split.gap_on_gpu`) go through
    the GPU one at a time, their state's D2H and the next one's H2D queued on the same three
    copier streams (``opt_transfers``: ``prefetch_optimizer_copier_{m,v,p}``, each a
    ``cudaMemcpyAsync`` on its own stream, csrc/async_copier/async_copier.cpp) so they follow
    each other, and the step waits for them before the GPU update (``copier_{m,v,p}.wait()``,
    ``cudaStreamSynchronize``); the CPU updates the others meanwhile. The gradients of the
    GPU-only sub-groups stay on the GPU at the boundary (:func:`kept_on_gpu`)."""
    groups, on_gpu = fork_layout(c, gap)
    n = len(groups)
    system = standard(c, fork_split(c, groups, on_gpu), (FORK_NOTE,))
    opt = system.mechanisms["optimizer"]
    if isinstance(opt, CpuOptimizer):
        orders = tuple(tuple(range(n)) for _ in opt.orders)  # the fork's loop: for sub_group_id in order
        ios = tuple(group_io(c, p, False) if g else fork_cpu_io(c, p) for p, g in zip(groups, on_gpu, strict=True))
        fork_opt = dataclasses.replace(opt, groups=ios, orders=orders)
        system = dataclasses.replace(system, mechanisms={**system.mechanisms, "optimizer": fork_opt})
    static = system.mechanisms["static"]
    if isinstance(static, StaticState):
        fork_state = cast("Mechanism", fork_static(c, gap, static))  # as standard() puts it among its mechanisms
        system = dataclasses.replace(system, mechanisms={**system.mechanisms, "static": fork_state})
    share = gap_gpu_share(fork_groups(c), gap)
    grads = system.mechanisms["grads"]
    if share <= 0 or not isinstance(grads, Grads) or not grads.buckets:
        return system
    kept = cast("Mechanism", kept_on_gpu(c, grads, share))  # as standard() puts Grads among its mechanisms
    return dataclasses.replace(system, mechanisms={**system.mechanisms, "grads": kept})


def fork_cpu_io(c: Ctx, params: float) -> GroupIO:
    """A CPU-updated sub-group's step in the fork: DeepSpeed's unscale, CPU Adam and 16-bit cast,
    but its 16-bit parameters go home from a pinned buffer beside the step, not by ZeRO-3's
    blocking pageable ``copy_``: with ``prefetch_optimizer`` ``_reassign_or_swap_out_partitioned_
    parameters`` skips that copy, and ``downsample_fp32_fp16``, on the step's executor thread,
    casts into ``prefetch_optimizer_cpu_fp16_pinned_params`` and queues the H2D on its own copier
    stream (``prefetch_optimizer_copier_fetch_fp16``), which the loop waits for only at the next
    CPU-with-prefetch sub-group."""
    io = group_io(c, params, False)
    home = c.paths.dma(True, whole(params * c.bpp_param), True) if io.params_home is not None else None
    return dataclasses.replace(io, params_home=home, home_blocks=False, home_gpu_bytes=0)


def fork_static(c: Ctx, gap: int, static: StaticState) -> StaticState:
    """The start-up state with the fork's optimizer state (:func:`~offsim.plan.optimizer_split.
    fork_host_state`) in place of DeepSpeed's host items for it (a pageable fp32 master and
    CPU Adam's moments for every sub-group), and the last GPU-only sub-group's state that stays
    on the GPU between steps."""
    pr, st = c.cfg.workload.precision, c.st
    allocator = st.host_allocator if st.pin_memory else "exact"
    host = fork_host_state(fork_groups(c), gap, DTYPE_BYTES[pr.master_params], DTYPE_BYTES[pr.optimizer_moments],
                           DTYPE_BYTES[pr.params], lambda n: fp.round_pinned(n, allocator))
    pinned = Tier.HOST_PINNED if st.pin_memory else Tier.HOST_PAGEABLE
    kept = [i for i in static.items
            if not (i.kind is TensorKind.OPT_STATE and i.tier in (Tier.HOST_PINNED, Tier.HOST_PAGEABLE))]
    what = "optimizer state: fp32 master params and moments, pinned per sub-group (fork)"
    fork = [StaticItem(pinned, whole(host.pinned_state_bytes), what, TensorKind.OPT_STATE),
            StaticItem(pinned, whole(host.pinned_lp_bytes), "16-bit cast buffers of the CPU sub-groups (fork)"),
            StaticItem(Tier.HOST_PAGEABLE, whole(host.cpu_moments_bytes),
                       "optimizer state: CPU Adam moments of the CPU sub-groups (pageable)", TensorKind.OPT_STATE),
            StaticItem(Tier.GPU, whole(host.gpu_resident_bytes),
                       "optimizer state of the last GPU sub-group, kept between steps (fork)", TensorKind.OPT_STATE)]
    return dataclasses.replace(static, items=(*kept, *(i for i in fork if i.nbytes > 0)))


def fork_split(c: Ctx, groups: list[int], on_gpu: list[bool]) -> GpuSplit:
    """:func:`gpu_split` over the fork's sub-groups, less the last GPU-only sub-group's D2H: the
    fork copies a GPU-only sub-group's state back in ``opt_transfers`` of the next
    CPU-with-prefetch sub-group (``get_prev_next_subgroup_on_gpu(prev=True)``), and none follows
    the last one (from sub-group 0 of the next step it finds none, -1), so that state stays on
    the GPU and is never copied back."""
    split = gpu_split(c, [float(p) for p in groups])
    last = max((k for k, g in enumerate(on_gpu) if g), default=None)
    if last is None:
        return split
    skipped = dataclasses.replace(split.groups[last], to_host=c.paths.dma(False, 0, c.st.pin_memory))
    return dataclasses.replace(split, groups=(*split.groups[:last], skipped, *split.groups[last + 1:]))


def gpu_kept_share(c: Ctx) -> float:
    """The share of the gradient elements whose sub-group the fork's fixed gap updates on the GPU
    (:func:`~offsim.plan.optimizer_split.gap_gpu_share` of DeepSpeed's sub-groups); 0 with the
    performance model, whose choice comes at the step, after the boundary."""
    gap = read_options(c.st, Options).prefetch_optimizer_gap
    if gap is None:
        return 0.0
    return gap_gpu_share(fork_groups(c), gap)


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
        out.append(dataclasses.replace(bucket, flows=flows))
    return dataclasses.replace(grads, buckets=tuple(out))


def choice_policies(cfg: RunConfig, sz: StateSizes) -> dict[ChoiceId, ChoicePolicy]:
    """The split's run-time policy (none when the split is off)."""
    if cfg.strategy.optimizer_split != "perf-model":
        return {}
    gap = read_options(cfg.strategy, Options).prefetch_optimizer_gap
    if gap is not None:
        return {ChoiceId.OPTIMIZER_SPLIT: GapSplit(len(fork_groups(build_ctx(cfg, sz))), gap)}
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
