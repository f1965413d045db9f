"""Megatron-Core CPU offload (NVIDIA/Megatron-LM ``d98e8a64dd``; ``../shared/reference/new_systems.md`` §2).

**Optimizer offload** (``HybridDeviceOptimizer``,
``megatron/core/optimizer/cpu_offloading/hybrid_optimizer.py``, built by
``megatron/core/optimizer/__init__.py`` when ``optimizer_cpu_offload`` is set). The distributed
optimizer's shard of each rank (ZeRO-1) is split in parameter-group order: whole tensors go to the
CPU until ``optimizer_offload_fraction`` of the elements are there (``_get_sub_optimizer_param_groups``),
so the CPU share is the fraction rounded up to one tensor. The CPU share keeps pinned fp32 master
and gradient copies and torch ``AdamW(fused=True)`` moments (pageable); the GPU share keeps fp32
master copies and moments for FusedAdam (``param_update_in_fp32=True``). Parameters (16-bit) and
the fp32 main-grad buffer stay on the GPU for the whole model. ``step()``, after backward:

* the CPU share's fp32 gradients go D2H (``_set_sub_optimizer_grads``), then the GPU share's
  FusedAdam runs on the compute stream;
* the host thread waits for the gradients (``d2h_event.synchronize()``), runs torch's fused CPU
  AdamW, and the post-step hook (``param_copy_back_gpu_hook``) copies each updated fp32 master into
  its 16-bit GPU parameter: ``copy_`` between dtypes casts on the CPU into a pageable buffer and
  copies from it (``aten/src/ATen/native/cuda/Copy.cu``, ``copy_kernel_cuda``), and a copy from
  pageable memory returns only once the data is staged (CUDA Runtime API, "API synchronization
  behavior"), so the host thread is busy for the H2D; the hook's stream waits for the compute
  stream (``wait_stream``), hence for the GPU share's FusedAdam;
* without ``overlap_cpu_optimizer_d2h_h2d`` there is one CPU optimizer and the copies use the
  compute stream: every D2H, then one AdamW over the share, then every H2D, in series;
  with it there is one CPU optimizer per tensor and the D2H copies run on a side stream, so the
  D2H of later tensors overlaps the host's AdamW, cast and H2D of earlier ones;
* the compute stream waits for the last H2D (``record_event().wait``): nothing of the step
  overlaps the next forward. ZeRO-1 then all-gathers the updated parameters (dp > 1). The
  gradients' reduction is the standard ZeRO-1 all-reduce of 16-bit gradients, which moves the
  bytes of Megatron's reduce-scatter of fp32 main grads (bf16 runs reduce in fp32 by default:
  ``megatron/training/arguments.py``, ``accumulate_allreduce_grads_in_fp32``).

The CPU AdamW rate is derived, not measured: torch's fused CPU kernel
(``aten/src/ATen/native/cpu/FusedAdamKernel.cpp``, ``adam_fused_step_impl``) makes one vectorised
pass per tensor, split over the intra-op threads by ``at::parallel_for``, that loads param, grad,
exp_avg and exp_avg_sq and stores param, exp_avg and exp_avg_sq: 28 B of DRAM per fp32 element
(:func:`offsim.plan.torch_cpu.adam_passes`). It is priced as every system's torch CPU code is
(:func:`offsim.plan.torch_cpu.torch_pass_flow`, whose assumption is stated there: the DRAM
efficiency DeepSpeed's CPU Adam reaches, and a per-thread streaming cap); per-tensor Python and
launch overhead is not modelled, which makes the modelled step a lower estimate.

**Activation offload** (``cpu_offloading``, TransformerEngine ``get_cpu_offload_context``): the
tensors the first ``cpu_offloading_num_layers`` blocks save for backward go D2H into pinned host
memory as forward produces them and come back H2D before that block's backward
(``activation_offload_layers``). Megatron refuses it with recomputation (``TransformerConfig``), and
so does this system: a run with activation checkpointing on is refused.
Weight offload (``cpu_offloading_weights``) is a no-op on TE's default path and is not modelled.

Mechanisms: compute, activations (the first blocks offloaded), gradients reduced on the GPU, the
hybrid optimizer (:class:`HybridOptimizer`, this file's own), static state (:func:`static_state`).
Knobs: :class:`Options`, under ``system_options``. Shipped strategies: megatron-offload.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from pydantic import Field

from offsim.config.base import Frozen
from offsim.config.run import RunConfig
from offsim.config.workload import DTYPE_BYTES
from offsim.core.enums import Activity, MechanismId, Phase, StreamKind, TensorKind, Tier
from offsim.errors import ConfigError
from offsim.mechanisms.base import BlockBuilder, Need, Setup, Site, SiteKind, Stage, tag
from offsim.mechanisms.compute import COMPUTE
from offsim.mechanisms.grads import grad_home
from offsim.mechanisms.static_state import StaticItem, StaticState
from offsim.plan.footprint import StateSizes
from offsim.plan.torch_cpu import AdamImpl, adam_passes, torch_pass_flow
from offsim.schedule.ops import Alloc, Delay, Flow, Free, Join, StreamSpec, Tag, TensorRef
from offsim.systems._compile import System
from offsim.systems._options import read_options
from offsim.systems._parts import Ctx, build_ctx, standard, whole

OPTIONS: frozenset[str] = frozenset(())

#: HBM bytes per element of the GPU share's step: FusedAdam over fp32 master, grad and moments
#: (28 B, TE ``multi_tensor_adam``), then ``fp32_param_copy_back_gpu_hook``'s ``param.data.copy_``
#: of the fp32 master into the 16-bit parameter (4 B read, 2 B written).
GPU_STEP_HBM_BYTES_PER_PARAM = 28.0 + 4.0 + 2.0

HOST = "hdo_host"  # the thread that runs step(): waits, CPU AdamW, casts, pageable H2D copies
D2H = "hdo_d2h"    # the side stream of the gradient copies (overlap_cpu_optimizer_d2h_h2d)


class Options(Frozen):
    """Megatron-Core's offload knobs (``OptimizerConfig``, ``TransformerConfig``; CLI in
    ``megatron/training/arguments.py``).

    Attributes:
        optimizer_offload_fraction: share of the rank's optimizer elements on the CPU
            (``--optimizer-offload-fraction``; the CLI's default 1.0), rounded up to one tensor.
        overlap_cpu_optimizer_d2h_h2d: one CPU optimizer per tensor, D2H copies on a side stream.
        pin_cpu_grads / pin_cpu_params: the CPU share's fp32 gradient / master copies page-locked.
        tensor_params: elements of one optimizer tensor; None: one MLP matrix of the workload
            (``hidden x ffn_hidden``; ``hidden x expert_ffn_hidden`` for a mixture of experts).
            An approximation: Megatron steps the shard's real tensors one by one.
        activation_offload_layers: ``cpu_offloading_num_layers``: the first blocks whose saved
            activations live in pinned host memory between forward and backward (0: none).
    """

    optimizer_offload_fraction: float = Field(default=1.0, ge=0.0, le=1.0)
    overlap_cpu_optimizer_d2h_h2d: bool = False
    pin_cpu_grads: bool = True
    pin_cpu_params: bool = True
    tensor_params: int | None = Field(default=None, ge=1)
    activation_offload_layers: int = Field(default=0, ge=0)


@dataclass(frozen=True)
class CpuTensor:
    """One CPU-share tensor's step: gradient D2H, torch AdamW, cast to 16 bits, pageable H2D.

    Attributes:
        params: its elements.
        d2h: the fp32 gradient to the host copy.
        adam: torch's fused CPU AdamW over it (DRAM bytes touched).
        cast: the CPU cast of the fp32 master into a pageable 16-bit buffer (4 B read, 2 B written).
        h2d: the pageable copy of that buffer into the GPU parameter.
        staging_bytes: the pageable 16-bit buffer, held from the cast to the end of the copy.
    """

    params: float
    d2h: Flow
    adam: Flow
    cast: Flow
    h2d: Flow
    staging_bytes: int


@dataclass(frozen=True)
class HybridOptimizer:
    """The ``HybridDeviceOptimizer`` step (module docstring).

    Attributes:
        tensors: the CPU share, tensor by tensor, in parameter-group order.
        gpu_adam_s: the GPU share's FusedAdam and fp32-to-16-bit copy, seconds (HBM-bound).
        overlap: ``overlap_cpu_optimizer_d2h_h2d``.
        whole_share_adam: without overlap, the one CPU AdamW over every tensor of the share.
        gather: ZeRO-1's all-gather of the updated parameters (None: dp 1).
        n_layers: layers whose gradients the step waits for.
    """

    tensors: tuple[CpuTensor, ...]
    gpu_adam_s: float
    overlap: bool
    whole_share_adam: Flow | None
    gather: Flow | None
    n_layers: int
    id: MechanismId = MechanismId.CPU_OPTIMIZER

    def setup(self) -> Setup:
        return Setup(streams=(StreamSpec(HOST, StreamKind.CPU), StreamSpec(D2H, StreamKind.COPY)))

    def footprint(self) -> tuple[Need, ...]:
        """The pageable 16-bit buffer of one tensor's H2D at a time (the state is static)."""
        largest = max((t.staging_bytes for t in self.tensors), default=0)
        return (Need(Tier.HOST_PAGEABLE, "16-bit cast of one CPU-updated tensor (pageable H2D source)", largest),)

    def _t(self, activity: Activity, group: int = -1, label: str = "") -> Tag:
        return tag(activity, self.id, Phase.OPTIMIZER, group=group, label=label)

    def emit(self, b: BlockBuilder, site: Site, stage: Stage) -> None:
        if site.what is not SiteKind.STEP or stage is not Stage.RUN:
            return
        grads = tuple(grad_home(u) for u in range(self.n_layers))
        start = b.add(Join(), self._t(Activity.OPTIMIZER, label="gradients home"), COMPUTE, reads=grads)
        copies = D2H if self.overlap else COMPUTE
        d2h = [b.add(t.d2h, self._t(Activity.OPT_D2H, g), copies, after=[start]) for g, t in enumerate(self.tensors)]
        gpu = start  # f = 1: no GPU share
        if self.gpu_adam_s > 0:
            gpu = b.add(Delay(self.gpu_adam_s), self._t(Activity.OPTIMIZER, label="GPU FusedAdam (GPU share)"),
                        COMPUTE)
        last = self._overlapped(b, d2h, gpu) if self.overlap else self._serial(b, d2h, gpu)
        end = b.add(Join(), self._t(Activity.OPTIMIZER, label="waits for the last H2D"), COMPUTE, after=last)
        if self.gather is not None:
            b.add(self.gather, self._t(Activity.PARAM_GATHER), COMPUTE, after=[end])

    def _copy_back(self, b: BlockBuilder, g: int, gpu: int) -> int:
        """Tensor ``g``'s cast into a pageable buffer and its H2D, the host thread busy throughout;
        the copy's stream waits for the compute stream's FusedAdam first."""
        t, buf = self.tensors[g], TensorRef(TensorKind.BUFFER, group=g, unit=-4)
        up = self._t(Activity.PARAM_UPDATE, g)
        b.add(Alloc(Tier.HOST_PAGEABLE, t.staging_bytes, buf), up, HOST)
        b.add(t.cast, self._t(Activity.PARAM_UPDATE, g, "cast fp32 master to 16 bits"), HOST)
        b.add(t.h2d, up, HOST, after=[gpu])
        return b.add(Free(Tier.HOST_PAGEABLE, buf), up, HOST)

    def _serial(self, b: BlockBuilder, d2h: list[int], gpu: int) -> list[int]:
        """One CPU optimizer: wait for every D2H, one AdamW over the share, every H2D."""
        if not self.tensors or self.whole_share_adam is None:
            return [gpu]
        b.add(Join(), self._t(Activity.OPTIMIZER, label="waits for the gradients' D2H"), HOST, after=d2h)
        b.add(self.whole_share_adam, self._t(Activity.OPTIMIZER, label="CPU AdamW (torch, CPU share)"), HOST)
        return [self._copy_back(b, g, gpu) for g in range(len(self.tensors))][-1:]

    def _overlapped(self, b: BlockBuilder, d2h: list[int], gpu: int) -> list[int]:
        """One CPU optimizer per tensor: wait for its D2H, AdamW, cast and H2D, in turn."""
        last = [gpu]
        for g, t in enumerate(self.tensors):
            b.add(Join(), self._t(Activity.OPTIMIZER, g, "waits for the tensor's D2H"), HOST, after=[d2h[g]])
            b.add(t.adam, self._t(Activity.OPTIMIZER, g, f"CPU AdamW tensor {g}"), HOST)
            last = [self._copy_back(b, g, gpu)]
        return last


# ---------------------------------------------------------------- sizes and flows
def tensor_params(c: Ctx, o: Options) -> float:
    """Elements of one optimizer tensor (:attr:`Options.tensor_params`)."""
    if o.tensor_params is not None:
        return float(o.tensor_params)
    m = c.cfg.workload.model
    width = m.moe.expert_ffn_hidden if m.moe is not None else m.ffn_hidden
    return float(m.hidden * width)


def cpu_share_params(c: Ctx, o: Options) -> float:
    """Elements of the rank's shard on the CPU: the fraction rounded up to whole tensors, at most
    the shard (``_get_sub_optimizer_param_groups``: tensors move until the threshold is reached)."""
    local, f = c.sz.local_params, o.optimizer_offload_fraction
    if f <= 0.0:
        return 0.0
    unit = tensor_params(c, o)
    return min(local, math.ceil(f * local / unit - 1e-9) * unit)


def cpu_adamw(c: Ctx, nparams: float) -> Flow:
    """Torch's fused CPU AdamW (``torch.optim.AdamW(fused=True)``, weight decay inside the kernel)
    over ``nparams`` elements of the master dtype, on the rank's share of the node's cores."""
    master_b = DTYPE_BYTES[c.cfg.workload.precision.master_params]
    passes = adam_passes(AdamImpl.FUSED, master_b, master_b, weight_decay=True, decoupled=True)
    return torch_pass_flow(c.cfg.hardware, c.sz.ranks_per_node, None, nparams, passes)


def cpu_tensors(c: Ctx, o: Options) -> tuple[CpuTensor, ...]:
    """The CPU share as equal tensors of :func:`tensor_params` elements (the last one shorter)."""
    share, unit = cpu_share_params(c, o), tensor_params(c, o)
    pr = c.cfg.workload.precision
    grad_b, master_b = DTYPE_BYTES[pr.optimizer_grads], DTYPE_BYTES[pr.master_params]
    out, left = [], share
    while left > 1e-6:
        p = min(unit, left)
        left -= p
        low = whole(p * c.bpp_param)
        out.append(CpuTensor(p, c.paths.dma(False, whole(p * grad_b), o.pin_cpu_grads), cpu_adamw(c, p),
                             c.paths.host_copy(whole(p * (master_b + c.bpp_param))),
                             c.paths.dma(True, low, pinned=False), low))
    return tuple(out)


def hybrid_optimizer(c: Ctx, o: Options) -> HybridOptimizer:
    """The step of the rank's shard: the CPU share tensor by tensor, the rest by FusedAdam."""
    tensors = cpu_tensors(c, o)
    on_gpu = c.sz.local_params - sum(t.params for t in tensors)
    gpu_s = on_gpu * GPU_STEP_HBM_BYTES_PER_PARAM / c.cfg.hardware.gpu.hbm_bytes_per_s
    overlapped = o.overlap_cpu_optimizer_d2h_h2d or not tensors
    whole_share = None if overlapped else cpu_adamw(c, sum(t.params for t in tensors))
    gather = c.collective(c.sz.param_bytes, 1.0) if c.st.zero_stage in (1, 2) else None
    return HybridOptimizer(tensors, gpu_s, o.overlap_cpu_optimizer_d2h_h2d, whole_share, gather, len(c.layers))


def static_state(c: Ctx, o: Options) -> StaticState:
    """Per rank: 16-bit parameters and the fp32 main-grad buffer of the whole model on the GPU;
    fp32 master and moments of the GPU share on the GPU; of the CPU share, fp32 master and
    gradient copies (pinned unless ``pin_cpu_*`` is off) and the moments (pageable, torch state)."""
    cfg, sz = c.cfg, c.sz
    pr = cfg.workload.precision
    master_b, grad_b = DTYPE_BYTES[pr.master_params], DTYPE_BYTES[pr.optimizer_grads]
    cpu = cpu_share_params(c, o)
    gpu = sz.local_params - cpu

    def host(pinned: bool) -> Tier:
        return Tier.HOST_PINNED if pinned else Tier.HOST_PAGEABLE

    items = (
        StaticItem(Tier.GPU, whole(cfg.hardware.gpu.reserved_bytes), "reserved (CUDA context, allocator)",
                   TensorKind.RESERVED),
        StaticItem(Tier.GPU, whole(sz.param_bytes), "params (16-bit)", TensorKind.PARAM16),
        StaticItem(Tier.GPU, whole(sz.params_total * grad_b), "main-grad buffer (fp32)", TensorKind.GRAD_OPT),
        StaticItem(Tier.GPU, whole(gpu * sz.optimizer_bytes_per_param), "optimizer state of the GPU share",
                   TensorKind.OPT_STATE),
        StaticItem(host(o.pin_cpu_params), whole(cpu * master_b), "fp32 master of the CPU share", TensorKind.OPT_STATE),
        StaticItem(host(o.pin_cpu_grads), whole(cpu * grad_b), "fp32 gradient copy of the CPU share",
                   TensorKind.GRAD_OPT),
        StaticItem(Tier.HOST_PAGEABLE, whole(cpu * (sz.optimizer_bytes_per_param - master_b)),
                   "AdamW moments of the CPU share (torch state)", TensorKind.OPT_STATE),
    )
    return StaticState(tuple(i for i in items if i.nbytes != 0), 0)


def offloaded_activations(c: Ctx, o: Options) -> Ctx:
    """``c`` with the first ``activation_offload_layers`` blocks' saved activations in host memory
    (pinned with the strategy's ``pin_memory``, as TE's buffers are; TE's CPU offload context).
    Megatron refuses it with recomputation (``TransformerConfig.__post_init__``), and so does this."""
    n = o.activation_offload_layers
    if n == 0:
        return c
    blocks = [lay.index for lay in c.layers if lay.is_block]
    if n > len(blocks):
        raise ConfigError(f"strategy '{c.st.name}': activation_offload_layers {n} is more than the "
                          f"{len(blocks)} transformer blocks of workload '{c.cfg.workload.name}'")
    if c.cfg.activation_checkpointing:  # transformer_config.py: "CPU offloading does not work when ..."
        raise ConfigError(f"strategy '{c.st.name}': activation_offload_layers {n} with activation checkpointing "
                          f"(workload '{c.cfg.workload.name}'): Megatron refuses CPU offloading with recomputation; "
                          "set activation_checkpointing: false in the strategy")
    chosen = set(blocks[:n])
    offloads = tuple(lay.index in chosen for lay in c.layers)
    tiers = tuple(c.host if off else t for off, t in zip(offloads, c.act_tier, strict=True))
    return replace(c, offloads=offloads, act_tier=tiers)


def compose(cfg: RunConfig, sz: StateSizes | None = None) -> System:
    """The standard mechanisms with every state on the GPU, the hybrid optimizer and its static
    state in place of the GPU optimizer's, and the first blocks' activations offloaded."""
    o = read_options(cfg.strategy, Options)
    c = offloaded_activations(build_ctx(cfg, sz), o)
    system = standard(c)
    mechs = {**system.mechanisms, "static": static_state(c, o), "optimizer": hybrid_optimizer(c, o)}
    return replace(system, mechanisms=mechs)  # type: ignore[arg-type]
