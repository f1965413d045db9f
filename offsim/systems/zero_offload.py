"""ZeRO-Offload (Ren et al., USENIX ATC 2021, arXiv 2101.06840, Sec. 4): ZeRO-2 with the optimizer
state and its step on the CPU; 16-bit gradients go to the host during backward, updated 16-bit
parameters come back after the CPU step. ``delayed_param_update`` is its one-step delayed
parameter update (Sec. 4.3, ``zero-offload-dpu``).

Mechanisms: compute, activations, gradient offload, the CPU optimizer per sub-group (its
upload and, with DPU, its overlap with the next iteration). At ZeRO stage 2 without DPU the
gradients move as DeepSpeed's ``copy_grads_in_partition`` moves them
(:mod:`offsim.mechanisms.zero2_grads`: the accumulator's PCIe round trip, the boundary's fp32
copy, on the compute stream unless ``overlap_grad_offload``, DeepSpeed's ``overlap_comm``).

Shipped strategies: zero-offload, zero-offload-dpu. The shared knobs (placement, ZeRO stage, buffers...) keep working
under it; of the system options (:data:`~offsim.config.strategy.SYSTEM_OPTIONS`) it accepts
``OPTIONS``; its own (``system_options``) are :class:`Options`.
"""

from dataclasses import replace
from typing import Literal

from pydantic import Field

from offsim.config.base import Frozen
from offsim.config.run import RunConfig
from offsim.core.enums import Tier
from offsim.mechanisms.base import SiteKind, Stage
from offsim.mechanisms.zero2_grads import Z12LayerGrads, Zero2Grads
from offsim.plan import footprint as fp
from offsim.plan.deepspeed_versions import DEFAULT_Z12_ACCUM_MODE, Z12AccumMode
from offsim.plan.footprint import StateSizes
from offsim.plan.model import Layer
from offsim.systems._compile import System
from offsim.systems._ctx import Ctx, build_ctx, whole
from offsim.systems._options import read_options
from offsim.systems._parts import standard

OPTIONS: frozenset[str] = frozenset({"delayed_param_update", "lp_copy"})


class Options(Frozen):
    """ZeRO-Offload's own knobs: the DeepSpeed release's gradient copies under accumulation
    (deepspeed_runtime.md §14.2, :class:`~offsim.plan.deepspeed_versions.Z12AccumMode`; the
    paper's v0.3.x: ``v1``)."""

    z12_accum_mode: Literal["v1", "drop_middle", "d2h_every_mb"] = DEFAULT_Z12_ACCUM_MODE.value
    #: GPU elements of each IPG bucket buffer per ``reduce_bucket_size`` element: 4.5 in
    #: v0.3.0-v0.3.16 (stage2.py ``backward``: ``torch.empty(int(self.reduce_bucket_size * 4.5))``,
    #: one buffer, two with ``overlap_comm``), 1 from v0.4.0 (PR #1042)
    ipg_buffer_factor: float = Field(default=1.0, ge=1.0)
    #: how a full bucket is reduced over data-parallel ranks (deepspeed_runtime.md §4, §14.9
    #: ``z12_reduce``): ``reduce``, one async ``dist.reduce`` per owning rank's slice (v0.3.0-v0.12.3,
    #: ``average_tensor``), about the bytes of a reduce-scatter; ``allreduce``, the bucket all-reduced
    #: whole (``use_multi_rank_bucket_allreduce``, v0.12.4+, PR #4695), about twice that
    z12_reduce: Literal["reduce", "allreduce"] = "allreduce"


def on_deepspeed_z2_grads(cfg: RunConfig) -> bool:
    """DeepSpeed's ZeRO-2 offload gradient path applies: stage 2, gradients and the step on the
    CPU after backward, no delayed update (DPU is not in DeepSpeed, deepspeed_runtime.md §6)."""
    st = cfg.strategy
    return (st.zero_stage == 2 and st.optimizer_device == "cpu" and st.placement.grads != "gpu"
            and st.optimizer_schedule == "after-backward" and not st.delayed_param_update
            and st.optimizer_gpu_fraction == 0.0 and st.grad_compression_ratio == 1.0)


def _layer(c: Ctx, lay: Layer) -> Z12LayerGrads | None:
    """A layer's copies: its owned elements (``lay.params`` over the ZeRO-2 partition) at 2 B up
    and down, 4 B for the boundary's fp32 copy; the GPU add reads the gradient and the
    temporary and writes the gradient (3 x 2 B per element at the HBM rate), the IPG bucket copy
    reads and writes every element of the layer (2 x 2 B)."""
    if lay.params <= 0:
        return None
    st, sz = c.st, c.sz
    local = lay.params / sz.grad_part
    lp = whole(local * c.bpp_grad)
    allreduce = read_options(st, Options).z12_reduce == "allreduce"
    reduce = c.collective(lay.params * c.bpp_grad, 2.0 if allreduce else 1.0)
    hbm = c.cfg.hardware.gpu.hbm_bytes_per_s
    add_s = 3 * local * c.bpp_grad / hbm
    return Z12LayerGrads(2 * lay.params * c.bpp_grad / hbm, reduce, c.paths.dma(True, lp, st.pin_memory),
                         c.paths.dma(False, lp, st.pin_memory),
                         add_s, c.paths.dma(False, whole(local * c.sz.host_grad_bytes_per_param), st.pin_memory))


def zero2_grads(c: Ctx) -> Zero2Grads:
    """:class:`Zero2Grads` from the strategy: ``overlap_comm`` is ``overlap_grad_offload``; the GPU
    holds ``reduce_bucket_size`` x ``ipg_buffer_factor`` 16-bit elements (two buffers with
    ``overlap_comm``, stage2.py ``ipg_buffer``, allocated at full size whatever the model) and
    ``temp_grad_buffer_for_gpu_offload`` (the largest parameter); the host,
    with accumulation, a 16-bit accumulator per owned parameter (:func:`_accumulator_bytes`)."""
    st = c.st
    model = c.cfg.workload.model
    largest = max((n for lay in c.layers for n in fp.layer_tensors(model, lay)), default=0)
    opts = read_options(st, Options)
    bucket = st.reduce_bucket_params * opts.ipg_buffer_factor * (2 if st.overlap_grad_offload else 1)
    accumulate = c.cfg.workload.training.grad_accumulation > 1
    return Zero2Grads(tuple(_layer(c, lay) for lay in c.layers), st.overlap_grad_offload,
                      Z12AccumMode(opts.z12_accum_mode), whole(bucket * c.bpp_grad),
                      whole(_accumulator_bytes(c)) if accumulate else 0,
                      Tier.HOST_PINNED if st.pin_memory else Tier.HOST_PAGEABLE, whole(largest * c.bpp_grad))


def _accumulator_bytes(c: Ctx) -> float:
    """The 16-bit CPU accumulators: one tensor per owned parameter, whole
    (``async_accumulate_grad_in_cpu_via_gpu``: ``torch.zeros(param.numel()).pin_memory()``), each
    rounded as ``host_allocator`` says when pinned (PyTorch's CachingHostAllocator: a power of two,
    :func:`offsim.plan.footprint.round_pinned`); a rank owns about 1 / partitions of them. Pinned
    iff ``pin_memory`` (v0.10.1+, PR #4131; earlier releases always pinned them)."""
    model = c.cfg.workload.model
    sizes = [n * c.bpp_grad for lay in c.layers for n in fp.layer_tensors(model, lay)]
    if c.st.pin_memory:
        sizes = [fp.round_pinned(b, c.st.host_allocator) for b in sizes]
    return sum(sizes) / c.sz.grad_part


def compose(cfg: RunConfig, sz: StateSizes | None = None) -> System:
    """The standard ZeRO-2 offload mechanisms, DeepSpeed's gradient path where it applies; the
    CPU step delayed one iteration with DPU."""
    c = build_ctx(cfg, sz)
    system = standard(c)
    if not on_deepspeed_z2_grads(cfg):
        return system
    mechs: dict[str, object] = {**system.mechanisms, "grads": zero2_grads(c)}
    sites = {**system.sites, SiteKind.INIT: (*system.sites[SiteKind.INIT], ("grads", Stage.RUN))}
    return replace(system, mechanisms=mechs, sites=sites)  # type: ignore[arg-type]
