"""Builders of the gradient mechanism from a strategy's shared knobs: per layer, the reduction,
the offload and DeepSpeed's ZeRO-3 gradient path, and the layer-wise CPU update.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import replace
from typing import TYPE_CHECKING, Any, cast

from offsim.config.workload import DTYPE_BYTES
from offsim.mechanisms.compute import Compute
from offsim.mechanisms.grads import GradBucket, Grads, LayerGrads, LayerUpdate
from offsim.mechanisms.host_dispatch import HostDispatched
from offsim.plan import footprint as fp
from offsim.plan import host_pages
from offsim.plan.deepspeed_versions import Z3Fp32GradCopy, Z3GradFlush, Z3HostGrads
from offsim.plan.model import Layer, ReduceBucket, reduce_buckets
from offsim.systems._ctx import Ctx, whole

if TYPE_CHECKING:
    from offsim.mechanisms.base import Mechanism
    from offsim.systems._compile import System
from offsim.systems._part_optimizer import gpu_adam_bpp, optimizer_dram_bpp, storage


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
    whole_layer = ((lay.index, lay.params),)
    ds = _deepspeed_grads(c, local, hg, swap_pool_units, _fresh_temp_bytes(c, whole_layer),
                          _largest_partition(c, whole_layer)) if _on_deepspeed_grads(c) and part > 0 else {}
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


def _fresh_temp_bytes(c: Ctx, pieces: Iterable[tuple[int, float]]) -> float:
    """Bytes of the 16-bit host temporaries of the v0.6.0-v0.15.3 boundary copy (one per parameter
    partition, ``at::empty_like``) that are fresh mappings (:func:`offsim.plan.host_pages.fresh_bytes`),
    for ``pieces`` ((layer, elements of it), as a reduce bucket holds them) on this rank."""
    model, total = c.cfg.workload.model, 0.0
    for u, n in pieces:
        lay = c.layers[u]
        parts = [math.ceil(t / c.sz.grad_part) * c.bpp_grad for t in fp.layer_tensors(model, lay)]
        total += host_pages.fresh_bytes(parts) * n / lay.params * c.host_share[u]
    return total


#: DeepSpeed ZeRO-3's boundary norm of each gradient partition: ``part.data.double().norm(2)`` over
#: chunks of at most this many elements (stage3.py ``_constant_buffered_norm2``, buffer_size 250000000,
#: in the 0.13.3 DataStates forks and at edaa722126; deepspeed_runtime.md §3)
NORM_CHUNK_ELEMENTS = 250_000_000
#: its HBM bytes per element besides the 16-bit read: the fp64 copy written, then read by the norm
NORM_FP64_BYTES = 8 + 8


def _largest_partition(c: Ctx, pieces: Iterable[tuple[int, float]]) -> float:
    """Elements on this rank of the largest parameter partition among ``pieces`` ((layer, elements
    of it)); a piece smaller than its layer's largest tensor counts as that piece."""
    model = c.cfg.workload.model
    return max((min(math.ceil(t / c.sz.grad_part), math.ceil(n / c.sz.grad_part)) * c.host_share[u]
                for u, n in pieces for t in fp.layer_tensors(model, c.layers[u])), default=0.0)


def _boundary_gpu_work(c: Ctx, local: float, biggest: float, gpu_cast: bool, swapped: bool) -> dict[str, Any]:
    """The boundary's GPU work before its copy, on the reduction stream (stage3.py
    ``partition_grads``, per parameter): the GPU slice of the accumulator (``grad_buffer.to(device)``,
    b_acc per element), its fp64 norm (:data:`NORM_FP64_BYTES`), and, where the release casts on the
    GPU (``gpu_cast``: ``.float()`` / a non_blocking dtype-changing ``copy_``), the fp32 cast (b_acc
    read, 4 B written), all at HBM bandwidth; ``local``: the bucket's elements on this rank. GPU
    bytes held, at the largest partition (``biggest`` elements): its slice (b_acc) and the larger
    of its fp64 chunk (at most :data:`NORM_CHUNK_ELEMENTS`, freed after the norm) and its fp32
    cast (when ``gpu_cast``); with the gradient swapper (``swapped``) the bucket's fp32 gradients
    are kept until ``swap_out_gradients``, so the largest partition's fp64 chunk may meet the
    others' fp32 copies, and at the end all of them are held (4 B x ``local``).

    Held only when the parameters live on the GPU. Streamed parameters get an ``auto`` window
    sized as if every held need met a full window (:func:`offsim.systems._part_fetch.
    auto_param_budget_bytes`), while this workspace comes when the window has drained (a
    bucket's flush, the embedding's last); counted there it starves the window (GPT-3 175B on
    dgx2-v100 would not fit), so there the bytes are left out, an under-count, and the time kept."""
    b_acc, fp32 = c.bpp_grad, 4.0
    per_element = b_acc + NORM_FP64_BYTES + (b_acc + fp32 if gpu_cast else 0.0)
    fp64 = min(biggest, NORM_CHUNK_ELEMENTS) * 8.0
    if swapped:
        held = biggest * b_acc + max(fp64 + fp32 * (local - biggest), fp32 * local)
    else:
        held = biggest * b_acc + max(fp64, fp32 * biggest if gpu_cast else 0.0)
    return {"boundary_norm_s": local * per_element / c.cfg.hardware.gpu.hbm_bytes_per_s,
            "boundary_gpu_bytes": whole(held) if c.st.placement.params == "gpu" else 0}


def _deepspeed_grads(c: Ctx, local: float, hg: float, swap_pool_units: int, fresh: float = 0.0,
                     biggest: float = 0.0, round_trip: float | None = None) -> dict[str, Any]:
    """A layer's :class:`LayerGrads` fields on DeepSpeed's ZeRO-3 path (``local``: its gradient
    elements on this rank; ``hg``: host bytes per element; ``swap_pool_units``: the gradient
    swapper's pool when gradients are on NVMe, else 0). The round trip is pinned iff
    ``pin_memory`` (``grad_partitions_flat_buffer``); the boundary fp32 copy into the swapper's
    buffers is blocking (swap_tensor/utils.py ``SwapBuffer.insert_tensor``: a synchronous
    ``copy_``; deepspeed_runtime.md §7), pinned or pageable as :func:`_swap_buffers_pinned`
    says; else the copy into the fp32 gradient as the release's ``z3_fp32_grad_copy`` does it
    (:class:`Z3Fp32GradCopy`); ``fresh``: bytes of that copy's 16-bit host temporaries that are
    fresh pages (:func:`_fresh_temp_bytes`), which the blocking CPU-upcast copy faults in
    (:func:`offsim.plan.host_pages.with_first_touch`, at the profile's ``cpu.page_touch_gb_per_s``);
    ``biggest``: the largest partition's elements, for the boundary's norms
    (:func:`_boundary_gpu_work`), which every release and both forks compute whenever the
    optimizer is offloaded. MLP-Offload's 16-bit host gradients (``delayed_grad_conversion``)
    have no boundary copy. ``round_trip``: the elements of the per-micro-batch round trip and the
    boundary norms when they differ from ``local`` (Twin-Flow: every partition goes through
    ``grad_partitions_flat_buffer``, the GPU sub-groups' too; deepspeed_runtime.md §3 "With
    Twin-Flow the round trip also applies to params whose sub-group steps on the GPU"), while
    ``local`` is the CPU sub-groups' share that the boundary copies down."""
    st = c.st
    mode = Z3Fp32GradCopy(st.z3_fp32_grad_copy)
    nvme = st.placement.grads == "nvme" and not st.delayed_grad_conversion
    gpu_cast = nvme or (mode is not Z3Fp32GradCopy.CPU_UPCAST_BLOCKING and not st.delayed_grad_conversion)
    every = local if round_trip is None else round_trip
    fields: dict[str, Any] = _boundary_gpu_work(c, every, biggest, gpu_cast, nvme)
    if _round_trip(c):
        fields["roundtrip_h2d"] = c.paths.dma(True, whole(every * c.bpp_grad), st.pin_memory)
    if st.delayed_grad_conversion or local <= 0:  # (all of it updated on the GPU: nothing leaves)
        return fields
    if nvme:  # the gradient swapper: GPU cast, blocking copy into its buffers
        fields.update(boundary_d2h=c.paths.dma(False, whole(local * hg), _swap_buffers_pinned(c)),
                      boundary_blocking=True)
        if swap_pool_units > 0:
            fields["swap_units"] = min(swap_pool_units, max(1, math.ceil(local * hg / SWAP_UNIT_BYTES)))
        return fields
    if mode is Z3Fp32GradCopy.CPU_UPCAST_BLOCKING:  # 16-bit D2H into a new pageable temporary, CPU upcast
        d2h = host_pages.with_first_touch(c.paths.dma(False, whole(local * c.bpp_grad), False), fresh,
                                          c.cfg.hardware.cpu.page_touch_bytes_per_s)
        fields.update(boundary_d2h=d2h,
                      boundary_cast=c.paths.host_copy(whole(local * (c.bpp_grad + hg))), boundary_blocking=True)
    elif mode is Z3Fp32GradCopy.BOUNCE_SYNC:  # fp32 D2H into a pinned bounce buffer, sync, CPU copy
        fields.update(boundary_d2h=c.paths.dma(False, whole(local * hg), True),
                      boundary_cast=c.paths.host_copy(whole(local * 2 * hg)), boundary_blocking=True)
    else:
        blocking = mode is Z3Fp32GradCopy.GPU_UPCAST_BLOCKING or not st.pin_memory
        fields.update(boundary_d2h=c.paths.dma(False, whole(local * hg), st.pin_memory), boundary_blocking=blocking)
    return fields


def _round_trip(c: Ctx) -> bool:
    """Whether each micro-batch copies this rank's reduced partitions into the 16-bit host
    buffer (D2H) and back (H2D), :func:`offsim.plan.footprint.host_grad_partition_bytes`'s
    buffer: v0.6.0+ every micro-batch (stage3.py ``partition_grads``); ``legacy`` (v0.3.12-v0.5.10,
    ``partition_previous_reduced_grads``) only with gradient accumulation
    (``async_accumulate_grad_in_cpu_via_gpu``; its v1 pattern, deepspeed_runtime.md §14.2, skips
    the first micro-batch's H2D and the boundary's 16-bit D2H: offsim keeps a round trip on
    every micro-batch, one more of each per step), none with one micro-batch per step."""
    legacy = Z3HostGrads(c.st.z3_host_grads) is Z3HostGrads.LEGACY
    return not legacy or c.cfg.workload.training.grad_accumulation > 1


def _bucket_flows(c: Ctx, bucket: ReduceBucket, swap_pool_units: int) -> LayerGrads:
    """A reduce bucket's flows on DeepSpeed's ZeRO-3 path: the reduce-scatter of its 16-bit
    gradients (``reduce_scatter_coalesced``), the copy of this rank's partition down and
    :func:`_deepspeed_grads`' round trip and boundary copy, each of the bucket's elements on this
    rank (a layer's share of them as ``host_share`` says); its GPU bytes: the bucket's gradients,
    which :func:`grad_buckets` reduces to :func:`_bucket_held_bytes` (stage3.py
    ``__reduce_and_partition_ipg_grads``; deepspeed_runtime.md §3)."""
    st, sz = c.st, c.sz
    full = bucket.elements * c.bpp_grad
    local = sum(n / sz.grad_part * c.host_share[u] for u, n in bucket.pieces)
    every = sum(n / sz.grad_part for _, n in bucket.pieces)  # the round trip's: every partition
    hg = sz.host_grad_bytes_per_param
    nvme = st.placement.grads == "nvme"
    ds = _deepspeed_grads(c, local, hg, swap_pool_units, _fresh_temp_bytes(c, bucket.pieces),
                          _largest_partition(c, bucket.pieces), every) if every > 0 else {}
    factor = 2.0 if st.zero_stage < 2 or _in_place_all_reduce(c, bucket.elements) else 1.0
    return LayerGrads(c.collective(full, factor), True, buffer_bytes=whole(full),
                      d2h=c.paths.dma(False, whole(every * c.bpp_grad), st.pin_memory)
                      if every > 0 and _round_trip(c) else None,
                      nvme_write=c.paths.nvme(False, whole(local * hg)) if nvme and local > 0 else None, **ds)


def _bucket_held_bytes(c: Ctx, elements: int, waited: bool) -> int:
    """GPU bytes a reduce bucket of ``elements`` gradient elements holds besides the IPG buffer(s)
    from its flush until its reduction and copies are done (freed then, or with ``next_flush`` at
    the next flush); ``waited``: the host waits for every flush (:func:`_flushes_waited`).

    ``same_flush`` (v0.6.0+, stage3.py ``__reduce_and_partition_ipg_grads``): a gradient larger
    than the bucket is reduced from its own tensor (the whole bucket); with ``reduce_scatter``,
    ``reduce_scatter_coalesced`` (comm/coalesced_collectives.py) concatenates a bucket of several
    tensors into a bucket-sized temporary (the whole bucket); without it the bucket is all-reduced
    in place in the IPG buffer (``__avg_scatter_contiguous_grads``), and what is left are the
    gradients copied into the buffer on the reduction stream, each freed with ``record_stream``
    (``__add_grad_to_ipg_bucket``), so held until that stream has run the copy: up to the whole
    bucket behind earlier reductions, none when the host waits for every flush (the stream is idle
    when they arrive). ``next_flush`` (v0.3.15 ``reduce_independent_p_g_buckets_and_remove_grads``):
    a gradient that fits is copied into ``ipg_buffer`` on the compute stream and freed at once, so
    only one larger than the bucket (``extra_large_param_to_reduce``) is held, until
    ``partition_previous_reduced_grads`` at the next flush."""
    st = c.st
    whole_bucket = whole(elements * c.bpp_grad)
    if elements > st.reduce_bucket_params:
        return whole_bucket
    if Z3GradFlush(st.z3_grad_flush) is Z3GradFlush.NEXT_FLUSH or (not st.reduce_scatter and waited):
        return 0
    return whole_bucket


def _in_place_all_reduce(c: Ctx, elements: int) -> bool:
    """Whether a bucket is all-reduced in place in the IPG buffer (``reduce_scatter`` false and the
    bucket within ``reduce_bucket_size``: stage3.py ``__reduce_and_partition_ipg_grads`` ->
    ``__avg_scatter_contiguous_grads``, v0.6.0+), twice a reduce-scatter's traffic."""
    return (not c.st.reduce_scatter and elements <= c.st.reduce_bucket_params
            and Z3GradFlush(c.st.z3_grad_flush) is Z3GradFlush.SAME_FLUSH)


def ipg_buffer_bytes(c: Ctx) -> int:
    """GPU bytes of DeepSpeed ZeRO-3's IPG bucket buffer(s), ``reduce_bucket_size`` elements each
    (``contiguous_gradients``, DeepSpeed's default, is assumed): ``same_flush`` (v0.6.0+, stage3.py
    ``_setup_for_real_optimizer`` at edaa722126, ``__init__`` in v0.6.0): one in the model dtype
    (the communication dtype's, which defaults to it); ``next_flush`` (v0.3.12-v0.5.10, stage3.py
    ``backward``): ``torch.half``, two with ``overlap_comm``."""
    st = c.st
    if Z3GradFlush(st.z3_grad_flush) is Z3GradFlush.NEXT_FLUSH:
        return whole(st.reduce_bucket_params * DTYPE_BYTES["fp16"] * (2 if st.overlap_grad_offload else 1))
    return whole(st.reduce_bucket_params * c.bpp_grad)


def startup_ipg_buffer_bytes(c: Ctx) -> int:
    """GPU bytes of the IPG bucket buffer DeepSpeed ZeRO-3 makes at start-up and keeps
    (``same_flush``, v0.6.0+: stage3.py ``_setup_for_real_optimizer`` at edaa722126, ``__init__``
    in v0.6.0; :func:`ipg_buffer_bytes`), a static item (:mod:`offsim.systems._part_static`), so a
    forward-time peak meets it as the fit check does; 0 off DeepSpeed's ZeRO-3 gradient path or
    with ``next_flush``, whose buffers live through each backward only (:attr:`Grads.ipg_bytes`)."""
    if not _on_deepspeed_grads(c) or Z3GradFlush(c.st.z3_grad_flush) is not Z3GradFlush.SAME_FLUSH:
        return 0
    return ipg_buffer_bytes(c)


def _first_tensors(order: list[tuple[int, tuple[int, ...]]], buckets: Iterable[ReduceBucket]) -> list[int]:
    """Elements of each bucket's first gradient: the tensor, in backward ``order``, at which its
    elements begin (:func:`offsim.plan.model.reduce_buckets` fills buckets in that order)."""
    sizes = [n for _, tensors in order for n in tensors]
    out, i, start, at = [], 0, 0, 0
    for bucket in buckets:
        while at < start:  # the tensor at which this bucket begins
            at += sizes[i]
            i += 1
        out.append(sizes[i] if i < len(sizes) else 0)
        start += bucket.elements
    return out


def _backward_tensors(tensors: list[int], block: bool) -> tuple[int, ...]:
    """A layer's tensors in the order backward produces their gradients: module order reversed,
    except a block's remainder (norms and biases, listed last and the smallest): its input norm's
    gradient comes last in backward, so the remainder is put there rather than first."""
    if block and len(tensors) > 1 and tensors[-1] == min(tensors):
        return (*reversed(tensors[:-1]), tensors[-1])
    return tuple(reversed(tensors))


def _backward_order(c: Ctx) -> list[tuple[int, tuple[int, ...]]]:
    """(layer, its tensors' elements in the order backward makes their gradients) over the
    backward: layers in reverse, each layer's tensors (:func:`offsim.plan.footprint.layer_tensors`)
    as :func:`_backward_tensors` orders them."""
    model = c.cfg.workload.model
    return [(lay.index, _backward_tensors(fp.layer_tensors(model, lay), lay.is_block)) for lay in reversed(c.layers)
            if lay.params > 0]


def grad_buckets(c: Ctx, swap_pool_units: int) -> tuple[GradBucket, ...]:
    """DeepSpeed ZeRO-3's reduce buckets over the backward (:func:`_backward_order`;
    :func:`offsim.plan.model.reduce_buckets` with the strategy's ``reduce_bucket_params``) with
    their flows."""
    order = _backward_order(c)
    seen: set[int] = set()
    out: list[GradBucket] = []
    buckets = reduce_buckets(order, c.st.reduce_bucket_params)
    all_flows = [_bucket_flows(c, bucket, swap_pool_units) for bucket in buckets]
    waited = _flushes_waited(c, all_flows)
    for bucket, first, flows, ready in zip(buckets, _first_tensors(order, buckets), all_flows,
                                           _ready_points(order, buckets), strict=True):
        layers = {u for u, _ in bucket.pieces}
        flows = replace(flows, buffer_bytes=_bucket_held_bytes(c, bucket.elements, waited))
        head = min(whole(first * c.bpp_grad), flows.buffer_bytes) if out else 0
        out.append(GradBucket(bucket.pieces, bucket.flush_layer, flows, tuple(sorted(layers & seen)), head, ready))
        seen |= layers
    return tuple(out)


#: DeepSpeed ZeRO-3's reductions in flight: the host synchronizes the oldest bucket event while
#: more than ``max_param_reduce_events`` = 2 are unfinished (stage3.py
#: ``__reduce_and_partition_ipg_grads``), so the third may be issued beside two. The same constant and
#: the same bucket flush rule are in DeepSpeed v0.14.5 and in the 0.13.3 DataStates forks the
#: validation cases ran (DataStates/DeepSpeed branches dist_nvme_opt and deep-optimizer-states,
#: stage3.py), so it is not a version switch
Z3_REDUCTIONS_IN_FLIGHT = 3


def _flushes_waited(c: Ctx, flows: Iterable[LayerGrads]) -> bool:
    """Whether the host (which issues the compute) waits for every bucket's flush: without
    ``overlap_comm`` (``reduce_and_partition_stream`` is the default stream, stage3.py ``__init__``)
    or with one micro-batch per step and a blocking boundary copy (every micro-batch is the
    boundary; :attr:`LayerGrads.boundary_blocking`)."""
    every_mb_blocks = c.cfg.workload.training.grad_accumulation == 1 and all(g.boundary_blocking for g in flows)
    return not c.st.overlap_grad_offload or every_mb_blocks


def _buckets_alive(c: Ctx, buckets: tuple[GradBucket, ...]) -> int:
    """Reduce buckets whose gradients the schedule can hold at once (:attr:`Grads.buckets_alive`):
    ``next_flush``, 2 (the bucket reduced at this flush and the one partitioned at it); else
    :data:`Z3_REDUCTIONS_IN_FLIGHT`, or 1 when the host waits for every flush."""
    if Z3GradFlush(c.st.z3_grad_flush) is Z3GradFlush.NEXT_FLUSH:
        return 2
    return 1 if _flushes_waited(c, (b.flows for b in buckets)) else Z3_REDUCTIONS_IN_FLIGHT


def grads(c: Ctx) -> Grads:
    slots = fp.layerwise_grad_buffers(c.cfg)
    swapped = _on_deepspeed_grads(c) and c.st.placement.grads == "nvme" and not c.st.delayed_grad_conversion
    pool = max(1, int(_swap_pool_bytes(c) // SWAP_UNIT_BYTES)) if swapped else 0
    layers = tuple(_layer_grads(c, lay, slots, pool) for lay in c.layers)
    # the epilogue syncs the reduction stream; with gradients on NVMe their writes go on (the
    # swapper's last flush is in step()), and its blocking copies already hold the host
    drain = _on_deepspeed_grads(c) and c.st.placement.grads != "nvme"
    if not _on_deepspeed_grads(c):
        return Grads(layers, c.st.overlap_grad_offload, slots, c.v.io_concurrency, pool, drain)
    buckets = grad_buckets(c, pool)
    per_backward = ipg_buffer_bytes(c) - startup_ipg_buffer_bytes(c)  # same_flush's is a static item
    return Grads(layers, c.st.overlap_grad_offload, slots, c.v.io_concurrency, pool, drain, buckets,
                 Z3_REDUCTIONS_IN_FLIGHT, per_backward, Z3GradFlush(c.st.z3_grad_flush),
                 _buckets_alive(c, buckets))


def _ready_points(order: list[tuple[int, tuple[int, ...]]], buckets: tuple[ReduceBucket, ...]
                  ) -> list[tuple[int, float] | None]:
    """Per bucket, (layer, fraction of its backward kernels) where the gradient that would
    overflow it is ready, the next bucket's first (stage3.py
    ``reduce_independent_p_g_buckets_and_remove_grads`` flushes in that gradient's hook); None
    for the last (the epilogue). A gradient is taken to be ready after the kernels of the
    tensors before it and itself in backward ``order``, in proportion to their elements: a
    linear's data and weight gradients are 4 FLOPs per element per token, so its share of the
    layer's backward GEMM FLOPs is its share of the elements (approximations: attention scores
    and norms, which hold no or few elements, are spread over the layer pro rata; a mixture of
    experts' expert tensors count by their elements, not by the tokens routed to them)."""
    ready = []
    for u, tensors in order:
        total, acc = sum(tensors), 0
        for n in tensors:
            ready.append((u, n, (acc + n) / total))
            acc += n
    out: list[tuple[int, float] | None] = []
    offset, i, start = 0, 0, 0
    for bucket in buckets[:-1]:
        offset += bucket.elements
        while start < offset:  # the tensor the next bucket begins at
            start += ready[i][1]
            i += 1
        out.append((ready[i][0], ready[i][2]))
    return [*out, None] if buckets else out


def hook_points(buckets: tuple[GradBucket, ...]
                ) -> tuple[dict[int, tuple[float, ...]], tuple[tuple[int, int] | None, ...]]:
    """From the buckets' ``ready_at``: per layer, the cuts of its backward kernels (fractions in
    (0, 1) where a flushing gradient is ready) and, per bucket, where its flush runs: (layer, cut
    index; the layer's number of cuts: after its last kernel), or None (after ``flush_layer``)."""
    cut_sets: dict[int, set[float]] = {}
    for bk in buckets:
        if bk.ready_at is not None and bk.ready_at[1] < 1.0:
            cut_sets.setdefault(bk.ready_at[0], set()).add(bk.ready_at[1])
    cuts = {u: tuple(sorted(fs)) for u, fs in cut_sets.items()}

    def where(at: tuple[int, float] | None) -> tuple[int, int] | None:
        if at is None:
            return None
        u, f = at
        return (u, cuts[u].index(f)) if f < 1.0 else (u, len(cuts.get(u, ())))
    return cuts, tuple(where(bk.ready_at) for bk in buckets)


def with_gradient_hooks(system: System) -> System:
    """``system`` (as finally composed) with DeepSpeed ZeRO-3's reduce buckets flushed from their
    gradient hooks inside the backward (:func:`hook_points`): the compute mechanism's backward
    kernels cut where a flush runs, calling the gradient mechanism there
    (:meth:`offsim.mechanisms.grads.Grads.emit_hook`). Unchanged off DeepSpeed's ZeRO-3 path;
    applying it twice changes nothing. The same bytes move and the buckets hold the same memory;
    only when their flushes run changes."""
    return _set_gradient_hooks(system, hooked=True)


def without_gradient_hooks(system: System) -> System:
    """``system`` with its reduce buckets flushed after their layer's backward again, the compute
    mechanism's backward kernels uncut: the inverse of :func:`with_gradient_hooks`, for an order
    that sums a layer's gradients over several micro-batches before they leave
    (:func:`offsim.systems.harmony.unit_major`: a hook inside every micro-batch's backward would
    flush each time)."""
    return _set_gradient_hooks(system, hooked=False)


def _set_gradient_hooks(system: System, hooked: bool) -> System:
    """``system`` with its buckets' flush points and the compute mechanism's backward cuts set
    from :func:`hook_points` (``hooked``) or cleared; unchanged where there is nothing to set."""
    grads, compute = system.mechanisms.get("grads"), system.mechanisms.get("compute")
    if not isinstance(grads, Grads):
        return system
    if not any((bk.ready_at if hooked else bk.flush_at) is not None for bk in grads.buckets):
        return system
    inner = compute.inner if isinstance(compute, HostDispatched) else compute
    if not isinstance(inner, Compute):
        return system
    cuts, where = hook_points(grads.buckets) if hooked else ({}, (None,) * len(grads.buckets))
    grads = replace(grads, buckets=tuple(replace(bk, flush_at=w) for bk, w in zip(grads.buckets, where, strict=True)))
    layers = tuple(replace(cost, backward_cuts=cuts.get(u, ())) for u, cost in enumerate(inner.layers))
    kernels = replace(inner, layers=layers, hooks=grads if hooked else None)
    out = dict(system.mechanisms)
    out["grads"] = cast("Mechanism", grads)  # frozen: its read-only id is not the protocol's settable one
    out["compute"] = cast("Mechanism", replace(compute, inner=kernels) if isinstance(compute, HostDispatched)
                          else kernels)
    return replace(system, mechanisms=out)
