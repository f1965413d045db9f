"""The mechanisms' arguments from a strategy's shared knobs, and the standard composition.

The system files of this package (one per published system) build their mechanisms here:
each builder reads the knobs every system shares (placement, ZeRO stage, buffers, bucket
sizes...) and returns a mechanism with its numbers computed once (bytes rounded to integers
here, at compile time). The variants one published system introduced are not knobs here: the
system file says which it composes (:class:`Variants`), and a system's own pieces live in its
file (GPUDirect activations in :mod:`~offsim.systems.tba_ssdtrain`, NVMe/PFS striping in
:mod:`~offsim.systems.mlp_offload`, the run-time split in
:mod:`~offsim.systems.deep_optimizer_states`). :func:`standard` composes them along the
standard order.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from offsim.config.run import RunConfig
from offsim.config.workload import DTYPE_BYTES
from offsim.core.enums import CacheId, TensorKind, Tier, home_tier
from offsim.mechanisms.activations import Activations, LayerActivations
from offsim.mechanisms.base import SiteKind, Stage, StorageIO, sum_needs
from offsim.mechanisms.compute import Compute, LayerCost
from offsim.mechanisms.cpu_optimizer import (
    CpuOptimizer,
    GpuSplit,
    GroupIO,
    dram_cache_programs,
    storage_cache_spec,
)
from offsim.mechanisms.gpu_optimizer import GpuOptimizer
from offsim.mechanisms.grads import Grads, LayerGrads, LayerUpdate
from offsim.mechanisms.param_fetch import LayerFetch, ParamFetch
from offsim.mechanisms.static_state import StaticItem, StaticState
from offsim.plan import footprint as fp
from offsim.plan.cpu_adam import LpCopy, fused_upload_bytes_per_param
from offsim.plan.deepspeed_versions import Z3Fp32GradCopy
from offsim.plan.model import Layer
from offsim.plan.paths import Paths, resource_capacities
from offsim.plan.policy_plan import (
    activation_decisions,
    build_context,
    custom_activations,
    dram_cache_bytes,
    gpu_param_window_layers,
    param_window_bytes,
)
from offsim.schedule.ops import CacheSpec, Flow
from offsim.systems._compile import System


def whole(x: float) -> int:
    """Bytes rounded once, at compile time."""
    return round(x)


#: a system's own optimizer-state I/O: (ctx, read, bytes) -> the parts of the transfer
StorageBuilder = Callable[["Ctx", bool, float], StorageIO]
#: a system's own NVMe-homed layer activations: (ctx, kept, transient, work bytes) -> the layer's
NvmeActivations = Callable[["Ctx", int, int, int], LayerActivations]


@dataclass(frozen=True)
class Variants:
    """The mechanism variants beyond DeepSpeed ZeRO's that a system composes; the system file sets
    them (``custom`` from the strategy's knobs, which only it and the owning systems accept).

    Attributes:
        layerwise_update: each layer's optimizer step inside backward, as its gradient arrives
            (Fuyou, Harmony, LSP-Offload, ProTrain, SuperOffload).
        grad_compression_ratio: gradients projected on the GPU to 1/ratio before offload, and
            the CPU update of the projection (LSP-Offload).
        grad_compression_flop_per_param: GPU FLOPs per gradient element of that projection.
        gpu_collectives: parameter gathers and gradient reductions GPU to GPU; False: every rank
            swaps its own replica over its host link (the virtual-memory-swap baseline).
        nvme_activations: how an NVMe-homed layer's activations move (None: staged via pinned
            host memory; TBA: GPUDirect Storage).
        storage: how optimizer state moves to and from storage (None: the node's NVMe array;
            MLP-Offload: striped over NVMe and the PFS, each path's concurrency capped).
        io_concurrency: the cap on concurrent transfers per storage path with ``storage`` (None: none).
        deepspeed_step: the after-backward CPU step runs DeepSpeed's host passes around Adam
            (unscale before, the 16-bit cast after, as the strategy's ``lp_copy`` says); False for
            systems with their own optimizer loop.
        deepspeed_grads: on DeepSpeed's ZeRO-3 offload path (:func:`fp.deepspeed_zero3_offload`),
            gradients leave as DeepSpeed's ``partition_grads`` moves them (stage3.py, v0.6.0+;
            deepspeed_runtime.md §3, §7): a PCIe round trip of the 16-bit accumulator every
            micro-batch, the fp32 copy and the NVMe write at the boundary only, the gradient
            swapper's pool blocking the host; False: offsim's generic host-side accumulation.
    """

    layerwise_update: bool = False
    grad_compression_ratio: float = 1.0
    grad_compression_flop_per_param: float = 0.0
    gpu_collectives: bool = True
    nvme_activations: NvmeActivations | None = None
    storage: StorageBuilder | None = None
    io_concurrency: int | None = None
    deepspeed_step: bool = True
    deepspeed_grads: bool = False


@dataclass(frozen=True)
class Ctx:
    """What a system derives once from the run configuration, and the variants it composes."""

    cfg: RunConfig
    sz: fp.StateSizes
    paths: Paths
    layers: tuple[Layer, ...]
    recompute: tuple[bool, ...]
    act_tier: tuple[Tier, ...]
    offloads: tuple[bool, ...]
    host_share: tuple[float, ...]
    v: Variants

    @property
    def st(self):
        return self.cfg.strategy

    @property
    def bpp_param(self) -> float:
        return self.sz.param_bytes / self.sz.params_total

    @property
    def bpp_grad(self) -> float:
        return self.sz.grad_bytes / self.sz.params_total

    @property
    def layerwise(self) -> bool:
        return self.v.layerwise_update

    @property
    def host(self) -> Tier:
        return Tier.HOST_PINNED if self.st.pin_memory else Tier.HOST_PAGEABLE

    def collective(self, nbytes_full: float, factor: float) -> Flow | None:
        """A ring collective over the data-parallel ranks (None without a GPU-to-GPU path)."""
        if not self.v.gpu_collectives or self.sz.dp <= 1:
            return None
        dp = self.sz.dp
        return self.paths.ring(whole(factor * (dp - 1) / dp * nbytes_full), factor * (dp - 1))


def _nvme_write_rate(cfg: RunConfig, sz: fp.StateSizes) -> float:
    """The array's sustained write rate at this run's per-iteration write volume."""
    nv = cfg.hardware.nvme
    if nv is None:
        return 1.0
    pl = cfg.strategy.placement
    total = 0.0
    if pl.optimizer_states == "nvme":
        total += sz.local_params * sz.optimizer_bytes_per_param
    if pl.grads == "nvme":
        total += sz.params_total / sz.grad_part * sz.host_grad_bytes_per_param
    if pl.params == "nvme":
        total += sz.param_bytes / sz.param_part
    return nv.sustained_write_bytes_per_s(total * sz.ranks_per_node)


def _host_shares(cfg: RunConfig, sz: fp.StateSizes, layerwise: bool) -> tuple[float, ...]:
    """Per layer, the share of its optimizer state the CPU updates (Twin-Flow: 1 - f for all;
    layer-wise: whole layers from the first on the GPU, f of the parameters in all)."""
    f = cfg.strategy.optimizer_gpu_fraction
    if not layerwise or f == 0.0:
        return tuple([1.0 - f] * len(sz.layers))
    gpu_left, shares = f * sz.params_total, []
    for lay in sz.layers:
        on_gpu = min(max(gpu_left, 0.0), lay.params)
        gpu_left -= lay.params
        share = 1.0 - on_gpu / lay.params
        shares.append(0.0 if share < 1e-9 else share)
    return tuple(shares)


def build_ctx(cfg: RunConfig, sz: fp.StateSizes | None = None, v: Variants = Variants()) -> Ctx:
    """Sizes (``sz``, or the configuration's), paths and the activation policy's per-layer
    decisions, for a system composing the variants ``v``."""
    sz = fp.state_sizes(cfg) if sz is None else sz
    layers = tuple(sz.layers)
    paths = Paths(cfg, resource_capacities(cfg, sz.ranks_per_node, sz.dp), _nvme_write_rate(cfg, sz))
    st = cfg.strategy
    if custom_activations(cfg):
        ds = {d.layer: d for d in activation_decisions(cfg, sz)}
        recompute = tuple(ds[lay.index].recompute for lay in layers)
        tiers = tuple(ds[lay.index].tier for lay in layers)
        offloads = tuple(t != "gpu" for t in tiers)
    else:
        recompute = tuple(cfg.activation_checkpointing and lay.is_block for lay in layers)
        tiers = tuple(st.placement.activations for _ in layers)
        offloads = tuple(st.placement.activations != "gpu" and len(layers) - 1 - lay.index > st.prefetch_depth
                         for lay in layers)
    act_tier = tuple(home_tier(t, st.pin_memory) for t in tiers)
    return Ctx(cfg, sz, paths, layers, recompute, act_tier, offloads, _host_shares(cfg, sz, v.layerwise_update), v)


# ---------------------------------------------------------------- per mechanism
def compute(c: Ctx) -> Compute:
    tp = c.cfg.workload.training.tensor_parallel
    hidden = 2.0 * c.cfg.workload.training.tokens_per_micro_batch * c.cfg.workload.model.hidden
    allreduce = c.paths.ring(whole(2 * 2.0 * (tp - 1) / tp * hidden), 2 * 2.0 * (tp - 1)) if tp > 1 else None
    return Compute(tuple(LayerCost(lay.fwd_s, lay.bwd_s, lay.fwd_flop, rc, allreduce if lay.is_block else None)
                         for lay, rc in zip(c.layers, c.recompute, strict=True)))


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
    return within_budget(c, ParamFetch(tuple(out), None), fixed_param_budget_bytes(c.cfg))


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


def _layer_update(c: Ctx, lay: Layer) -> LayerUpdate:
    """Layer-wise CPU update of ``lay`` (the engine's ``_update_layer``)."""
    sz, pl = c.sz, c.st.placement
    params = lay.params / sz.opt_part / c.v.grad_compression_ratio * c.host_share[lay.index]
    state = params * sz.optimizer_bytes_per_param
    nvme = pl.optimizer_states == "nvme"
    home = None
    nbytes = whole(params * c.bpp_param)
    if pl.params == "gpu":
        home = c.paths.dma(True, nbytes, c.st.pin_memory)
    elif pl.params == "nvme":
        home = c.paths.nvme(False, nbytes)
    dram_bpp = optimizer_dram_bpp(c)
    return LayerUpdate(c.paths.cpu_optimizer(whole(params * dram_bpp), dram_bpp),
                       storage(c, True, state) if nvme else None,
                       storage(c, False, state) if nvme else None, whole(state), home,
                       "param_update_h2d" if pl.params == "gpu" else None)


def optimizer_dram_bpp(c: Ctx) -> float:
    """DRAM bytes per parameter of one CPU Adam: read and write master + moments, read the
    gradient, write the 16-bit parameter."""
    return 2 * c.sz.optimizer_bytes_per_param + c.sz.host_grad_bytes_per_param + c.bpp_param


def gpu_adam_bpp(c: Ctx) -> float:
    return 2 * c.sz.optimizer_bytes_per_param + c.sz.host_grad_bytes_per_param + c.bpp_param


def _layer_grads(c: Ctx, lay: Layer, host_slots: int | None, swap_pool_units: int = 0) -> LayerGrads:
    st, sz = c.st, c.sz
    factor = 1.0 if st.zero_stage >= 2 else 2.0
    full = lay.params * c.bpp_grad
    reduce = c.collective(full, factor)
    if st.placement.grads == "gpu":
        return LayerGrads(reduce, offloaded=False)
    ratio, share = c.v.grad_compression_ratio, c.host_share[lay.index]
    part = full / sz.grad_part / ratio * share
    local = lay.params / sz.grad_part / ratio * share
    hg = sz.host_grad_bytes_per_param
    gpu = c.cfg.hardware.gpu
    flop = lay.params * c.v.grad_compression_flop_per_param
    compress = flop / (gpu.peak_flops(c.cfg.workload.precision.compute) * gpu.gemm_fraction(flop)) \
        if ratio > 1.0 and flop > 0 else 0.0
    on_gpu = 1.0 - share
    gpu_adam = 0.0
    if c.layerwise and on_gpu > 0:
        gpu_adam = lay.params / sz.opt_part * on_gpu * gpu_adam_bpp(c) / gpu.hbm_bytes_per_s
    nvme = st.placement.grads == "nvme"
    ds = _deepspeed_grads(c, local, hg, swap_pool_units) if _on_deepspeed_grads(c) and part > 0 else {}
    return LayerGrads(
        reduce, True, compress, whole(min(full, fp.grad_buffer_bytes(c.cfg, sz))),
        c.paths.dma(False, whole(part), st.pin_memory) if part > 0 else None,
        whole(local * hg) if host_slots is not None and share > 0 else 0, c.host,
        c.paths.host_copy(whole(local * (c.bpp_grad + hg))), c.paths.host_copy(whole(local * (c.bpp_grad + 2 * hg))),
        c.paths.host_copy(whole(local * (c.bpp_grad + hg))) if nvme else None,
        c.paths.nvme(True, whole(local * hg)) if nvme else None,
        c.paths.nvme(False, whole(local * hg)) if nvme else None,
        _layer_update(c, lay) if c.layerwise and local > 0 else None, gpu_adam, **ds)


#: the unit of the gradient swapper's pool, bytes
SWAP_UNIT_BYTES = 2**20


def _swap_buffers_pinned(c: Ctx) -> bool:
    """Whether copies between the GPU and DeepSpeed's NVMe swap buffers run pinned: they are
    CUDA-pinned tensors up to v0.19.3 and mlock'd memory CUDA does not know since v0.19.4
    (PR #8212, ``new_cpu_locked_tensor``; deepspeed_runtime.md §7), copied at the pageable rate.
    Other systems' staging buffers are pinned."""
    return not _on_deepspeed_grads(c) or c.st.nvme_swap_buffers == "torch_pinned"


def _on_deepspeed_grads(c: Ctx) -> bool:
    return c.v.deepspeed_grads and fp.deepspeed_zero3_offload(c.cfg) and not c.layerwise


def _swap_pool_bytes(c: Ctx) -> float:
    """The gradient swapper's pool: the optimizer swapper's ``buffer_count`` buffers of the
    largest sub-group in fp32, all of which it takes at first use (swap_tensor/utils.py
    ``SwapBufferManager``, async_swapper.py ``allocate_all``; deepspeed_runtime.md §7)."""
    groups = fp.deepspeed_sub_groups(fp.param_partitions(c.cfg, c.sz), c.st.sub_group_params)
    return c.st.optimizer_buffer_count * max(groups) * DTYPE_BYTES[c.cfg.workload.precision.master_params]


def _deepspeed_grads(c: Ctx, local: float, hg: float, swap_pool_units: int) -> dict[str, Any]:
    """A layer's :class:`LayerGrads` fields on DeepSpeed's ZeRO-3 path (``local``: its gradient
    elements on this rank; ``hg``: host bytes per element; ``swap_pool_units``: the gradient
    swapper's pool when gradients are on NVMe, else 0). The round trip is pinned iff
    ``pin_memory`` (``grad_partitions_flat_buffer``); the boundary fp32 copy into the swapper's
    buffers is blocking (swap_tensor/utils.py ``SwapBuffer.insert_tensor``: a synchronous
    ``copy_``; deepspeed_runtime.md §7), pinned or pageable as :func:`_swap_buffers_pinned`
    says; else the copy into the fp32 gradient as the release's ``z3_fp32_grad_copy`` does it
    (:class:`Z3Fp32GradCopy`). MLP-Offload's 16-bit host gradients (``delayed_grad_conversion``)
    have no boundary copy."""
    st = c.st
    fields: dict[str, Any] = {"roundtrip_h2d": c.paths.dma(True, whole(local * c.bpp_grad), st.pin_memory)}
    if st.delayed_grad_conversion:
        return fields
    if st.placement.grads == "nvme":  # the gradient swapper: GPU cast, blocking copy into its buffers
        fields.update(boundary_d2h=c.paths.dma(False, whole(local * hg), _swap_buffers_pinned(c)),
                      boundary_blocking=True)
        if swap_pool_units > 0:
            fields["swap_units"] = min(swap_pool_units, max(1, math.ceil(local * hg / SWAP_UNIT_BYTES)))
        return fields
    mode = Z3Fp32GradCopy(st.z3_fp32_grad_copy)
    if mode is Z3Fp32GradCopy.CPU_UPCAST_BLOCKING:  # 16-bit D2H into a pageable temporary, CPU upcast
        fields.update(boundary_d2h=c.paths.dma(False, whole(local * c.bpp_grad), False),
                      boundary_cast=c.paths.host_copy(whole(local * (c.bpp_grad + hg))), boundary_blocking=True)
    elif mode is Z3Fp32GradCopy.BOUNCE_SYNC:  # fp32 D2H into a pinned bounce buffer, sync, CPU copy
        fields.update(boundary_d2h=c.paths.dma(False, whole(local * hg), True),
                      boundary_cast=c.paths.host_copy(whole(local * 2 * hg)), boundary_blocking=True)
    else:
        blocking = mode is Z3Fp32GradCopy.GPU_UPCAST_BLOCKING or not st.pin_memory
        fields.update(boundary_d2h=c.paths.dma(False, whole(local * hg), st.pin_memory), boundary_blocking=blocking)
    return fields


def grads(c: Ctx) -> Grads:
    slots = fp.layerwise_grad_buffers(c.cfg)
    swapped = _on_deepspeed_grads(c) and c.st.placement.grads == "nvme" and not c.st.delayed_grad_conversion
    pool = max(1, int(_swap_pool_bytes(c) // SWAP_UNIT_BYTES)) if swapped else 0
    layers = tuple(_layer_grads(c, lay, slots, pool) for lay in c.layers)
    # the epilogue syncs the reduction stream; with gradients on NVMe their writes go on (the
    # swapper's last flush is in step()), and its blocking copies already hold the host
    drain = _on_deepspeed_grads(c) and c.st.placement.grads != "nvme"
    return Grads(layers, c.st.overlap_grad_offload, slots, c.v.io_concurrency, pool, drain)


def storage(c: Ctx, read: bool, nbytes: float) -> StorageIO:
    """Optimizer-state I/O: the node's NVMe array, or the system's own (``Variants.storage``)."""
    if c.v.storage is not None:
        return c.v.storage(c, read, nbytes)
    return ((c.paths.nvme(read, whole(nbytes)), None),)


def subgroups(c: Ctx) -> list[float]:
    """Host-resident optimizer sub-groups (parameters each)."""
    local = c.sz.local_params * (1.0 - c.st.optimizer_gpu_fraction)
    n = max(1, math.ceil(local / c.st.sub_group_params))
    return [local / n] * n


def _orders(c: Ctx, n_groups: int) -> tuple[tuple[int, ...], ...]:
    """The order policy's traversal per iteration (checked to be a permutation)."""
    policy = c.st.policies.optimizer_order.build(build_context(c.cfg, len(c.layers), c.bpp_param))
    orders = tuple(tuple(policy.order(it, n_groups)) for it in range(c.cfg.iterations))
    for it, order in enumerate(orders):
        if sorted(order) != list(range(n_groups)):
            from offsim.core.errors import PolicyError
            raise PolicyError(f"optimizer order policy '{policy.name}' at iteration {it}: {list(order)} is not "
                              f"a permutation of the {n_groups} sub-groups")
    return orders


def _group_io(c: Ctx, params: float, cached: bool) -> GroupIO:
    sz, pl, st = c.sz, c.st.placement, c.st
    state = params * sz.optimizer_bytes_per_param if pl.optimizer_states == "nvme" else 0.0
    grads_b = params * sz.host_grad_bytes_per_param if pl.grads == "nvme" else 0.0
    dram_bpp = optimizer_dram_bpp(c)
    nbytes = whole(params * c.bpp_param)
    lp_copy = LpCopy(st.lp_copy)
    home = gather = None
    if pl.params == "gpu":
        master = DTYPE_BYTES[c.cfg.workload.precision.master_params]
        upload = whole(params * fused_upload_bytes_per_param(lp_copy, c.bpp_param, master))
        home = c.paths.dma(True, upload, st.pin_memory)
        if sz.dp > 1 and st.zero_stage in (1, 2):
            gather = c.collective(nbytes * sz.dp, 1.0)
    elif pl.params == "nvme":
        home = c.paths.nvme(False, nbytes)
    first = whole(fp.first_step_state_bytes(c.cfg, params))
    adam = c.paths.cpu_optimizer(whole(params * dram_bpp), dram_bpp)
    passes = c.paths.cpu_step_passes(params, lp_copy) if c.v.deepspeed_step else ()
    if cached:
        grads_in = storage(c, True, grads_b) if grads_b > 0 else None
        return GroupIO(adam, grads_in=grads_in, grads_buffer_bytes=whole(fp.round_pinned(grads_b, st.host_allocator)),
                       first_step_bytes=first, params_home=home, gather=gather, before_adam=passes[:1],
                       after_adam=passes[1:])
    staged = state + grads_b
    buffer = 0 if fp.deepspeed_zero3_offload(c.cfg) else whole(fp.round_pinned(staged, st.host_allocator))
    return GroupIO(adam, storage(c, True, staged) if staged > 0 else None,
                   storage(c, False, state) if state > 0 else None, None, buffer, 0, first, home, gather,
                   passes[:1], passes[1:])


def _dram_cache(c: Ctx, groups: list[float]) -> CacheSpec | None:
    st = c.st
    on_nvme = st.placement.optimizer_states == "nvme" and st.optimizer_device == "cpu" and not c.layerwise
    capacity = dram_cache_bytes(c.cfg, c.sz)
    if not on_nvme or capacity <= 0:
        return None
    state = {g: whole(p * c.sz.optimizer_bytes_per_param) for g, p in enumerate(groups)}
    fetch, evict = dram_cache_programs(state, c.host, {g: storage(c, True, b) for g, b in state.items()},
                                       {g: storage(c, False, b) for g, b in state.items()})
    return CacheSpec(CacheId.DRAM_OPTIMIZER, c.host, whole(capacity) if math.isfinite(capacity) else None,
                     state, fetch, evict, persistent=True, writes_back=True)


def optimizer(c: Ctx, split: GpuSplit | None = None) -> CpuOptimizer | GpuOptimizer:
    """The optimizer step: on the GPU, layer-wise inside backward, or on the CPU per sub-group
    (``split``: sub-groups that may be streamed through the GPU instead, decided at run time)."""
    sz, st = c.sz, c.st
    n = len(c.layers)
    if c.layerwise:
        return GpuOptimizer(0.0, None, n)
    if st.optimizer_device == "gpu":
        bpp = 2 * sz.optimizer_bytes_per_param + c.bpp_grad + c.bpp_param
        gather = c.collective(sz.param_bytes, 1.0) if st.zero_stage in (1, 2) else None
        return GpuOptimizer(sz.local_params * bpp / c.cfg.hardware.gpu.hbm_bytes_per_s, gather, n,
                            _zero3_step_transient(c))
    groups = subgroups(c)
    cache = _dram_cache(c, groups)
    on_storage = st.placement.optimizer_states == "nvme"
    bypass = None
    if on_storage and cache is None:
        bypass = storage_cache_spec({g: whole(p * sz.optimizer_bytes_per_param) for g, p in enumerate(groups)}, c.host)
    resident = sz.local_params * st.optimizer_gpu_fraction
    gather = c.collective(resident * c.bpp_param * sz.dp, 1.0) if resident > 0 and st.zero_stage in (1, 2) else None
    return CpuOptimizer(tuple(_group_io(c, p, cache is not None) for p in groups), _orders(c, len(groups)),
                        st.optimizer_swap_pipeline, n, cache, whole(fp.overflow_check_bytes(c.cfg, sz)),
                        resident * gpu_adam_bpp(c) / c.cfg.hardware.gpu.hbm_bytes_per_s, gather,
                        st.delayed_param_update, on_storage, bypass, c.v.io_concurrency, split)


def _zero3_step_transient(c: Ctx) -> int:
    """DeepSpeed ZeRO-3 without offload (stage3.py ``_prepare_fp32_grad_for_sub_group``): per
    sub-group, ``flatten(averaged_gradients).to(fp32)``, the 16-bit flat copy (b_grad) and the fp32
    gradient (4 B) alive together, a sub-group being ``sub_group_size`` elements of the rank's
    partition at most (a group closes once it reaches that size; the overshoot by one tensor is
    not counted here). 0 off ZeRO-3."""
    sz, st = c.sz, c.st
    if st.zero_stage != 3:
        return 0
    group = min(float(st.sub_group_params), sz.local_params)
    return whole(group * (c.bpp_grad + DTYPE_BYTES[c.cfg.workload.precision.optimizer_grads]))


def static_state(c: Ctx) -> StaticState:
    """The engine's ``_allocate_static`` as data."""
    cfg, sz, st = c.cfg, c.sz, c.st
    pl, pinned = st.placement, st.pin_memory
    items = [StaticItem(Tier.GPU, whole(cfg.hardware.gpu.reserved_bytes), "reserved (CUDA context, allocator)",
                        TensorKind.RESERVED),
             StaticItem(home_tier(pl.params, pinned), whole(fp.home_param_bytes(cfg, sz)), "params (16-bit)",
                        TensorKind.PARAM16)]
    share = 1.0 - st.optimizer_gpu_fraction
    if pl.grads == "gpu":
        items.append(StaticItem(Tier.GPU, whole(sz.grad_bytes / sz.grad_part), "grads (16-bit)", TensorKind.GRAD_OPT))
    elif fp.layerwise_grad_buffers(cfg) is None:
        g = sz.params_total / sz.grad_part * sz.host_grad_bytes_per_param * share
        items.append(StaticItem(home_tier(pl.grads, pinned), whole(_pinned_groups(c, g, pl.grads)),
                                "grads (optimizer format)", TensorKind.GRAD_OPT))
    o = sz.local_params * sz.optimizer_bytes_per_param * share
    f = st.optimizer_gpu_fraction
    items.append(StaticItem(Tier.GPU, whole(f * sz.local_params * sz.optimizer_bytes_per_param),
                            "optimizer state of the GPU-updated share", TensorKind.OPT_STATE))
    items.append(StaticItem(Tier.GPU, whole(f * sz.params_total / sz.grad_part * sz.host_grad_bytes_per_param),
                            "grads (optimizer format) of the GPU-updated share", TensorKind.GRAD_OPT))
    on_pfs = fp.pfs_share(cfg)
    items.append(StaticItem(home_tier(pl.optimizer_states, pinned),
                            whole(_pinned_groups(c, o * (1.0 - on_pfs), pl.optimizer_states)), "optimizer state",
                            TensorKind.OPT_STATE))
    items.append(StaticItem(Tier.PFS, whole(o * on_pfs), "optimizer state striped to the PFS", TensorKind.OPT_STATE))
    if fp.deepspeed_zero3_offload(cfg):
        items += [StaticItem(Tier(s.tier), whole(s.nbytes), s.what) for s in fp.deepspeed_host_init(cfg, sz)]
    elif st.needs_staging_buffers():
        nbytes = st.pinned_buffer_count * fp.round_pinned(st.pinned_buffer_bytes, st.host_allocator)
        items.append(StaticItem(Tier.HOST_PINNED, whole(nbytes), "pinned staging buffers"))
    return StaticState(tuple(i for i in items if i.nbytes != 0), whole(st.pinned_buffer_count * st.pinned_buffer_bytes))


def _pinned_groups(c: Ctx, nbytes: float, home: str) -> float:
    st = c.st
    if home != "cpu" or not st.pin_memory or st.host_allocator != "caching":
        return nbytes
    n = len(subgroups(c))
    return n * fp.round_pinned(nbytes / n, "caching")


def _step_period(orders: tuple[tuple[int, ...], ...]) -> int:
    """The smallest p such that every step from the second on repeats every p iterations."""
    later = orders[1:]
    for p in range(1, max(1, len(later)) + 1):
        if all(later[k] == later[k % p] for k in range(len(later))):
            return p
    return max(1, len(later))


FORWARD_ORDER = (("params", Stage.ISSUE), ("params", Stage.WAIT), ("activations", Stage.BEFORE),
                 ("compute", Stage.RUN), ("activations", Stage.AFTER), ("params", Stage.DONE))
BACKWARD_ORDER = (("params", Stage.ISSUE), ("activations", Stage.ISSUE), ("activations", Stage.WAIT),
                  ("params", Stage.WAIT), ("activations", Stage.BEFORE), ("compute", Stage.RUN),
                  ("activations", Stage.AFTER), ("grads", Stage.AFTER), ("params", Stage.DONE))


def standard(c: Ctx, split: GpuSplit | None = None, notes: tuple[str, ...] = ()) -> System:
    """The mechanisms ``c``'s knobs call for, in the standard order (``split``: the optimizer's
    run-time GPU split; ``notes``: what the system wants said about its schedule)."""
    opt = optimizer(c, split)
    fetch = param_fetch(c)
    mechs: dict[str, object] = {"static": static_state(c), "compute": compute(c), "activations": activations(c),
                                "grads": grads(c), "optimizer": opt,
                                "params": _Nothing() if fetch is None else fetch}
    if fetch is not None and c.st.policies.gpu_param_buffer_gib == "auto":
        others = [m for name, m in mechs.items() if name != "params"]
        mechs["params"] = within_budget(c, fetch, auto_param_budget_bytes(c, others))
    period = _step_period(opt.orders) if isinstance(opt, CpuOptimizer) else 1
    sites = {SiteKind.INIT: (("static", Stage.RUN),), SiteKind.FORWARD: FORWARD_ORDER,
             SiteKind.BACKWARD: BACKWARD_ORDER, SiteKind.ITERATION_END: (("params", Stage.DONE),),
             SiteKind.STEP: (("optimizer", Stage.RUN),)}
    return System(mechs, sites, len(c.layers), c.cfg.workload.training.grad_accumulation,  # type: ignore[arg-type]
                  c.cfg.iterations, period, notes, tuple(lay.name for lay in c.layers))


def standard_system(cfg: RunConfig, sz: fp.StateSizes | None = None, v: Variants = Variants()) -> System:
    """The standard composition with the variants ``v`` (``sz``: sizes other than the
    configuration's, for hand-built layers in tests)."""
    return standard(build_ctx(cfg, sz, v))


@dataclass(frozen=True)
class _Nothing:
    """A mechanism slot the strategy does not use (parameters resident on the GPU)."""

    def setup(self):
        from offsim.mechanisms.base import Setup
        return Setup()

    def emit(self, b, site, stage) -> None:
        return None

    def footprint(self) -> tuple:
        return ()
