"""DeepSpeed behaviour that changed between releases, as strategy inputs that default to the
current release (deepspeed_runtime.md §14, read in the git history of deepspeedai/DeepSpeed at the
release tags named; §14.10 lists the switches). A case states the version its source ran and sets
the switch that version implies."""

from __future__ import annotations

from enum import StrEnum


class Z3Fp32GradCopy(StrEnum):
    """How ZeRO-3 offload's boundary micro-batch copies a gradient partition into the CPU fp32
    gradient (stage3.py ``partition_grads`` / ``_offload_grad_partition_at_boundary``;
    deepspeed_runtime.md §14.9, §14.10 ``z3_fp32_grad_copy``). Sub-groups on NVMe go through the
    gradient swapper in every version (a GPU cast, then a blocking copy into its buffers, §7)."""

    #: v0.6.0-v0.15.3: ``fp32_grad.copy_(grad_buffer)`` from the GPU's 16-bit buffer: a blocking
    #: 16-bit D2H into a pageable temporary, then the upcast on the CPU (PyTorch Copy.cu: a
    #: CPU<->GPU copy with a dtype change converts on the CPU)
    CPU_UPCAST_BLOCKING = "cpu_upcast_blocking"
    #: v0.15.4-v0.16.2 (PR #6670): GPU cast, D2H into a pinned bounce buffer, a device
    #: synchronize per parameter, then a CPU copy into the fp32 gradient
    BOUNCE_SYNC = "bounce_sync"
    #: v0.16.3-v0.19.4 (PR #6962): GPU cast and a blocking fp32 D2H (pinned iff pin_memory)
    GPU_UPCAST_BLOCKING = "gpu_upcast_blocking"
    #: v0.19.5+ (PR #8207): GPU cast and a non_blocking fp32 D2H into the pinned fp32 gradient
    #: (blocking only when pin_memory is false: a D2H into pageable memory blocks the host)
    GPU_UPCAST_ASYNC = "gpu_upcast_async"


#: the current release's behaviour (v0.19.5, the newest tag at the commit read, edaa722126)
DEFAULT_Z3_FP32_GRAD_COPY = Z3Fp32GradCopy.GPU_UPCAST_ASYNC


class Z3GradFlush(StrEnum):
    """When DeepSpeed ZeRO-3 partitions a reduced bucket's gradients and which IPG bucket buffers
    it keeps on the GPU (stage3.py, read at the tags named; deepspeed_runtime.md §3). Both reduce a
    bucket when the next gradient would overflow ``reduce_bucket_size``, and a gradient larger than
    the bucket is reduced from its own tensor, not copied into the buffer."""

    #: v0.3.12-v0.5.10 (stage3.py first in v0.3.12, PR #834): ``backward`` allocates ``ipg_buffer``
    #: (``reduce_bucket_size`` elements of ``torch.half``; a second one with ``overlap_comm``) and
    #: ``independent_gradient_partition_epilogue`` -> ``_release_ipg_buffers`` frees it;
    #: ``reduce_ipg_grads`` synchronizes the reduction stream (with ``overlap_comm``), partitions the
    #: previous bucket (``partition_previous_reduced_grads``) and only then reduces this one, so
    #: a reduced bucket's full gradients live until the next flush
    NEXT_FLUSH = "next_flush"
    #: v0.6.0+ (PR #1453): one ``__ipg_bucket_flat_buffer`` (now ``IPGBucketZ3.buffer``, one per
    #: communication dtype) of ``reduce_bucket_size`` elements in the model dtype, made at start-up
    #: and kept; ``__reduce_and_partition_ipg_grads`` reduces and partitions a bucket in the same
    #: call, with up to 3 buckets in flight (``max_param_reduce_events`` 2)
    SAME_FLUSH = "same_flush"


#: the current release's behaviour (v0.19.5, read at edaa722126: stage3.py _setup_for_real_optimizer, "IPG")
DEFAULT_Z3_GRAD_FLUSH = Z3GradFlush.SAME_FLUSH


class Z3HostGrads(StrEnum):
    """DeepSpeed ZeRO-3 offload's 16-bit host gradient buffer and where its fp16 overflow check
    runs (stage3.py, read at the tags named; deepspeed_runtime.md §3, §8)."""

    #: v0.3.12-v0.5.10: ``partition_previous_reduced_grads`` allocates ``grads_in_partition``
    #: (``torch.half``, every partition of the rank, ``torch.zeros`` then ``pin_memory()`` iff
    #: ``offload_param.pin_memory``) with ``offload_optimizer`` only when
    #: ``gradient_accumulation_steps > 1``, for ``async_accumulate_grad_in_cpu_via_gpu``; with one
    #: micro-batch per step a reduced partition goes straight to the fp32 gradient (or the
    #: gradient swapper): no per-micro-batch round trip. Overflow: ``update_overflow_tracker_for_param_grad``
    #: sums each GPU partition (``gpu_sum``) and ``has_overflow`` reads that one GPU float
    LEGACY = "legacy"
    #: v0.6.0-v0.9.3 (PR #1453): ``grad_partitions_flat_buffer`` (every partition, model dtype,
    #: on the CPU with ``offload_optimizer``, pinned iff its ``pin_memory``) made at start-up, the
    #: round trip every micro-batch; overflow: ``partition_grads`` ORs ``torch.isinf(grad_buffer)``
    #: / ``torch.isnan`` of each reduced GPU partition into ``__inf_or_nan_tracker`` (GPU masks of
    #: one partition, no host temporaries)
    FLAT_GPU_CHECK = "flat_gpu_check"
    #: v0.9.4+ (PR #3622, "zero3 performance optimizations"): the same buffer; ``has_overflow``
    #: runs ``torch.isinf`` / ``torch.isnan`` over the whole host ``grad_partitions_flat_buffer``
    #: at the step (host temporaries: :func:`offsim.plan.footprint.overflow_check_bytes`)
    FLAT_HOST_CHECK = "flat_host_check"


#: the current release's behaviour (v0.19.5, read at edaa722126: stage3.py ``_setup_for_real_optimizer``,
#: ``has_overflow``)
DEFAULT_Z3_HOST_GRADS = Z3HostGrads.FLAT_HOST_CHECK


class Z12LpUpload(StrEnum):
    """How ZeRO-1/2 CPU offload brings each updated fp32 partition to the GPU's 16-bit copy after
    CPU Adam, when the step and copy are not fused (stage_1_and_2.py ``step``; deepspeed_runtime.md
    §14.9 "ZeRO-1/2 offload lp upload, non-fused", §14.10 ``z12_lp_upload``). Fused fp16 runs of
    v0.3.0-v0.8.3 are the strategy's ``lp_copy: fused_zero_copy`` instead."""

    #: v0.9.0-v0.14.0 (and bf16 runs before): ``copy_`` from the CPU fp32 master: a CPU cast into
    #: a pageable temporary, then a blocking 16-bit H2D from it (PyTorch Copy.cu)
    CPU_CAST_PAGEABLE = "cpu_cast_pageable"
    #: v0.14.1-v0.16.9 (PR #5301): the fp32 master pinned, a blocking ``.to(gpu)`` of 4 B per
    #: parameter, the cast on the GPU (no CPU cast pass)
    FP32_PINNED_GPU_CAST = "fp32_pinned_gpu_cast"
    #: v0.17.0+ (PR #7309): a CPU cast into a 16-bit staging buffer and a non_blocking H2D of it,
    #: pinned iff pin_memory
    STAGED_LP = "staged_lp"


#: the current release's behaviour (v0.19.5)
DEFAULT_Z12_LP_UPLOAD = Z12LpUpload.STAGED_LP


class Z12AccumMode(StrEnum):
    """Which 16-bit copies ZeRO-1/2 CPU offload makes of an owned parameter's gradient under
    gradient accumulation (stage2.py / stage_1_and_2.py ``copy_grads_in_partition`` ->
    ``async_accumulate_grad_in_cpu_via_gpu``; deepspeed_runtime.md §14.2, §14.10
    ``z12_accum_mode``). In every version micro-batch k > 0 first brings the pinned 16-bit CPU
    accumulator back up (H2D) and adds it on the GPU, and the boundary copies the slice as fp32
    (GPU ``.float()``, D2H of 4 B per element, ``async_inplace_copy_grad_to_fp32_buffer_from_gpu``);
    one micro-batch per step makes only that fp32 copy."""

    #: v0.3.0-v0.15.1: the 16-bit D2H on every micro-batch but the boundary
    V1 = "v1"
    #: v0.15.2-v0.18.9 (PR #6550): the 16-bit D2H only at micro-batch 0 (drops the middle ones'
    #: gradients when accumulating 3 or more, issue #7967)
    DROP_MIDDLE = "drop_middle"
    #: v0.19.0+ (PR #7967): the 16-bit D2H on every micro-batch, the boundary's too
    D2H_EVERY_MB = "d2h_every_mb"


#: the current release's behaviour (v0.19.5)
DEFAULT_Z12_ACCUM_MODE = Z12AccumMode.D2H_EVERY_MB
