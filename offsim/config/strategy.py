"""Offload strategies: where each kind of training state lives and how it moves.

The fields mirror DeepSpeed's ZeRO configuration (``zero_optimization.stage``,
``offload_param``, ``offload_optimizer``, ``stage3_prefetch_bucket_size``,
``stage3_max_reuse_distance``, ``sub_group_size``, aio ``buffer_count``/``buffer_size``) so that
the shipped presets can follow DeepSpeed's behaviour field by field; see
``strategies/*.yaml`` for the citations.
"""

from __future__ import annotations

import functools
import importlib.resources
from typing import Literal

from pydantic import Field, field_validator, model_validator

from offsim.config.base import Frozen, Provenance
from offsim.policies import ActivationConfig, EvictionConfig, OrderConfig, PrefetchConfig
from offsim.policies.lookahead import LookaheadConfig
from offsim.policies.lru import LruConfig
from offsim.policies.placement import PlacementConfig
from offsim.policies.reuse_distance import ReuseDistanceConfig
from offsim.policies.same_order import SameOrderConfig
from offsim.units import GiB, MiB

Tier = Literal["gpu", "cpu", "nvme"]


class Placement(Frozen):
    """Home tier of each kind of state.

    Attributes:
        params: the 16-bit working parameters. ``cpu``/``nvme`` means they are fetched to the
            GPU before each layer runs and released after (ZeRO-3 offload_param).
        grads: where gradients are reduced and kept until the optimizer step.
        optimizer_states: fp32 master params and optimizer moments.
        activations: where activation checkpoints (or, without checkpointing, a block's saved
            activations) wait between forward and backward.
    """

    params: Tier = "gpu"
    grads: Tier = "gpu"
    optimizer_states: Tier = "gpu"
    activations: Tier = "gpu"


class Policies(Frozen):
    """Cache, prefetch, activation and optimizer-order policies (``offsim.policies``).

    The defaults reproduce offsim's built-in behaviour: DeepSpeed's release-after-use with
    ``reuse_distance_params``, lookahead prefetch by ``prefetch_depth``, activations as
    ``placement.activations`` and the checkpointing setting say, sub-groups in the same order
    every iteration, and no DRAM cache.

    Attributes:
        eviction: the GPU parameter buffer's policy (streamed parameters only).
        dram_eviction: the policy of the DRAM cache over NVMe-resident optimizer state.
        prefetch: how far ahead parameters are fetched.
        activations: per layer: keep in HBM, recompute, offload to DRAM or to NVMe.
        optimizer_order: the order the CPU optimizer visits its sub-groups.
        gpu_param_buffer_gib: budget for gathered parameters on the GPU; ``auto`` is the GPU
            memory the rest of the plan leaves free; none: unbounded (the policy alone decides
            what stays).
        dram_cache_gib: host DRAM that keeps NVMe-resident optimizer sub-groups between
            iterations (written back to NVMe when evicted); 0: none, every sub-group is read
            and written each step.
    """

    eviction: EvictionConfig = ReuseDistanceConfig()
    dram_eviction: EvictionConfig = LruConfig()
    prefetch: PrefetchConfig = LookaheadConfig()
    activations: ActivationConfig = PlacementConfig()
    optimizer_order: OrderConfig = SameOrderConfig()
    gpu_param_buffer_gib: float | Literal["auto"] | None = None
    dram_cache_gib: float = Field(default=0.0, ge=0)

    @model_validator(mode="after")
    def _check(self) -> Policies:
        b = self.gpu_param_buffer_gib
        if isinstance(b, float | int) and b <= 0:
            raise ValueError("policies.gpu_param_buffer_gib must be > 0, 'auto', or left out")
        return self

    @property
    def dram_cache_bytes(self) -> float:
        """DRAM cache capacity, bytes."""
        return self.dram_cache_gib * GiB


class Strategy(Frozen):
    """What lives where, and how it moves.

    Attributes:
        zero_stage: ZeRO stage: 0 (plain data parallel), 1 (optimizer state partitioned),
            2 (+ gradients), 3 (+ parameters).
        optimizer_device: where the optimizer step runs.
        pin_memory: host-resident state is page-locked (fast DMA, counts as pinned memory).
        prefetch_depth: layers whose parameters are fetched ahead of the one computing
            (0: fetch on demand, every transfer exposed).
        reuse_distance_params: a layer's parameters stay on the GPU when they are used again
            within this many parameters (DeepSpeed ``stage3_max_reuse_distance``); this keeps
            the last forward layers for the start of backward.
        pinned_buffer_count / pinned_buffer_mib: pinned staging buffers for NVMe traffic
            (DeepSpeed aio ``buffer_count``, ``buffer_size``).
        sub_group_params: parameters per optimizer sub-group (DeepSpeed ``sub_group_size``).
        reduce_bucket_params: gradient elements gathered on the GPU before one reduction and
            copy to the host (DeepSpeed ``reduce_bucket_size``); bounds the gradient buffers.
        optimizer_swap_pipeline: overlap reading the next sub-group and writing the previous
            one with the update of the current (DeepSpeed ``pipeline_read``/``pipeline_write``).
        overlap_grad_offload: gradients leave the GPU while backward continues; off means
            each layer's gradient copy blocks the GPU stream.
        delayed_param_update: the CPU step of iteration i overlaps forward and backward of
            iteration i+1 (ZeRO-Offload DPU).
        optimizer_schedule: ``after-backward`` runs the optimizer step once backward is done;
            ``layerwise`` updates each layer on the CPU as soon as its last gradient reaches
            the host, overlapping the rest of backward (Fuyou, LSP-Offload, SuperOffload).
        grad_compression_ratio: gradients are projected on the GPU to 1/ratio of their size
            before the copy, and the CPU updates the projected parameters (LSP-Offload).
        grad_compression_flop_per_param: GPU FLOPs per gradient element for that projection.
        activation_checkpointing: overrides the workload's setting when given.
        host_allocator: ``caching`` rounds each pinned allocation up to a power of two (PyTorch
            CachingHostAllocator); ``exact`` pins exactly what is asked (MemAscend's
            alignment-free pinned allocation).
        max_in_cpu_params / optimizer_buffer_count / param_swap_pool / pin_by_copy /
            overflow_check: DeepSpeed ZeRO-3 host buffers and MemAscend's fixes (see each field).
        policies: cache, prefetch, activation and optimizer-order policies (:class:`Policies`).
        optimizer_gpu_fraction: share f of the rank's optimizer state and fp32 gradients that
            lives on the GPU and is updated there (HBM-bound GPU Adam) while the CPU updates the
            rest; gradients go D2H and updated 16-bit parameters H2D for 1 - f only (Twin-Flow /
            ZeRO-Offload++; DeepSpeed ``offload_optimizer.ratio`` is 1 - f). With
            ``optimizer_schedule: layerwise`` the GPU share is whole layers from the first
            (embedding) on, f of the parameters in all (the layer that crosses f is split), as
            ProTrain's persistent chunks (arXiv 2406.08334): their fp32 gradients stay on the GPU,
            a GPU Adam on the compute stream updates them when their last gradient is ready, and
            their 16-bit parameters are GPU-resident (their fetches move no bytes; pair with an
            eviction policy that keeps them, e.g. ``static`` ``keep_first``); the CPU updates the
            other layers during backward.
        system: the system that composes the mechanisms (:func:`known_systems`; a shipped
            strategy names its own, a user's file defaults to ``custom``).
        optimizer_split: ``fixed`` (only ``optimizer_gpu_fraction``) or ``perf-model``: each
            iteration a performance model picks host-resident sub-groups to stream to the GPU
            (state and gradient H2D, GPU Adam, state D2H) concurrently with the CPU updating the
            others, from the rates observed in the previous iteration and the GPU memory free
            after backward (Deep Optimizer States, arXiv 2410.21316).
    """

    schema_version: Literal[1] = 1
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9._-]*$")
    system: str = Field(
        default="custom",
        description="the system whose composition of mechanisms runs this strategy (offsim/systems/<system>.py, "
                    "'-' for '_'); custom: the knobs of this file composed in the standard order",
    )
    description: str = ""
    provenance: Provenance
    zero_stage: Literal[0, 1, 2, 3] = 0
    placement: Placement = Placement()
    optimizer_device: Literal["gpu", "cpu"] = "gpu"
    pin_memory: bool = True
    prefetch_depth: int = Field(default=1, ge=0, le=64)
    reuse_distance_params: float = Field(default=0.0, ge=0)
    pinned_buffer_count: int = Field(default=4, ge=1)
    pinned_buffer_mib: float = Field(default=256.0, gt=0)
    sub_group_params: float = Field(default=1e9, gt=0)
    reduce_bucket_params: float = Field(default=5e8, gt=0)
    optimizer_swap_pipeline: bool = True
    overlap_grad_offload: bool = True
    delayed_param_update: bool = False
    optimizer_schedule: Literal["after-backward", "layerwise"] = "after-backward"
    layerwise_grad_buffers: int | None = Field(
        default=None, ge=1,
        description="with optimizer_schedule layerwise and one micro-batch per step: host "
                    "gradients are held only for layers awaiting their CPU update, in this many "
                    "layer-sized buffers (backward waits for a free one), instead of a whole-model "
                    "fp32 gradient buffer (Fuyou's synchronous out-of-core optimizer consumes "
                    "gradients as they arrive); none: the whole-model buffer",
    )
    grad_compression_ratio: float = Field(default=1.0, ge=1.0)
    grad_compression_flop_per_param: float = Field(default=0.0, ge=0)
    activation_checkpointing: bool | None = None
    host_allocator: Literal["caching", "exact"] = "caching"
    zero3_tiles_per_linear: int = Field(
        default=1, ge=1,
        description="ZeRO-3 memory-centric tiling (deepspeed.zero.TiledLinear, runtime/zero/tiling.py; "
                    "ZeRO-Infinity arXiv 2104.07857 Sec. 5.1.3): each transformer-block Linear is built by the "
                    "model code as this many tiles (in_splits x out_splits), each its own submodule that "
                    "ZeRO-3 gathers and releases alone; 1: no tiling, DeepSpeed's default (opt-in, model code)",
    )
    checkpoint_split_block: bool = Field(
        default=False,
        description="activation checkpointing per half block (model code): the attention and the MLP of "
                    "each block are checkpointed separately, two 16-bit inputs kept per block and the "
                    "backward recomputing one half at a time (Megatron-LM-v1.1.5-ZeRO3 --split-transformers, "
                    "megatron/model/transformer.py ParallelTransformerLayerPart1/Part2, DeepSpeedExamples "
                    "bdf8e59a); false: one checkpoint per block, Megatron's and Hugging Face's default",
    )
    zero3_prefetch_bucket_params: float = Field(
        default=5e7, ge=0,
        description="ZeRO-3 stage3_prefetch_bucket_size (elements): what the prefetcher gathers ahead of the current "
                    "submodule (runtime/zero/config.py default 5e7; the docs' 5e8 is not the code's); sizes the "
                    "gathered-parameter window (offsim/plan/zero3_fetch.py), prefetch_depth sets the time",
    )
    zero3_max_live_params: float = Field(
        default=1e9, ge=0,
        description="ZeRO-3 stage3_max_live_parameters (elements, default 1e9, runtime/zero/config.py): the prefetch "
                    "budget is min(this - gathered, prefetch bucket); the current submodule is gathered whole "
                    "regardless (partitioned_param_coordinator.py fetch_sub_module)",
    )
    zero3_submodule_host_s: float = Field(
        default=0.0, ge=0,
        description="host seconds DeepSpeed ZeRO-3 spends per submodule per pass before the GPU can run it: the "
                    "pre/post hooks (parameter_offload.py pre_sub_module_forward_function, "
                    "post_sub_module_forward_function; partitioned_param_coordinator.py fetch_sub_module, "
                    "release_sub_module, even with one rank) and the submodule's kernel launches "
                    "(offsim/mechanisms/host_dispatch.py). 0: not counted, the default, as no public measurement "
                    "of it was found; set it from a profile of your own run",
    )
    # DeepSpeed ZeRO-3 offload host buffers (v0.16.9 source) and MemAscend's fixes (Liaw and
    # Chen, arXiv 2505.23254): used when the strategy runs DeepSpeed's ZeRO-3 offload path
    # (offsim.plan.footprint.deepspeed_zero3_offload); the defaults are DeepSpeed's behaviour.
    max_in_cpu_params: float = Field(
        default=1e9, ge=0,
        description="parameters (elements) DeepSpeed keeps in one pinned 16-bit CPU buffer when parameters "
                    "are offloaded to NVMe (offload_param.max_in_cpu, default 1e9, offload_config.py); "
                    "stage3.py _create_param_groups_fp16_flat_cpu_memory pins min(partition, this) elements, "
                    "and a sub-group that does not fit whole stays on NVMe",
    )
    optimizer_buffer_count: int = Field(
        default=4, ge=1,
        description="pinned fp32 swap buffers for NVMe optimizer state, each the size of the largest "
                    "sub-group (offload_optimizer.buffer_count, default 4; swap_tensor/utils.py "
                    "SwapBufferManager allocates them as separate tensors)",
    )
    param_swap_pool: Literal["fixed", "adaptive"] = Field(
        default="fixed",
        description="fixed: DeepSpeed's parameter swap pool, one pinned tensor of buffer_count x "
                    "buffer_size 16-bit elements (partitioned_param_swapper.py _configure_aio), buffer_size "
                    "raised to the largest parameter partition as a working configuration must (DeepSpeed "
                    "issue #3506); adaptive: MemAscend's adaptive buffer pool, sized to the parameter "
                    "tensors in flight (the largest sum of buffer_count consecutive partitions in fetch "
                    "order)",
    )
    pin_by_copy: bool = Field(
        default=True,
        description="true: pinned tensors are made as DeepSpeed makes them, tensor.pin_memory() on a "
                    "torch.zeros tensor (accelerator/cuda_accelerator.py pin_memory), so the written "
                    "pageable source and its pinned copy coexist until the source is freed; false: pinned "
                    "zeros are allocated directly (MemAscend's lower peak system memory; "
                    "zeros_cuda_host_alloc_pinned in github.com/DandinPower/zero-overhead-pinned-memory)",
    )
    overflow_check: Literal["separate", "fused"] = Field(
        default="separate",
        description="separate: DeepSpeed's fp16 overflow check, torch.isinf then torch.isnan over the whole "
                    "16-bit host gradient buffer (stage3.py has_overflow; isinf is abs() == inf, "
                    "aten TensorCompare.cpp), pageable temporaries of (2 + 1) B per element at each step; "
                    "skipped for bf16 (stage3.py _overflow_check_and_loss_scale_update); fused: MemAscend's "
                    "fused overflow check, no temporaries",
    )
    system_options: dict[str, bool | int | float | str] = Field(
        default_factory=dict,
        description="options of the mechanisms the system's own file adds (its module's `Options` model, "
                    "checked when the system is composed): a new system declares its knobs there, so "
                    "adding it touches no shared schema",
    )
    lp_copy: Literal["separate_cast", "fused_zero_copy"] = Field(
        default="separate_cast",
        description="how DeepSpeed's CPU step brings the updated fp32 master to the GPU's 16-bit copy "
                    "(deepspeed_runtime.md 14.1, 14.10 z12_fused_adam_copy): separate_cast, every release "
                    "since v0.9.0 (PR #3097; #5409 removed the fused kernel) and every bf16 or ZeRO-3 run: a CPU "
                    "cast pass (4 B read + 2 B written per parameter) after Adam, then the 16-bit upload; "
                    "fused_zero_copy, v0.3.0-v0.8.3 with fp16 at ZeRO stage 1 or 2: no CPU cast, the GPU "
                    "reads the fp32 master over PCIe (4 B per parameter)",
    )
    z3_fp32_grad_copy: Literal["cpu_upcast_blocking", "bounce_sync", "gpu_upcast_blocking",
                               "gpu_upcast_async"] = Field(
        default="gpu_upcast_async",
        description="DeepSpeed version switch (deepspeed_runtime.md 14.9-14.10): how ZeRO-3 offload's "
                    "boundary micro-batch copies a gradient partition into the CPU fp32 gradient "
                    "(stage3.py partition_grads). cpu_upcast_blocking, v0.6.0-v0.15.3: blocking 16-bit "
                    "D2H, upcast on the CPU; bounce_sync, v0.15.4-v0.16.2 (#6670): GPU cast, pinned bounce "
                    "buffer, a device synchronize per parameter, CPU copy; gpu_upcast_blocking, "
                    "v0.16.3-v0.19.4 (#6962): GPU cast, blocking fp32 D2H; gpu_upcast_async, v0.19.5+ "
                    "(#8207, the current release): non_blocking into pinned memory. Sub-groups on NVMe use "
                    "the gradient swapper in every version (offsim.plan.deepspeed_versions)",
    )
    z3_grad_flush: Literal["next_flush", "same_flush"] = Field(
        default="same_flush",
        description="DeepSpeed version switch (stage3.py; offsim.plan.deepspeed_versions.Z3GradFlush): "
                    "ZeRO-3's IPG bucket buffers and when a reduced bucket is partitioned. next_flush, "
                    "v0.3.12-v0.5.10: one 16-bit buffer (two with overlap_comm) per backward, a bucket "
                    "partitioned at the next flush (partition_previous_reduced_grads); same_flush, v0.6.0+ "
                    "(#1453, the current release): one buffer kept from start-up, reduced and partitioned "
                    "in the same flush",
    )
    z3_host_grads: Literal["legacy", "flat_gpu_check", "flat_host_check"] = Field(
        default="flat_host_check",
        description="DeepSpeed version switch (stage3.py; offsim.plan.deepspeed_versions.Z3HostGrads): "
                    "ZeRO-3 offload's 16-bit host gradient buffer and its fp16 overflow check. legacy, "
                    "v0.3.12-v0.5.10: grads_in_partition only with gradient accumulation, no round trip "
                    "at one micro-batch per step, overflow summed on the GPU; flat_gpu_check, v0.6.0-v0.9.3 "
                    "(#1453): grad_partitions_flat_buffer from start-up, overflow per GPU partition; "
                    "flat_host_check, v0.9.4+ (#3622, the current release): overflow scanned over the host buffer",
    )
    reduce_scatter: bool = Field(
        default=True,
        description="DeepSpeed zero_optimization.reduce_scatter (default true). False at ZeRO-3 with "
                    "contiguous_gradients: a bucket that fits reduce_bucket_size is all-reduced in place in "
                    "the IPG buffer (stage3.py __avg_scatter_contiguous_grads: twice a reduce-scatter's "
                    "traffic, no bucket-sized concatenation); true: reduce_scatter_coalesced "
                    "(comm/coalesced_collectives.py), which concatenates a bucket of several tensors",
    )
    z12_lp_upload: Literal["cpu_cast_pageable", "fp32_pinned_gpu_cast", "staged_lp"] = Field(
        default="staged_lp",
        description="DeepSpeed version switch (deepspeed_runtime.md 14.9-14.10): how ZeRO-1/2 CPU offload "
                    "uploads each updated partition when the step and copy are not fused "
                    "(stage_1_and_2.py step). cpu_cast_pageable, v0.9.0-v0.14.0: CPU cast into a pageable "
                    "temporary, blocking 16-bit H2D; fp32_pinned_gpu_cast, v0.14.1-v0.16.9 (#5301): "
                    "blocking fp32 H2D from the pinned master (4 B per parameter), cast on the GPU, no CPU "
                    "cast pass; staged_lp, v0.17.0+ (#7309, the current release): CPU cast into a staging "
                    "buffer, non_blocking H2D (offsim.plan.deepspeed_versions)",
    )
    cpu_adam_threads_per_rank: int | None = Field(
        default=None, ge=1,
        description="OpenMP threads of each rank's CPU Adam (OMP_NUM_THREADS; DeepSpeed's launcher sets "
                    "it to cores / local ranks only with --bind_cores_to_rank, v0.9.0+, PR #2881, "
                    "deepspeed_runtime.md 14.7). None: the rank's share of the node's cores (an OpenMP team "
                    "on all cores per rank time-shares them to the same share); fewer threads lower the "
                    "compute and per-thread streaming bounds (offsim.plan.cpu_adam.rank_adam_params_per_s). "
                    "A measured node rate (cpu.optimizer_rate_origin measured) already carries its threads",
    )
    nvme_swap_buffers: Literal["torch_pinned", "locked"] = Field(
        default="locked",
        description="DeepSpeed version switch (deepspeed_runtime.md 7-8): the NVMe swappers' host buffers "
                    "(optimizer pool, parameter buffers, partitioned swap space). torch_pinned, v0.3.15-v0.19.3: "
                    "get_accelerator().pin_memory(torch.zeros(...)) (swap_tensor/utils.py SwapBufferManager, "
                    "partitioned_param_swapper.py), CUDA pinned, rounded up to a power of two by PyTorch's "
                    "caching host allocator, made by copy; locked, v0.19.4+ (PR #8212, the current release): "
                    "aio handle new_cpu_locked_tensor, posix_memalign + mlock of the exact size, not registered "
                    "with CUDA, so copies between them and the GPU run at the pageable rate",
    )
    gpu_adam: Literal["fused", "torch"] = Field(
        default="fused",
        description="the Adam that updates optimizer state held on the GPU: fused, DeepSpeed's FusedAdam "
                    "(the ds_config's optimizer section; csrc/adam multi_tensor_adam.cu updates in place, no "
                    "temporaries); torch, a client torch.optim.Adam/AdamW (e.g. the Hugging Face Trainer's "
                    "adamw_torch when the ds_config has no optimizer section): torch/optim/adamw.py "
                    "_multi_tensor_adamw makes exp_avg_sq_sqrt = torch._foreach_sqrt(exp_avg_sqs), one fp32 "
                    "temporary the size of the tensors it updates (ZeRO-3: one sub-group's flat fp32 partition); "
                    "the single-tensor path's denom is the same size (offsim.plan.footprint.gpu_step_transient_bytes)",
    )
    gpudirect_storage: bool = Field(
        default=False,
        description="activations bound for NVMe move GPU <-> SSD directly (NVIDIA GPUDirect Storage, "
                    "cuFile/kvikio, as TBA/SSDTrain does): no pinned staging buffer, no host DRAM traffic; "
                    "the transfer holds the GPU's PCIe direction and the array at once")
    policies: Policies = Policies()
    # MLP-Offload (Maurya et al., SC 2025, arXiv 2509.02480): multi-path optimizer-state I/O
    pfs_share: float = Field(
        default=0.0, ge=0.0, le=1.0,
        description="fraction of each optimizer-state transfer striped to the hardware's PFS tier "
                    "(the rest goes to NVMe, both paths at once); 0, or a profile without pfs: NVMe only",
    )
    io_concurrency: int | None = Field(
        default=None, ge=1,
        description="optimizer-state transfers one rank keeps in flight per storage path "
                    "(MLP-Offload's concurrency control); none: unlimited",
    )
    delayed_grad_conversion: bool = Field(
        default=False,
        description="offloaded gradients stay 16-bit and are converted to fp32 inside the update "
                    "(MLP-Offload), instead of being stored in the optimizer's fp32 format",
    )

    # Harmony's baseline (Li et al., VLDB 2022, arXiv 2202.01306): per-GPU swapping, no partitioning
    replicated_param_swap: bool = Field(
        default=False,
        description="parameters placed off the GPU are swapped in by every data-parallel rank as a full "
                    "replica over its own host link (virtualised GPU memory, one copy per GPU), allowed "
                    "with zero_stage < 3, and nothing moves GPU-to-GPU: every rank swaps out its full "
                    "gradient, summed in host memory by its accumulate copy; false: parameter offload "
                    "needs zero_stage 3 (partitioned)",
    )

    @model_validator(mode="after")
    def _check_storage_paths(self) -> Strategy:
        if self.pfs_share > 0 and self.placement.optimizer_states != "nvme":
            raise ValueError("pfs_share > 0 needs placement.optimizer_states on nvme (the PFS is striped with it)")
        return self

    # Twin-Flow / ZeRO-Offload++ (DeepSpeed blog) and Deep Optimizer States (arXiv 2410.21316)
    optimizer_gpu_fraction: float = Field(
        default=0.0, ge=0.0, lt=1.0,
        description="fraction of this rank's optimizer state (and its fp32 gradients) kept on the GPU "
                    "and updated there concurrently with the CPU step (Twin-Flow; DeepSpeed "
                    "offload_optimizer.ratio = 1 - this); 0: all on the host",
    )
    optimizer_split: Literal["fixed", "perf-model"] = Field(
        default="fixed",
        description="perf-model: each step a performance model (offsim.plan.optimizer_split) picks "
                    "host-resident sub-groups that are streamed to the GPU, updated there and streamed "
                    "back, concurrently with CPU updates of the others (Deep Optimizer States); fixed: "
                    "only optimizer_gpu_fraction decides",
    )

    @field_validator("system")
    @classmethod
    def _known_system(cls, name: str) -> str:
        if name not in known_systems():
            raise ValueError(f"system '{name}' is not known; known systems: {', '.join(known_systems())}")
        return name

    @model_validator(mode="after")
    def _check_optimizer_split(self) -> Strategy:
        if self.optimizer_gpu_fraction == 0.0 and self.optimizer_split == "fixed":
            return self
        p = self.placement
        what = "optimizer_gpu_fraction > 0 or optimizer_split 'perf-model'"
        if self.optimizer_device != "cpu" or p.optimizer_states != "cpu" or p.grads != "cpu":
            raise ValueError(f"{what} needs optimizer_device 'cpu' with placement.optimizer_states and "
                             "placement.grads on cpu")
        if self.delayed_param_update:
            raise ValueError(f"{what} cannot be combined with delayed_param_update")
        if self.optimizer_schedule != "after-backward" and self.optimizer_split != "fixed":
            raise ValueError("optimizer_split 'perf-model' needs optimizer_schedule 'after-backward'")
        if self.grad_compression_ratio > 1.0 or self.delayed_grad_conversion:
            raise ValueError(f"{what} cannot be combined with grad_compression_ratio > 1 or delayed_grad_conversion")
        return self

    @model_validator(mode="after")
    def _check(self) -> Strategy:
        p = self.placement
        if self.optimizer_device == "gpu" and (p.optimizer_states != "gpu" or p.grads != "gpu"):
            raise ValueError(
                "optimizer_device 'gpu' needs placement.optimizer_states and placement.grads "
                "on 'gpu' (offsim does not stream optimizer state to a GPU optimizer yet)"
            )
        if self.optimizer_device == "cpu":
            if p.optimizer_states == "gpu":
                raise ValueError("optimizer_device 'cpu' needs placement.optimizer_states on cpu or nvme")
            if p.grads == "gpu":
                raise ValueError("optimizer_device 'cpu' needs placement.grads on cpu or nvme")
        if p.params != "gpu" and self.zero_stage != 3 and not self.replicated_param_swap:
            raise ValueError(
                f"placement.params '{p.params}' (parameter offload) needs zero_stage 3, as in DeepSpeed "
                "(or replicated_param_swap for per-GPU swapping of full replicas)"
            )
        if self.layerwise_grad_buffers is not None and self.optimizer_schedule != "layerwise":
            raise ValueError("layerwise_grad_buffers needs optimizer_schedule 'layerwise'")
        if self.optimizer_schedule == "layerwise" and (self.optimizer_device != "cpu" or self.delayed_param_update):
            raise ValueError("optimizer_schedule 'layerwise' needs optimizer_device 'cpu' and no delayed_param_update")
        if self.grad_compression_ratio > 1.0 and self.optimizer_schedule != "layerwise":
            raise ValueError("grad_compression_ratio > 1 needs optimizer_schedule 'layerwise' (LSP-Offload's schedule)")
        if self.delayed_param_update and self.optimizer_device != "cpu":
            raise ValueError("delayed_param_update needs optimizer_device 'cpu'")
        if self.lp_copy == "fused_zero_copy" and (self.zero_stage not in (1, 2) or self.optimizer_device != "cpu"):
            raise ValueError("lp_copy 'fused_zero_copy' (DeepSpeed v0.3.0-v0.8.3) needs zero_stage 1 or 2 with "
                             "optimizer_device 'cpu' (stage_1_and_2.py; ZeRO-3 always cast separately)")
        return self

    @property
    def pinned_buffer_bytes(self) -> float:
        """Bytes of one pinned staging buffer."""
        return self.pinned_buffer_mib * MiB

    def needs_staging_buffers(self) -> bool:
        """True when NVMe traffic passes through pinned host staging buffers: any model state on
        NVMe, or activations on NVMe without GPUDirect Storage."""
        p = self.placement
        if "nvme" in (p.params, p.grads, p.optimizer_states):
            return True
        return self.uses_nvme() and not self.gpudirect_storage

    def uses_nvme(self) -> bool:
        """True when any state is placed on NVMe."""
        p = self.placement
        act = self.policies.activations
        act_nvme = getattr(act, "kind", "") == "offload-nvme" or getattr(act, "tier", "") == "nvme"
        return act_nvme or "nvme" in (p.params, p.grads, p.optimizer_states, p.activations)


#: Strategy fields that switch on a mechanism variant one published system introduced. A system
#: accepts those its module lists in ``OPTIONS`` (``custom`` all of them); a strategy that sets one
#: away from its default under another system is refused (:func:`offsim.systems._registry.check_options`).
SYSTEM_OPTIONS: tuple[str, ...] = (
    "optimizer_schedule", "layerwise_grad_buffers", "grad_compression_ratio", "grad_compression_flop_per_param",
    "gpudirect_storage", "pfs_share", "io_concurrency", "delayed_grad_conversion", "replicated_param_swap",
    "optimizer_split", "optimizer_gpu_fraction", "delayed_param_update", "param_swap_pool", "overflow_check",
    "lp_copy",
)


def option_is_set(st: Strategy, field: str) -> bool:
    """Whether ``st`` sets the system option ``field`` away from its default."""
    return bool(getattr(st, field) != Strategy.model_fields[field].get_default(call_default_factory=True))


@functools.cache
def known_systems() -> tuple[str, ...]:
    """The systems a strategy may name: the modules of :mod:`offsim.systems` whose names do not
    start with ``_`` (listed as files, without importing them), ``_`` written ``-``."""
    folder = importlib.resources.files("offsim") / "systems"
    return tuple(sorted(f.name[:-3].replace("_", "-") for f in folder.iterdir()
                        if f.name.endswith(".py") and not f.name.startswith("_")))
