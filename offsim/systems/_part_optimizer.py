"""Builders of the optimizer step from a strategy's shared knobs: on the GPU, or on the CPU per
sub-group with its I/O, DRAM cache and order policy.
"""

from __future__ import annotations

import math

from offsim.config.workload import DTYPE_BYTES
from offsim.core.enums import CacheId
from offsim.mechanisms.base import StorageIO
from offsim.mechanisms.cpu_optimizer import (
    CpuOptimizer,
    GpuSplit,
    GroupIO,
    dram_cache_programs,
    storage_cache_spec,
)
from offsim.mechanisms.gpu_optimizer import GpuOptimizer
from offsim.plan import footprint as fp
from offsim.plan import host_pages
from offsim.plan.cpu_adam import (
    CpuHost,
    CpuSimd,
    LpCopy,
    fused_upload_bytes_per_param,
    overflow_scan_bytes_per_param,
    rank_threads,
)
from offsim.plan.deepspeed_versions import Z3HostGrads, Z12LpUpload
from offsim.plan.policy_plan import (
    build_context,
    dram_cache_bytes,
)
from offsim.plan.step_costs import host_pass
from offsim.schedule.ops import CacheSpec, Flow
from offsim.systems._ctx import Ctx, whole


def optimizer_dram_bpp(c: Ctx) -> float:
    """DRAM bytes per parameter of one CPU Adam: read and write master + moments, read the
    gradient, write the 16-bit parameter."""
    return 2 * c.sz.optimizer_bytes_per_param + c.sz.host_grad_bytes_per_param + c.bpp_param


def adam_dram_bpp(c: Ctx) -> float:
    """DRAM bytes per parameter of the after-backward step's CPU Adam: :func:`optimizer_dram_bpp`
    less the 16-bit write when the cast is DeepSpeed's separate pass. ``ds_adam_step``
    (csrc/adam/cpu_adam_impl.cpp; no fused copy since PR #5409) touches only p, g, m, v (28 B in
    fp32: deepspeed_runtime.md section 5, "Bytes"); the cast's 6 B are their own pass
    (:func:`offsim.plan.cpu_adam.step_passes`), so 30 B would count the 16-bit write twice."""
    return optimizer_dram_bpp(c) - (c.bpp_param if separate_cast(c) else 0.0)


def separate_cast(c: Ctx) -> bool:
    """The step runs DeepSpeed's host passes with the fp32 -> 16-bit cast as its own pass."""
    return c.v.deepspeed_step and LpCopy(c.st.lp_copy) is LpCopy.SEPARATE_CAST


def blocking_home(c: Ctx) -> bool:
    """DeepSpeed's step waits for each sub-group's updated 16-bit parameters to reach their home
    before it swaps the sub-group's state out and moves on. ZeRO-3, every release since v0.3.12
    (``stage3.py::step`` -> ``_reassign_or_swap_out_partitioned_parameters``, named
    ``_reassign_or_swap_out_fp16_params`` in older releases): on the GPU a blocking
    ``fp16_partitioned_groups_flat[i].data.copy_(fp32_partitioned_groups_flat[i].data)``, on NVMe
    ``_partitioned_params_swap_out``'s synchronous write (deepspeed_runtime.md sections 7, 13).
    ZeRO-1/2 before v0.17.0 (:func:`z12_upload`): a blocking copy too."""
    if not c.v.deepspeed_step:
        return False
    mode = z12_upload(c)
    return c.st.zero_stage == 3 or mode in (Z12LpUpload.CPU_CAST_PAGEABLE, Z12LpUpload.FP32_PINNED_GPU_CAST)


def z12_upload(c: Ctx) -> Z12LpUpload | None:
    """ZeRO-1/2 offload's non-fused update upload as the strategy's DeepSpeed release runs it
    (``z12_lp_upload``, deepspeed_runtime.md 14.9: v0.9.0-v0.14.0 CPU cast + blocking pageable
    16-bit H2D; v0.14.1-v0.16.9, PR #5301, blocking fp32 H2D of the pinned master and the cast
    on the GPU; v0.17.0+, PR #7309, CPU cast into a staging buffer + non_blocking H2D); None off
    ZeRO-1/2 or with the fused step + copy (``lp_copy``)."""
    if c.st.zero_stage not in (1, 2) or LpCopy(c.st.lp_copy) is LpCopy.FUSED_ZERO_COPY:
        return None
    return Z12LpUpload(c.st.z12_lp_upload)


def upload_fresh_bytes(c: Ctx, params: float) -> int:
    """Bytes of fresh host pages the CPU cast of a sub-group's blocking 16-bit upload writes
    (:mod:`offsim.plan.host_pages`), for a sub-group of ``params`` parameters; 0 where the upload
    makes no new temporary of at least :data:`~offsim.plan.host_pages.MMAP_THRESHOLD_MAX_BYTES`.

    The blocking dtype-changing ``copy_`` from the CPU fp32 master into the GPU's 16-bit copy
    casts on the CPU into a new pageable tensor (PyTorch Copy.cu ``copy_kernel_cuda``:
    ``src.to(dst dtype)``), one per call: ZeRO-3 with the parameters on the GPU, every release
    (stage3.py ``_reassign_or_swap_out_partitioned_parameters``:
    ``fp16_partitioned_groups_flat[i].data.copy_(fp32_partitioned_groups_flat[i].data)``, one
    call per sub-group), and ZeRO-1/2's ``cpu_cast_pageable`` (v0.9.0-v0.14.0 stage_1_and_2.py
    ``step``: ``bit16_partitions[partition_id].data.copy_(fp32_partition.data)``, one call per
    parameter group over the rank's whole partition, taken here as one group: the rank's host
    partition decides whether it is fresh). Not with PR #5301's fp32 upload (cast on the GPU),
    PR #7309's preallocated staging buffer, the fused step + copy, or parameters off the GPU
    (a CPU cast into the pinned flat buffer or an NVMe write)."""
    if not (c.v.deepspeed_step and c.st.placement.params == "gpu" and blocking_home(c)):
        return 0
    if z12_upload(c) is Z12LpUpload.FP32_PINNED_GPU_CAST or LpCopy(c.st.lp_copy) is not LpCopy.SEPARATE_CAST:
        return 0
    per_call = sum(subgroups(c)) if c.st.zero_stage in (1, 2) else params
    return whole(params * c.bpp_param) if host_pages.fresh_bytes([per_call * c.bpp_param]) > 0 else 0


def cast_touch_bytes_per_s(c: Ctx) -> float:
    """First-touch rate of the upload's CPU cast, bytes/s: ATen's copy kernel runs on the rank's
    intra-op threads (the strategy's ``cpu_adam_threads_per_rank``, else its share of the cores:
    :func:`offsim.plan.cpu_adam.rank_threads`), so the profile's one-thread rate scales as
    :func:`offsim.plan.host_pages.threaded_touch_bytes_per_s` says."""
    hw = c.cfg.hardware
    host = CpuHost(hw.cpu.cores, hw.cpu.sockets, None, CpuSimd.NONE, hw.dram.bandwidth_bytes_per_s)
    threads = rank_threads(host, c.sz.ranks_per_node, c.st.cpu_adam_threads_per_rank)
    return host_pages.threaded_touch_bytes_per_s(hw.cpu.page_touch_bytes_per_s, threads)


def gpu_adam_bpp(c: Ctx) -> float:
    return 2 * c.sz.optimizer_bytes_per_param + c.sz.host_grad_bytes_per_param + c.bpp_param



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
    dram_bpp = adam_dram_bpp(c)
    nbytes = whole(params * c.bpp_param)
    lp_copy = LpCopy(st.lp_copy)
    home = gather = None
    gpu_cast = c.v.deepspeed_step and z12_upload(c) is Z12LpUpload.FP32_PINNED_GPU_CAST
    master = DTYPE_BYTES[c.cfg.workload.precision.master_params]
    if pl.params == "gpu":
        per_param = master if gpu_cast else fused_upload_bytes_per_param(lp_copy, c.bpp_param, master)
        # a copy_ from the CPU fp32 master into the GPU's 16-bit copy changes dtype, so PyTorch
        # casts on the CPU into a fresh pageable tensor and copies that (Copy.cu copy_kernel_cuda;
        # deepspeed_runtime.md 13 step 4): pageable whatever pin_memory says; #5301's fp32 upload
        # comes from the pinned master
        pinned = gpu_cast or (st.pin_memory and not blocking_home(c))
        home = c.paths.dma(True, whole(params * per_param), pinned)
        if sz.dp > 1 and st.zero_stage in (1, 2):
            gather = c.collective(nbytes * sz.dp, 1.0)
    elif pl.params == "nvme":
        home = c.paths.nvme(False, nbytes)
    first = whole(fp.first_step_state_bytes(c.cfg, params))
    adam = c.paths.cpu_optimizer(whole(params * dram_bpp), dram_bpp)
    passes = c.paths.cpu_step_passes(params, lp_copy) if c.v.deepspeed_step else ()
    if gpu_cast:  # the cast runs on the GPU after the fp32 upload: no CPU cast pass
        passes = passes[:1]
    fresh = upload_fresh_bytes(c, params)
    if fresh:  # the cast faults in its new temporary's pages as it writes them
        passes = (*passes[:1], host_pages.touch_flow(fresh, cast_touch_bytes_per_s(c)), *passes[1:])
    home_gpu = whole(params * master) if gpu_cast and pl.params == "gpu" else 0
    if cached:
        grads_in = storage(c, True, grads_b) if grads_b > 0 else None
        return GroupIO(adam, grads_in=grads_in, grads_buffer_bytes=whole(fp.round_pinned(grads_b, st.host_allocator)),
                       first_step_bytes=first, params_home=home, gather=gather, before_adam=passes[:1],
                       after_adam=passes[1:], home_blocks=blocking_home(c), home_gpu_bytes=home_gpu)
    staged = state + grads_b
    buffer = 0 if fp.deepspeed_zero3_offload(c.cfg) else whole(fp.round_pinned(staged, st.host_allocator))
    return GroupIO(adam, storage(c, True, staged) if staged > 0 else None,
                   storage(c, False, state) if state > 0 else None, None, buffer, 0, first, home, gather,
                   passes[:1], passes[1:], blocking_home(c), home_gpu)


def overflow_scan(c: Ctx) -> Flow | None:
    """DeepSpeed ZeRO-3's fp16 overflow check at the step's start: isinf and isnan scans of the
    rank's host gradient accumulator (:func:`offsim.plan.cpu_adam.overflow_scan_bytes_per_param`,
    12 B per element in fp16; ``stage3.py::has_overflow``); None for bf16 (skipped,
    ``_overflow_check_and_loss_scale_update``), off DeepSpeed ZeRO-3's offload path, or in a
    release that checks on the GPU (``strategy.z3_host_grads`` before v0.9.4, #3622)."""
    pr = c.cfg.workload.precision
    if (not fp.deepspeed_zero3_offload(c.cfg) or pr.params != "fp16"
            or Z3HostGrads(c.st.z3_host_grads) is not Z3HostGrads.FLAT_HOST_CHECK):
        return None
    bpp = overflow_scan_bytes_per_param(DTYPE_BYTES[pr.grads], c.st.overflow_check == "fused")
    return host_pass(whole(c.sz.local_params * bpp))


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


def optimizer(c: Ctx, split: GpuSplit | None = None, groups: list[float] | None = None) -> CpuOptimizer | GpuOptimizer:
    """The optimizer step: on the GPU, layer-wise inside backward, or on the CPU per sub-group
    (``split``: sub-groups that may be streamed through the GPU instead, decided at run time;
    ``groups``: the host sub-groups' parameters, default :func:`subgroups`' equal ones)."""
    sz, st = c.sz, c.st
    n = len(c.layers)
    if c.layerwise:
        return GpuOptimizer(0.0, None, n)
    if st.optimizer_device == "gpu":
        bpp = 2 * sz.optimizer_bytes_per_param + c.bpp_grad + c.bpp_param
        gather = c.collective(sz.param_bytes, 1.0) if st.zero_stage in (1, 2) else None
        return GpuOptimizer(sz.local_params * bpp / c.cfg.hardware.gpu.hbm_bytes_per_s, gather, n,
                            _zero3_step_transient(c))
    groups = subgroups(c) if groups is None else groups
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
                        st.delayed_param_update, on_storage, bypass, c.v.io_concurrency, split, overflow_scan(c))


def _zero3_step_transient(c: Ctx) -> int:
    """The GPU optimizer step's temporaries besides its state (ZeRO-3's per-sub-group cast, torch
    AdamW's square-root temporary), as :func:`fp.gpu_step_transient_bytes` sizes them."""
    return whole(fp.gpu_step_transient_bytes(c.cfg, c.sz))


def _step_period(orders: tuple[tuple[int, ...], ...]) -> int:
    """The smallest p such that every step from the second on repeats every p iterations."""
    later = orders[1:]
    for p in range(1, max(1, len(later)) + 1):
        if all(later[k] == later[k % p] for k in range(len(later))):
            return p
    return max(1, len(later))
