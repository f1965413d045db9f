"""Bytes of each kind of training state per rank, and the per-tier fit check.

Pure planning: answers "does it fit at all?" before any SimPy event exists, and raises
:class:`~offsim.errors.InfeasibleError` naming the tier, the need and the capacity.

Partitioning follows ZeRO (Rajbhandari et al., SC 2020, arXiv 1910.02054, Sec. 5): stage 1
partitions optimizer state over the ``dp`` data-parallel ranks, stage 2 also gradients, stage 3
also parameters. Host and NVMe are shared by the ranks of a node, so their per-node need is the
per-rank need times the ranks on the node.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from offsim.config.run import RunConfig
from offsim.config.workload import DTYPE_BYTES
from offsim.errors import InfeasibleError
from offsim.plan import policy_plan
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
    p_total = wl.model.total_params
    moments = wl.optimizer.moments
    opt_bpp = DTYPE_BYTES[pr.master_params] + moments * DTYPE_BYTES[pr.optimizer_moments]
    return StateSizes(
        dp=dp,
        ranks_per_node=min(dp, hw.topology.gpus_per_node),
        params_total=p_total,
        param_bytes=p_total * DTYPE_BYTES[pr.params],
        grad_bytes=p_total * DTYPE_BYTES[pr.grads],
        host_grad_bytes_per_param=_host_grad_bytes_per_param(cfg),
        optimizer_bytes_per_param=opt_bpp,
        param_part=dp if st.zero_stage >= 3 else 1,
        grad_part=dp if st.zero_stage >= 2 else 1,
        opt_part=dp if st.zero_stage >= 1 else 1,
        layers=tuple(build_layers(wl, hw.gpu)),
    )


def _host_grad_bytes_per_param(cfg: RunConfig) -> float:
    """Bytes per gradient element once offloaded: the optimizer's format (fp32), or the 16-bit
    training format when the fp32 conversion is delayed to the update (MLP-Offload, arXiv
    2509.02480: fewer bytes kept in host memory or written to and read from storage)."""
    pr = cfg.workload.precision
    if cfg.strategy.delayed_grad_conversion:
        return DTYPE_BYTES[pr.grads]
    return DTYPE_BYTES[pr.optimizer_grads]


@dataclass(frozen=True)
class Footprint:
    """Estimated peak bytes per tier (gpu per rank; host and nvme per node) with a breakdown."""

    need_bytes: dict[str, float]
    capacity_bytes: dict[str, float]
    breakdown: dict[str, dict[str, float]]

    def first_overflow(self) -> str | None:
        """The first tier whose need exceeds its capacity, or None."""
        for tier in TIERS:
            if self.need_bytes[tier] > self.capacity_bytes[tier]:
                return tier
        return None


def _add(bd: dict[str, dict[str, float]], tier: str, what: str, nbytes: float) -> None:
    if nbytes > 0:
        bd[tier][what] = bd[tier].get(what, 0.0) + nbytes


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


def host_grad_buffer_bytes(sz: StateSizes) -> float:
    """Bytes of one layer-sized host gradient buffer: the largest layer's local gradients in
    the optimizer's format."""
    return max(lay.params for lay in sz.layers) / sz.grad_part * sz.host_grad_bytes_per_param


def _static_states(cfg: RunConfig, sz: StateSizes, bd: dict[str, dict[str, float]]) -> None:
    """Resident model state in its home tier (per rank)."""
    st = cfg.strategy
    pl, pin, alloc = st.placement, st.pin_memory, st.host_allocator
    params_local = sz.param_bytes / sz.param_part
    tier = _home_tier(pl.params, pin)
    per_layer = [layer.params * sz.param_bytes / sz.params_total / sz.param_part for layer in sz.layers]
    nbytes = sum(round_pinned(b, alloc) for b in per_layer) if tier == "host_pinned" else params_local
    _add(bd, tier, "params (16-bit)", nbytes)
    buffers = layerwise_grad_buffers(cfg)
    if pl.grads == "gpu":
        _add(bd, "gpu", "grads (16-bit)", sz.grad_bytes / sz.grad_part)
    elif buffers is not None:
        g = sz.params_total / sz.grad_part * sz.host_grad_bytes_per_param
        _add(bd, "host_pinned" if pin else "host", f"grads (optimizer format), {buffers} layer buffers",
             buffers * round_pinned(host_grad_buffer_bytes(sz), alloc) if pin else buffers * host_grad_buffer_bytes(sz))
        _add(bd, "gpu", "grads (optimizer format) of the GPU-updated share", g * st.optimizer_gpu_fraction)
    else:
        g = sz.params_total / sz.grad_part * sz.host_grad_bytes_per_param
        _add(bd, _home_tier(pl.grads, pin), "grads (optimizer format)",
             _rounded_groups(g * (1.0 - st.optimizer_gpu_fraction), cfg, alloc, pl.grads, pin))
        _add(bd, "gpu", "grads (optimizer format) of the GPU-updated share", g * st.optimizer_gpu_fraction)
    o = sz.local_params * sz.optimizer_bytes_per_param
    on_pfs = pfs_share(cfg)
    _add(bd, _home_tier(pl.optimizer_states, pin), "optimizer state",
         _rounded_groups(o * (1.0 - st.optimizer_gpu_fraction) * (1.0 - on_pfs), cfg, alloc, pl.optimizer_states, pin))
    _add(bd, "pfs", "optimizer state striped to the PFS", o * (1.0 - st.optimizer_gpu_fraction) * on_pfs)
    _add(bd, "gpu", "optimizer state of the GPU-updated share", o * st.optimizer_gpu_fraction)


def _gpu_optimizer_buffers(cfg: RunConfig, sz: StateSizes, bd: dict[str, dict[str, float]]) -> None:
    """Deep Optimizer States: host sub-groups streamed to the GPU for the update, up to three in
    flight (read, update, write back), in the GPU memory the rest leaves free (the engine's
    performance model sends none when not one fits, so this never makes a plan infeasible)."""
    st = cfg.strategy
    if st.optimizer_split != "perf-model":
        return
    group = min(st.sub_group_params, sz.local_params * (1.0 - st.optimizer_gpu_fraction))
    per_group = group * (sz.optimizer_bytes_per_param + sz.host_grad_bytes_per_param)
    in_flight = 3 if st.optimizer_swap_pipeline else 1
    free = cfg.hardware.gpu.memory_bytes - sum(bd["gpu"].values())
    fit = max(0, min(in_flight, int(free // per_group))) if per_group > 0 else 0
    _add(bd, "gpu", "optimizer sub-groups streamed to the GPU", fit * per_group)


def _rounded_groups(nbytes: float, cfg: RunConfig, alloc: str, home: str, pinned: bool) -> float:
    """Host state is allocated per optimizer sub-group; round each when pinned by a caching allocator."""
    if home != "cpu" or not pinned or alloc != "caching":
        return nbytes
    groups = max(1, math.ceil(cfg.workload.model.total_params / cfg.strategy.sub_group_params))
    return groups * round_pinned(nbytes / groups, alloc)


def gpu_param_window_layers(cfg: RunConfig, sz: StateSizes) -> int:
    """Most layers whose gathered parameters are on the GPU at once when params are streamed."""
    block = max(1, sz.layers[1].params if len(sz.layers) > 2 else sz.layers[0].params)
    reuse = int(cfg.strategy.reuse_distance_params // block)
    return min(len(sz.layers), cfg.strategy.prefetch_depth + 1 + reuse)


def grad_buffer_bytes(cfg: RunConfig, sz: StateSizes) -> float:
    """GPU bytes one in-flight gradient offload holds: a layer's 16-bit gradients, at most one
    reduce bucket (DeepSpeed ``reduce_bucket_size``, default 5e8 elements)."""
    biggest = max(lay.params for lay in sz.layers) * sz.grad_bytes / sz.params_total
    return min(biggest, cfg.strategy.reduce_bucket_params * sz.grad_bytes / sz.params_total)


def params_streamed(cfg: RunConfig) -> bool:
    """True when layers' full parameters are gathered on the GPU only around their use."""
    st = cfg.strategy
    return st.placement.params != "gpu" or (st.zero_stage >= 3 and cfg.workload.training.data_parallel > 1)


def _gpu_dynamic(cfg: RunConfig, sz: StateSizes, bd: dict[str, dict[str, float]]) -> None:
    st = cfg.strategy
    layers = sz.layers
    byte_per_param = sz.param_bytes / sz.params_total
    biggest = max(layer.params for layer in layers) * byte_per_param
    if params_streamed(cfg):
        window = policy_plan.param_window_bytes(cfg, sz, gpu_param_window_layers(cfg, sz) * biggest)
        _add(bd, "gpu", "gathered params window", window)
    if policy_plan.custom_activations(cfg):
        _policy_activations(cfg, sz, bd)
        if st.placement.grads != "gpu":
            _add(bd, "gpu", "gradient buffers before offload", 2 * grad_buffer_bytes(cfg, sz))
        return
    ckpt = cfg.activation_checkpointing
    kept = [lay.kept_bytes(ckpt) for lay in layers]
    if st.placement.activations == "gpu":
        _add(bd, "gpu", "activations kept for backward", sum(kept))
    else:
        _add(bd, "gpu", "activations in flight", (st.prefetch_depth + 2) * max(kept))
    work = max(lay.backward_work_bytes(ckpt) for lay in layers)
    _add(bd, "gpu", "backward working memory (recompute, activation gradients)", work)
    if st.placement.grads != "gpu":
        _add(bd, "gpu", "gradient buffers before offload", 2 * grad_buffer_bytes(cfg, sz))


def _policy_activations(cfg: RunConfig, sz: StateSizes, bd: dict[str, dict[str, float]]) -> None:
    """Activation memory per tier from the activation policy's per-layer decisions."""
    decisions = policy_plan.activation_decisions(cfg, sz)
    kept = {d.layer: sz.layers[d.layer].kept_bytes(d.recompute) for d in decisions}
    on = {tier: [d.layer for d in decisions if d.tier == tier] for tier in ("gpu", "cpu", "nvme")}
    _add(bd, "gpu", "activations kept for backward", sum(kept[i] for i in on["gpu"]))
    moved = on["cpu"] + on["nvme"]
    if moved:
        depth = cfg.strategy.prefetch_depth
        _add(bd, "gpu", "activations in flight", (depth + 2) * max(kept[i] for i in moved))
    host = "host_pinned" if cfg.strategy.pin_memory else "host"
    _add(bd, host, "offloaded activations", sum(kept[i] for i in on["cpu"]))
    _add(bd, "nvme", "offloaded activations", sum(kept[i] for i in on["nvme"]))
    work = max(sz.layers[d.layer].backward_work_bytes(d.recompute) for d in decisions)
    _add(bd, "gpu", "backward working memory (recompute, activation gradients)", work)


def _host_dynamic(cfg: RunConfig, sz: StateSizes, bd: dict[str, dict[str, float]]) -> None:
    st = cfg.strategy
    if st.uses_nvme():
        n = st.pinned_buffer_count
        _add(bd, "host_pinned", "pinned staging buffers", n * round_pinned(st.pinned_buffer_bytes, st.host_allocator))
    cache = policy_plan.dram_cache_bytes(cfg, sz)
    _add(bd, "host_pinned" if st.pin_memory else "host", "DRAM cache of optimizer state", cache)
    ckpt = cfg.activation_checkpointing
    kept = sum(lay.kept_bytes(ckpt) for lay in sz.layers)
    if policy_plan.custom_activations(cfg):
        pass  # added by _policy_activations
    elif st.placement.activations == "cpu":
        _add(bd, "host_pinned" if st.pin_memory else "host", "offloaded activations", kept)
    elif st.placement.activations == "nvme":
        _add(bd, "nvme", "offloaded activations", kept)
    if "nvme" in (st.placement.optimizer_states, st.placement.grads):
        group = min(st.sub_group_params, sz.local_params)
        per_param = (sz.optimizer_bytes_per_param if st.placement.optimizer_states == "nvme" else 0.0) + (
            sz.host_grad_bytes_per_param if st.placement.grads == "nvme" else 0.0)
        in_flight = 3 if st.optimizer_swap_pipeline else 1  # reading, updating, writing
        _add(bd, "host_pinned", "optimizer swap buffers",
             in_flight * round_pinned(group * per_param, st.host_allocator))


def footprint(cfg: RunConfig, sz: StateSizes | None = None) -> Footprint:
    """Estimated peak bytes per tier, an upper bound on what the engine allocates."""
    sz = sz or state_sizes(cfg)
    bd: dict[str, dict[str, float]] = {t: {} for t in TIERS}
    _add(bd, "gpu", "reserved (CUDA context, allocator)", cfg.hardware.gpu.reserved_bytes)
    _static_states(cfg, sz, bd)
    _gpu_dynamic(cfg, sz, bd)
    _gpu_optimizer_buffers(cfg, sz, bd)
    _host_dynamic(cfg, sz, bd)
    per_rank = {t: sum(bd[t].values()) for t in TIERS}
    need = {
        "gpu": per_rank["gpu"],
        "host_pinned": per_rank["host_pinned"] * sz.ranks_per_node,
        "host": (per_rank["host_pinned"] + per_rank["host"]) * sz.ranks_per_node,
        "nvme": per_rank["nvme"] * sz.ranks_per_node,
        "pfs": per_rank["pfs"] * sz.ranks_per_node * cfg.hardware.topology.nodes,
    }
    return Footprint(need, capacities(cfg), bd)


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


def check_fit(cfg: RunConfig, sz: StateSizes | None = None) -> Footprint:
    """Raise InfeasibleError if any tier's estimated peak exceeds its capacity."""
    fp = footprint(cfg, sz)
    tier = fp.first_overflow()
    if tier is not None:
        parts = sorted(fp.breakdown[tier].items(), key=lambda kv: -kv[1])[:3]
        if tier == "host":
            parts = sorted({**fp.breakdown["host"], **fp.breakdown["host_pinned"]}.items(), key=lambda kv: -kv[1])[:3]
        detail = ", ".join(f"{k} {v / 2**30:.2f} GiB" for k, v in parts)
        scope = "per GPU" if tier == "gpu" else "per node"
        raise InfeasibleError(tier, fp.need_bytes[tier], fp.capacity_bytes[tier], f"{scope}; largest: {detail}")
    return fp
