"""Bytes of each kind of training state per rank, the tiers' capacities, and DeepSpeed ZeRO-3's
host set-up, from which the mechanisms size what they hold.

Pure planning. Whether a run fits is the sum of what its mechanisms declare
(:mod:`offsim.fit_check`); :class:`Footprint` is that sum's shape.

Partitioning follows ZeRO (Rajbhandari et al., SC 2020, arXiv 1910.02054, Sec. 5): stage 1
partitions optimizer state over the ``dp`` data-parallel ranks, stage 2 also gradients, stage 3
also parameters. Host and NVMe are shared by the ranks of a node, so their per-node need is the
per-rank need times the ranks on the node.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from offsim.config.run import RunConfig
from offsim.config.workload import DTYPE_BYTES, ModelShape
from offsim.core.units import GiB
from offsim.plan.deepspeed_versions import Z3HostGrads
from offsim.plan.model import Layer, build_layers

TIERS = ("gpu", "host_pinned", "host", "nvme", "pfs")


def round_pinned(nbytes: float, allocator: str) -> float:
    """Bytes pinned for a request: PyTorch's CachingHostAllocator rounds up to a power of two.

    Source: pytorch/pytorch issue #95823 and sgl-project/sglang PR #36562 (a 20.4 GiB request
    pinned 2^35 B), via ../shared/reference/hardware_facts.md §3.2. ``exact`` pins what is asked.
    """
    if allocator != "caching" or nbytes <= 0:
        return nbytes
    return float(2 ** math.ceil(math.log2(nbytes)))


@dataclass(frozen=True)
class StateSizes:
    """Per-rank bytes and counts derived once from a RunConfig."""

    dp: int
    ranks_per_node: int
    params_total: int
    param_bytes: float  # 16-bit working params of the whole model
    grad_bytes: float  # 16-bit gradients of the whole model
    host_grad_bytes_per_param: float  # gradients as the optimizer reads them (fp32 on host)
    optimizer_bytes_per_param: float  # master params + moments
    param_part: int  # divisor of params per rank (dp under stage 3)
    grad_part: int
    opt_part: int
    layers: tuple[Layer, ...]

    @property
    def local_params(self) -> float:
        """Parameters whose optimizer state this rank owns."""
        return self.params_total / self.opt_part


def state_sizes(cfg: RunConfig) -> StateSizes:
    """Derive per-rank sizes from the config."""
    wl, st, hw = cfg.workload, cfg.strategy, cfg.hardware
    pr = wl.precision
    dp = wl.training.data_parallel
    layers = tuple(build_layers(wl, hw.gpu, st.checkpoint_split_block))
    p_total = sum(lay.params for lay in layers)  # the model's, or one tensor-parallel GPU's share
    moments = wl.optimizer.moments
    opt_bpp = DTYPE_BYTES[pr.master_params] + moments * DTYPE_BYTES[pr.optimizer_moments]
    return StateSizes(
        dp=dp,
        ranks_per_node=min(dp * wl.training.tensor_parallel, hw.topology.gpus_per_node),
        params_total=p_total,
        param_bytes=p_total * DTYPE_BYTES[pr.params],
        grad_bytes=p_total * DTYPE_BYTES[pr.grads],
        host_grad_bytes_per_param=_host_grad_bytes_per_param(cfg),
        optimizer_bytes_per_param=opt_bpp,
        param_part=dp if st.zero_stage >= 3 else 1,
        grad_part=dp if st.zero_stage >= 2 else 1,
        opt_part=dp if st.zero_stage >= 1 else 1,
        layers=layers,
    )


def _host_grad_bytes_per_param(cfg: RunConfig) -> float:
    """Bytes per gradient element once offloaded: the optimizer's format (fp32), or the 16-bit
    training format when the fp32 conversion is delayed to the update (MLP-Offload, arXiv
    2509.02480: fewer bytes kept in host memory or written to and read from storage)."""
    pr = cfg.workload.precision
    if cfg.strategy.delayed_grad_conversion:
        return DTYPE_BYTES[pr.grads]
    return DTYPE_BYTES[pr.optimizer_grads]


#: what PyTorch's pool holds beyond the live blocks, as a share of them (fixed-shape training):
#: f = 0.04, range 0.02-0.06 from three steady-training OOM messages (gpu_memory.md §2.4, §4
#: "Verdict rule"); cached whole segments are released before an OOM (CUDACachingAllocator.cpp
#: malloc's retry chain, gpu_memory.md §4), so only the holes inside live segments count
FRAGMENTATION_SHARE = 0.04
#: half-range of that share (0.02) applied to the allocated bytes, gpu_memory.md §4
FRAGMENTATION_HALF_RANGE = 0.02
#: half-range of the memory outside PyTorch's pool per process (0.8-2.1 GiB around 1.45 GiB:
#: context, NCCL, libraries; gpu_memory.md §2.4, §4): 0.65 GiB
OUTSIDE_POOL_HALF_RANGE_BYTES = 0.65 * GiB
#: the item the static state declares for memory outside PyTorch's pool (the profile's reserved_gib)
OUTSIDE_POOL_ITEM = "reserved (CUDA context, allocator)"


class GpuVerdict(StrEnum):
    """The GPU verdict of gpu_memory.md §4: FIT if the spare is at least its uncertainty, OOM if
    it is at most minus it, MARGINAL between (never rejected outright, Simulator rule 6)."""

    FIT = "fits"
    MARGINAL = "marginal"
    OOM = "out of memory"


@dataclass(frozen=True)
class GpuMargin:
    """One rank's GPU memory near the edge, gpu_memory.md §4 "Verdict rule" (bytes).

    Attributes:
        allocated_bytes: A, the peak of live blocks (the mechanisms' declared needs).
        fragmentation_bytes: F = f x A, holes in live segments (:data:`FRAGMENTATION_SHARE`).
        outside_bytes: O, memory outside PyTorch's pool (the profile's ``reserved_gib``).
        total_bytes: T, the device's memory.
    """

    allocated_bytes: float
    fragmentation_bytes: float
    outside_bytes: float
    total_bytes: float

    @property
    def spare_bytes(self) -> float:
        """X = T - (A + F + O)."""
        return self.total_bytes - (self.allocated_bytes + self.fragmentation_bytes + self.outside_bytes)

    @property
    def uncertainty_bytes(self) -> float:
        """Y = 0.02 A + 0.65 GiB: the half-ranges of f and O."""
        return FRAGMENTATION_HALF_RANGE * self.allocated_bytes + OUTSIDE_POOL_HALF_RANGE_BYTES

    @property
    def verdict(self) -> GpuVerdict:
        x, y = self.spare_bytes, self.uncertainty_bytes
        return GpuVerdict.FIT if x >= y else GpuVerdict.OOM if x <= -y else GpuVerdict.MARGINAL

    def sentence(self) -> str:
        """"fits with X ± Y GiB to spare" (or "short by"), what it counts, and the verdict."""
        x, y = self.spare_bytes / GiB, self.uncertainty_bytes / GiB
        how = f"fits with {x:.2f} ± {y:.2f} GiB to spare" if x >= 0 else f"short by {-x:.2f} ± {y:.2f} GiB"
        return (f"{how} counting {FRAGMENTATION_SHARE:.0%} allocator fragmentation and "
                f"{self.outside_bytes / GiB:.2f} GiB outside PyTorch's pool: {self.verdict.value}")


@dataclass(frozen=True)
class Footprint:
    """Estimated peak bytes per tier (gpu per rank; host and nvme per node) with a breakdown."""

    need_bytes: dict[str, float]
    capacity_bytes: dict[str, float]
    breakdown: dict[str, dict[str, float]]

    def first_overflow(self) -> str | None:
        """The first tier whose need exceeds its capacity, or the GPU when it is out of memory by
        the allocator's margin though its needs fit (:class:`GpuMargin`); None when all fit."""
        for tier in TIERS:
            if self.need_bytes[tier] > self.capacity_bytes[tier]:
                return tier
            if tier == "gpu" and gpu_margin(self).verdict is GpuVerdict.OOM:
                return tier
        return None


def gpu_margin(fp: Footprint) -> GpuMargin:
    """The GPU margin of ``fp``: A is every declared GPU need but the memory outside the pool."""
    outside = fp.breakdown.get("gpu", {}).get(OUTSIDE_POOL_ITEM, 0.0)
    allocated = fp.need_bytes["gpu"] - outside
    return GpuMargin(allocated, FRAGMENTATION_SHARE * allocated, outside, fp.capacity_bytes["gpu"])


def pfs_share(cfg: RunConfig) -> float:
    """Share of the NVMe-homed optimizer state striped onto the parallel file system
    (MLP-Offload): ``strategy.pfs_share`` when the profile has a PFS, else 0."""
    st = cfg.strategy
    if cfg.hardware.pfs is None or st.placement.optimizer_states != "nvme":
        return 0.0
    return st.pfs_share


def _home_tier(home: str, pinned: bool) -> str:
    return {"gpu": "gpu", "nvme": "nvme"}.get(home, "host_pinned" if pinned else "host")


def layerwise_grad_buffers(cfg: RunConfig) -> int | None:
    """Host gradient buffers of a layer-wise schedule that consumes gradients as they arrive
    (``strategy.layerwise_grad_buffers``, one micro-batch per step, gradients off the GPU);
    None when the whole-model fp32 gradient buffer is kept (gradient accumulation needs it)."""
    st = cfg.strategy
    if st.layerwise_grad_buffers is None or st.placement.grads == "gpu":
        return None
    if cfg.workload.training.grad_accumulation > 1:
        return None
    return st.layerwise_grad_buffers


def grad_buffer_bytes(cfg: RunConfig, sz: StateSizes) -> float:
    """GPU bytes one in-flight gradient offload holds: a layer's 16-bit gradients, at most one
    reduce bucket (DeepSpeed ``reduce_bucket_size``, default 5e8 elements)."""
    biggest = max(lay.params for lay in sz.layers) * sz.grad_bytes / sz.params_total
    return min(biggest, cfg.strategy.reduce_bucket_params * sz.grad_bytes / sz.params_total)


def params_streamed(cfg: RunConfig) -> bool:
    """True when layers' full parameters are gathered on the GPU only around their use."""
    st = cfg.strategy
    return st.placement.params != "gpu" or (st.zero_stage >= 3 and cfg.workload.training.data_parallel > 1)


# ---------------------------------------------------------------- DeepSpeed ZeRO-3 host buffers
# Host memory of DeepSpeed's ZeRO-3 offload as DeepSpeed v0.16.9 allocates it (file names below
# are under deepspeed/runtime/), and MemAscend's fixes as strategy switches (Liaw and Chen,
# arXiv 2505.23254, abstract: pinned-buffer allocation, fragmentation and peak system memory).


def deepspeed_zero3_offload(cfg: RunConfig) -> bool:
    """True when the strategy runs DeepSpeed ZeRO-3's offload path (zero/stage3.py): stage 3,
    partitioned (not replicated) parameters, the optimizer on the CPU after backward, gradients
    off the GPU (``offload_optimizer``). Its host buffers are then counted as DeepSpeed allocates
    them (:func:`deepspeed_host_init`) instead of offsim's generic staging buffers."""
    st = cfg.strategy
    return (st.zero_stage == 3 and not st.replicated_param_swap and st.optimizer_device == "cpu"
            and st.optimizer_schedule == "after-backward" and st.placement.grads != "gpu")


def _model_tensors(model: ModelShape, name: str) -> list[int]:
    """Elements of each parameter tensor of a whole layer (``embed``, ``block<i>``, ``head``) in
    Hugging Face module order: the embedding (and learned positions); per block the attention
    matrices (:meth:`~offsim.config.workload.ModelShape.attention_matrices`), the MLP matrices (of
    a mixture-of-experts block: the router, each expert's matrices, the shared experts'), then
    norms and biases as one small remainder; the final norm, the LM head."""
    h = model.hidden
    if name == "embed":
        return [model.vocab * h] + ([model.max_positions * h] if model.learned_positions else [])
    if name == "head":
        norm = h * (2 if model.bias else 1)
        return [norm] + ([model.head_params - norm] if model.head_params > norm else [])
    index = int(name.removeprefix("block"))
    mats = model.attention_matrices() + _mlp_tensors(model, index)
    rest = model.block_params_at(index) - sum(mats)
    return mats + ([rest] if rest > 0 else [])


def _mlp_tensors(model: ModelShape, index: int) -> list[int]:
    """Elements of each MLP weight matrix of block ``index``."""
    h, n = model.hidden, 3 if model.mlp == "gated" else 2
    moe = model.moe
    if moe is None or not model.sparse_block(index):
        return [h * model.ffn_hidden] * n
    router = [moe.experts * h] if moe.routed else []
    shared = [h * moe.shared_experts * moe.shared_width] * n if moe.shared_experts else []
    return router + [h * moe.expert_ffn_hidden] * (n * moe.experts) + shared


def layer_tensors(model: ModelShape, layer: Layer) -> list[int]:
    """Elements of each parameter tensor of ``layer`` (:func:`_model_tensors`), scaled to the
    layer's parameters when it holds a share of each tensor (tensor parallelism); they sum to
    ``layer.params``."""
    full = _model_tensors(model, layer.name)
    total = sum(full)
    if total == layer.params or total == 0:
        return full
    share = [n * layer.params // total for n in full]
    biggest = share.index(max(share))
    share[biggest] += layer.params - sum(share)
    return share


def param_partitions(cfg: RunConfig, sz: StateSizes) -> list[int]:
    """Elements of every parameter tensor's partition on one rank, in module order: ZeRO-3 gives
    each rank ``ceil(numel / dp)`` elements of each tensor (zero/partition_parameters.py)."""
    tensors = [n for lay in sz.layers for n in layer_tensors(cfg.workload.model, lay)]
    return [math.ceil(n / sz.param_part) for n in tensors]


def deepspeed_sub_groups(parts: Sequence[int], sub_group_params: float) -> list[int]:
    """Elements of each optimizer sub-group as DeepSpeed forms them (stage3.py
    ``_create_fp16_sub_groups``): one group when ``sub_group_size`` covers all, else partitions
    are added in order and a group closes once it holds ``sub_group_size`` or more elements, so a
    group can exceed ``sub_group_size`` by up to one tensor."""
    total = sum(parts)
    if sub_group_params >= total:
        return [total]
    groups, acc = [], 0
    for k, n in enumerate(parts):
        acc += n
        if acc >= sub_group_params or k == len(parts) - 1:
            groups.append(acc)
            acc = 0
    return groups


def param_pool_bytes(cfg: RunConfig, parts: Sequence[int], bytes_per_param: float) -> float:
    """Bytes requested for the parameter swap pool (parameters on NVMe), per rank.

    ``fixed`` (DeepSpeed, swap_tensor/partitioned_param_swapper.py ``_configure_aio``): one
    tensor of ``buffer_count`` buffers, each ``buffer_size`` elements, one buffer per parameter
    tensor in flight; ``buffer_size`` must hold the largest parameter partition (DeepSpeed issue
    #3506: a 524,709,888-element parameter failed against 1e8), so it is raised to it.
    ``adaptive`` (MemAscend's adaptive buffer pool): buffers sized to the tensors in flight, at
    most the largest sum of ``buffer_count`` consecutive partitions in fetch order."""
    st = cfg.strategy
    count = st.pinned_buffer_count
    if st.param_swap_pool == "fixed":  # buffer_size is a whole number of elements
        return count * max(round(st.pinned_buffer_bytes / bytes_per_param), max(parts)) * bytes_per_param
    window = max(sum(parts[k:k + count]) for k in range(max(1, len(parts) - count + 1)))
    return window * bytes_per_param


@dataclass(frozen=True)
class HostStep:
    """One step of DeepSpeed's host-memory set-up on one rank: ``nbytes`` > 0 allocates,
    < 0 releases what an earlier step of the same ``what`` allocated.

    Attributes:
        tier: ``host_pinned`` or ``host_pageable``.
        nbytes: bytes (already rounded by the pinned allocator).
        what: label.
    """

    tier: str
    nbytes: float
    what: str


def _pinned(steps: list[HostStep], cfg: RunConfig, what: str, nbytes: float, written: bool) -> None:
    """A pinned tensor of ``nbytes`` (rounded by ``host_allocator``). DeepSpeed pins by
    ``tensor.pin_memory()`` (accelerator/cuda_accelerator.py), a pinned copy of a pageable tensor:
    when the source was written (``torch.zeros``) both are resident until the source is freed;
    an untouched ``torch.empty`` source maps no pages and is not counted."""
    if nbytes <= 0:
        return
    st = cfg.strategy
    copy = written and st.pin_by_copy
    if copy:
        steps.append(HostStep("host_pageable", nbytes, f"{what}: pageable source of pin_memory()"))
    steps.append(HostStep("host_pinned", round_pinned(nbytes, st.host_allocator), what))
    if copy:
        steps.append(HostStep("host_pageable", -nbytes, f"{what}: pageable source of pin_memory()"))


def _scratch(steps: list[HostStep], what: str, nbytes: float) -> None:
    """A pageable tensor alive for one step of the set-up, then freed."""
    if nbytes > 0:
        steps += [HostStep("host_pageable", nbytes, what), HostStep("host_pageable", -nbytes, what)]


def _swap_buffer(steps: list[HostStep], cfg: RunConfig, what: str, nbytes: float, written: bool) -> None:
    """One NVMe swapper buffer as the release makes it (``strategy.nvme_swap_buffers``): locked
    (v0.19.4+, PR #8212: csrc/aio ``new_cpu_locked_tensor``, posix_memalign + mlock of the exact
    size, zeroed in place) or, before, a tensor pinned by PyTorch (:func:`_pinned`: rounded up to
    a power of two, made by copy)."""
    if cfg.strategy.nvme_swap_buffers == "locked":
        if nbytes > 0:
            steps.append(HostStep("host_pinned", nbytes, what))
        return
    _pinned(steps, cfg, what, nbytes, written)


def _swap_steps(cfg: RunConfig, parts: list[int], groups: list[int], steps: list[HostStep]) -> None:
    """Buffers of the NVMe swappers, in DeepSpeed's order."""
    st, pr = cfg.strategy, cfg.workload.precision
    pl, bpp, fp32 = st.placement, DTYPE_BYTES[pr.params], DTYPE_BYTES[pr.master_params]
    swapped: list[int] = []
    if pl.params == "nvme":
        pool = param_pool_bytes(cfg, parts, bpp)
        _swap_buffer(steps, cfg, "parameter swap buffers (offload_param)", pool, False)
        in_cpu = min(sum(parts), st.max_in_cpu_params)  # stage3.py _create_param_groups_fp16_flat_cpu_memory
        _pinned(steps, cfg, "parameters kept in CPU (offload_param.max_in_cpu)", in_cpu * bpp, False)
        offset = 0
        for g in groups:  # a sub-group that does not fit the CPU buffer whole stays on NVMe
            swapped += [g] if offset + g > in_cpu else []
            offset += g
        if swapped:  # stage3.py -> partitioned_param_swapper.reserve_partitioned_swap_space
            what = "partitioned parameter swap space (largest sub-group, 16-bit)"
            _swap_buffer(steps, cfg, what, max(groups) * bpp, True)
    if pl.optimizer_states == "nvme":  # swap_tensor/utils.py SwapBufferManager
        for _ in range(st.optimizer_buffer_count):
            _swap_buffer(steps, cfg, "optimizer swap buffers (offload_optimizer)", max(groups) * fp32, True)
        if swapped:  # stage3.py _create_fp32_partitions: unpinned fp32 copy of a swapped sub-group
            _scratch(steps, "fp32 master parameters being initialised", max(swapped) * fp32)


def deepspeed_host_init(cfg: RunConfig, sz: StateSizes) -> list[HostStep]:
    """DeepSpeed ZeRO-3 offload's host allocations at start-up, per rank, in order (stage3.py
    ``__init__``, ``_setup_for_real_optimizer``); empty off that path. Besides the swappers'
    buffers: the fp32 gradient buffer of the largest sub-group that ``initialize_optimizer_states``
    zeroes and drops, and ``grad_partitions_flat_buffer``, one 16-bit tensor of every gradient
    partition, made by ``torch.zeros`` and pinned when ``pin_memory`` (the last allocation; with
    16-bit host gradients, ``delayed_grad_conversion``, it is their home and counted there)."""
    if not deepspeed_zero3_offload(cfg):
        return []
    st, pr, pl = cfg.strategy, cfg.workload.precision, cfg.strategy.placement
    parts = param_partitions(cfg, sz)
    groups = deepspeed_sub_groups(parts, st.sub_group_params)
    steps: list[HostStep] = []
    _swap_steps(cfg, parts, groups, steps)
    fp32 = max(groups) * DTYPE_BYTES[pr.master_params]
    steps.append(HostStep("host_pageable", fp32, "fp32 gradient buffer of initialize_optimizer_states"))
    if pl.grads == "cpu" and st.pin_memory and st.pin_by_copy and not st.delayed_grad_conversion:
        source = max(groups) * sz.host_grad_bytes_per_param
        _scratch(steps, "pageable source of a pinned fp32 sub-group gradient", source)
    steps.append(HostStep("host_pageable", -fp32, "fp32 gradient buffer of initialize_optimizer_states"))
    flat = host_grad_partition_bytes(cfg, sz)
    if flat > 0:
        legacy = Z3HostGrads(st.z3_host_grads) is Z3HostGrads.LEGACY
        what = ("16-bit gradient accumulator (grads_in_partition)" if legacy
                else "16-bit gradient partitions (grad_partitions_flat_buffer)")
        if st.pin_memory:
            _pinned(steps, cfg, what, flat, True)
        else:
            steps.append(HostStep("host_pageable", flat, what))
    return steps


def host_grad_partition_bytes(cfg: RunConfig, sz: StateSizes) -> float:
    """Bytes of DeepSpeed ZeRO-3 offload's 16-bit host buffer of the rank's gradient partitions,
    per rank, as the release (``strategy.z3_host_grads``, :class:`Z3HostGrads`) allocates it;
    0 off that path or with 16-bit host gradients (``delayed_grad_conversion``: counted as their
    home). ``flat_gpu_check`` / ``flat_host_check`` (v0.6.0+, stage3.py ``_setup_for_real_optimizer``):
    ``grad_partitions_flat_buffer``, every partition in the model dtype, always; ``legacy``
    (v0.3.12-v0.5.10, ``partition_previous_reduced_grads``): ``grads_in_partition``, ``torch.half``,
    only with gradient accumulation (``gradient_accumulation_steps > 1``). Made at the first flush
    there, not at start-up, and kept, so counted with the start-up items."""
    st, pr, pl = cfg.strategy, cfg.workload.precision, cfg.strategy.placement
    if not deepspeed_zero3_offload(cfg) or (pl.grads == "cpu" and st.delayed_grad_conversion):
        return 0.0
    parts = sum(param_partitions(cfg, sz))
    if Z3HostGrads(st.z3_host_grads) is Z3HostGrads.LEGACY:
        return parts * DTYPE_BYTES["fp16"] if cfg.workload.training.grad_accumulation > 1 else 0.0
    return parts * DTYPE_BYTES[pr.grads]


def host_steps_peak(steps: Sequence[HostStep]) -> tuple[dict[str, float], float]:
    """Bytes left per tier after ``steps`` and the highest pinned + pageable total on the way."""
    level = {"host_pinned": 0.0, "host_pageable": 0.0}
    peak = 0.0
    for s in steps:
        level[s.tier] += s.nbytes
        peak = max(peak, sum(level.values()))
    return level, peak


def first_step_state_bytes(cfg: RunConfig, params: float) -> float:
    """Pageable bytes CPU Adam creates for one NVMe-homed sub-group's moments at its first step
    (ops/adam/cpu_adam.py ``zeros_like``), swapped out through the pinned pool and then released
    (swap_tensor/optimizer_utils.py ``_swap_out_unpinned_tensors``, ``release_memory``)."""
    st, wl = cfg.strategy, cfg.workload
    if not deepspeed_zero3_offload(cfg) or st.placement.optimizer_states != "nvme":
        return 0.0
    return params * wl.optimizer.moments * DTYPE_BYTES[wl.precision.optimizer_moments]


def overflow_check_bytes(cfg: RunConfig, sz: StateSizes) -> float:
    """Pageable temporaries of DeepSpeed's overflow check at each step, bytes: fp16 only
    (stage3.py ``_overflow_check_and_loss_scale_update`` skips it for bf16); ``has_overflow``
    runs ``torch.isinf`` then ``torch.isnan`` over the whole 16-bit host gradient buffer, and
    ``isinf`` is ``self.abs() == inf`` (aten/src/ATen/native/TensorCompare.cpp), so a 16-bit
    copy and a 1-byte mask per element are alive together. ``fused`` (MemAscend): none. Only
    from v0.9.4 (PR #3622, ``z3_host_grads`` ``flat_host_check``): earlier releases check each
    reduced partition on the GPU (:class:`Z3HostGrads`), with no host temporaries."""
    st, pr = cfg.strategy, cfg.workload.precision
    if not deepspeed_zero3_offload(cfg) or st.overflow_check == "fused" or pr.params != "fp16":
        return 0.0
    if Z3HostGrads(st.z3_host_grads) is not Z3HostGrads.FLAT_HOST_CHECK:
        return 0.0
    return sum(param_partitions(cfg, sz)) * (DTYPE_BYTES[pr.grads] + 1.0)


def gpu_step_transient_bytes(cfg: RunConfig, sz: StateSizes) -> float:
    """GPU bytes the optimizer step holds besides the state, per rank, when the optimizer state
    is on the GPU (0 otherwise): the larger of its two moments.

    * ZeRO-3 casts each sub-group's gradients (stage3.py ``_prepare_fp32_grad_for_sub_group``:
      ``flatten(averaged_gradients).to(fp32)``, the 16-bit flat copy and the fp32 gradient alive
      together), a sub-group being at most ``sub_group_size`` elements of the rank's partition;
    * then Adam runs on that sub-group with its fp32 gradient alive. ``strategy.gpu_adam``
      ``torch`` (torch/optim/adamw.py ``_multi_tensor_adamw``: ``exp_avg_sq_sqrt =
      torch._foreach_sqrt(device_exp_avg_sqs)``, a new tensor per updated tensor; the
      single-tensor path's ``denom`` likewise) adds one temporary of the second moment's size;
      DeepSpeed's FusedAdam (csrc/adam ``multi_tensor_adam.cu``) updates in place.

    Below ZeRO-3 the partition is one flat fp32 tensor per parameter group
    (stage_1_and_2.py ``single_partition_of_fp32_groups``) whose gradient is part of the
    steady state, so only torch's temporary is counted, over the rank's whole partition."""
    st, pr = cfg.strategy, cfg.workload.precision
    if st.optimizer_device != "gpu" or st.placement.optimizer_states != "gpu":
        return 0.0
    sqrt_bpp = DTYPE_BYTES[pr.optimizer_moments] if st.gpu_adam == "torch" else 0.0
    if st.zero_stage != 3:
        return sz.local_params * sqrt_bpp
    group = min(float(st.sub_group_params), sz.local_params)
    fp32_grad = DTYPE_BYTES[pr.optimizer_grads]
    cast = group * (DTYPE_BYTES[pr.grads] + fp32_grad)
    return max(cast, group * (fp32_grad + sqrt_bpp))


def home_param_bytes(cfg: RunConfig, sz: StateSizes) -> float:
    """Bytes of the 16-bit parameters in their home tier, per rank. Pinned host parameters are
    rounded per layer by a caching allocator, except on DeepSpeed's ZeRO-3 path, which pins one
    flat tensor per parameter group (stage3.py ``_create_param_groups_fp16_flat_cpu_memory``)."""
    st = cfg.strategy
    local = sz.param_bytes / sz.param_part
    if _home_tier(st.placement.params, st.pin_memory) != "host_pinned":
        return local
    if deepspeed_zero3_offload(cfg):
        return round_pinned(local, st.host_allocator)
    per_layer = [lay.params * sz.param_bytes / sz.params_total / sz.param_part for lay in sz.layers]
    return sum(round_pinned(b, st.host_allocator) for b in per_layer)


def capacities(cfg: RunConfig) -> dict[str, float]:
    """Capacity per tier: GPU per rank; pinned, host and NVMe per node; the PFS quota for the
    whole job (all nodes)."""
    hw = cfg.hardware
    return {
        "gpu": hw.gpu.memory_bytes,
        "host_pinned": hw.dram.pinned_cap_bytes,
        "host": hw.dram.usable_bytes,
        "nvme": hw.nvme.capacity_bytes if hw.nvme else 0.0,
        "pfs": hw.pfs.capacity_bytes if hw.pfs else 0.0,
    }


