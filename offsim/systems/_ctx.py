"""What a system derives once from the run configuration: sizes, paths, the activation
policy's decisions and the variants it composes (:class:`Ctx`, built by :func:`build_ctx`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from offsim.config.run import RunConfig
from offsim.core.enums import Tier, home_tier
from offsim.mechanisms.activations import LayerActivations
from offsim.mechanisms.base import StorageIO
from offsim.plan import footprint as fp
from offsim.plan.model import Layer
from offsim.plan.paths import Paths, resource_capacities
from offsim.plan.policy_plan import (
    activation_decisions,
    custom_activations,
)
from offsim.schedule.ops import Flow


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
    paths = Paths(cfg, resource_capacities(cfg, sz.ranks_per_node, sz.dp), lambda: _nvme_write_rate(cfg, sz))
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
