"""PyTorch FSDP2 with CPU offload: ``fully_shard(module, offload_policy=CPUOffloadPolicy())``
(``torch/distributed/fsdp/_fully_shard/``; ``../shared/reference/new_systems.md`` section 5).

What moves, per FSDP unit (offsim: per layer) and rank, for an element of the rank's shard:

* The sharded parameters stay in host memory in their original dtype (the workload's
  ``master_params``, fp32), pinned when ``pin_memory`` (``CPUOffloadPolicy(pin_memory=True)``,
  ``_fsdp_api.py``). Before the unit's forward, and again before its backward when it was resharded
  after forward, the shard is copied up in that dtype (4 B), cast to ``param_dtype`` (the
  workload's ``params``) on the GPU and all-gathered (``_fsdp_param.py`` ``all_gather_inputs``,
  ``_fsdp_collectives.py`` ``foreach_all_gather``). ``reshard_after_forward`` is the strategy's
  ``reuse_distance_params``: 0 frees the unit after forward (FSDP2's default for non-root modules);
  at least the model's parameters keeps it gathered until backward (``False``; with gradient
  accumulation also from one micro-batch to the next, which FSDP2 does not: see :func:`notes`).
* After the unit's backward the gradient is reduce-scattered in ``reduce_dtype`` (the workload's
  ``grads``), cast to the original dtype on the GPU and copied down into pinned memory (4 B)
  (``_fsdp_collectives.py`` ``foreach_reduce``). When a gradient is already there (accumulation
  with gradient sync on every micro-batch), or without pinned memory, the copy is blocking
  (``non_blocking = pin_memory and not to_accumulate_grad``) and the add runs on the CPU (read
  both, write one: 3 x 4 B): the host thread, which launches the GPU's work, waits for it.
* At the end of backward the host waits for every copy; then PyTorch's optimizer steps on the
  CPU (:class:`TorchCpuAdam`: DRAM bytes per element derived from ``torch/optim/adam.py``;
  no DeepSpeed CPU Adam), with ``clip_grad_norm_`` before it when clipping is on. The updated
  parameters are the host shards themselves: nothing is copied back after the step.

Host memory per element of the shard: 4 B parameter (pinned), 4 B gradient (pinned), the
moments (2 x 4 B, ``torch.zeros_like``: pageable): 16 B (new_systems.md section 5, "Memory").

Not modelled (each noted with its size where it matters): the GPU casts (fp32 -> param dtype
before the all-gather, reduce dtype -> fp32 before the copy down: 6 B of HBM traffic per shard
element, about 1/500 of the copies' time on PCIe 4); the fp32 shard's GPU copy before its cast
(freed after the cast); the root module (embeddings, final norm, head) kept gathered after
forward (offsim keeps the last layer, used again at once, and gathers the embedding again); PyTorch's
CachingHostAllocator rounding each pinned tensor up to a power of two; the gloo all-reduce of the
clipping norm (one scalar per tensor).

Shared knobs it reads: ``pin_memory``, ``reuse_distance_params`` (above), ``prefetch_depth``
(FSDP2 prefetches the next unit in backward; in forward the CPU runs ahead), the placement of
activations and the activation policy. Its own knobs are :class:`Options`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from pydantic import Field

from offsim.config.base import Frozen
from offsim.config.run import RunConfig
from offsim.config.workload import DTYPE_BYTES
from offsim.core.enums import Activity, Phase, TensorKind, Tier
from offsim.mechanisms.base import BlockBuilder, Site, SiteKind, Stage, tag
from offsim.mechanisms.cpu_optimizer import STEP, CpuOptimizer, GroupIO
from offsim.mechanisms.grads import Grads, LayerGrads, grad_home
from offsim.mechanisms.param_fetch import LayerFetch, ParamFetch
from offsim.mechanisms.static_state import StaticItem, StaticState
from offsim.plan.footprint import StateSizes
from offsim.plan.torch_cpu import AdamImpl, TorchPass, adam_passes, clip_passes, torch_pass_flow
from offsim.schedule.ops import Flow, Join
from offsim.systems._compile import System
from offsim.systems._options import read_options
from offsim.systems._parts import (
    BACKWARD_ORDER,
    FORWARD_ORDER,
    Ctx,
    activations,
    build_ctx,
    compute,
    fixed_param_budget_bytes,
    whole,
    within_budget,
)

OPTIONS: frozenset[str] = frozenset(())


class Options(Frozen):
    """The knobs of FSDP2's CPU offload offsim models beyond the shared strategy fields.

    Attributes:
        optimizer: the torch Adam implementation (:class:`AdamImpl`).
        weight_decay: a non-zero weight decay (one more pass in the loop: AdamW's
            ``param.mul_``, or Adam's ``grad.add(param)``); Hugging Face's ``TrainingArguments``
            default is 0.0.
        clip_grad_norm: ``clip_grad_norm_`` over the CPU gradients before the step (Hugging Face's
            ``max_grad_norm`` default 1.0 clips).
        threads_per_rank: intra-op threads of each rank's process (None: as ``torchrun``
            leaves them, :func:`launched_threads`: 1 with several processes per node, else the
            node's cores).
    """

    optimizer: AdamImpl = Field(default=AdamImpl.FOR_LOOP, strict=False)
    weight_decay: bool = False
    clip_grad_norm: bool = True
    threads_per_rank: int | None = Field(default=None, ge=1)


#: ``OMP_NUM_THREADS`` torchrun gives every process when it starts several per node and the user
#: set none: pytorch/pytorch @ 010929fd3f ``torch/distributed/run.py`` ``config_from_args``
#: (``if "OMP_NUM_THREADS" not in os.environ and nproc_per_node > 1``: 1, "to avoid your system
#: being overloaded"); with one process it sets nothing and torch uses the node's cores.
TORCHRUN_THREADS_PER_RANK = 1


def launched_threads(ranks_per_node: int, threads_per_rank: int | None) -> int | None:
    """Each rank's intra-op threads: the strategy's ``threads_per_rank`` when set, else torchrun's
    default (:data:`TORCHRUN_THREADS_PER_RANK` with several ranks per node, None with one: the
    node's cores, :func:`offsim.plan.cpu_adam.rank_threads`)."""
    if threads_per_rank is not None:
        return threads_per_rank
    return TORCHRUN_THREADS_PER_RANK if ranks_per_node > 1 else None


# ------------------------------------------------------------------ the CPU step's DRAM bytes
def torch_step_flow(c: Ctx, params: float, passes: tuple[TorchPass, ...]) -> Flow:
    """The passes over ``params`` elements as one flow (:func:`offsim.plan.torch_cpu.torch_pass_flow`:
    torch's CPU code priced alike in every system; its assumption is stated there), on the rank's
    threads (:func:`launched_threads`)."""
    opts = read_options(c.st, Options)
    threads = launched_threads(c.sz.ranks_per_node, opts.threads_per_rank)
    return torch_pass_flow(c.cfg.hardware, c.sz.ranks_per_node, threads, params, passes)


# ------------------------------------------------------------------ mechanisms of this system
@dataclass(frozen=True)
class FsdpGrads(Grads):
    """FSDP2's gradient path: reduce-scatter, copy down (``d2h``), then, from the second
    micro-batch on, the add into the host gradient (``accumulate``) with the copy blocking the
    host (the compute stream waits for both); without pinned memory every copy blocks. The first
    micro-batch's copy writes the host gradient itself (no host pass)."""

    blocking_always: bool = False

    def _offload(self, b: BlockBuilder, site: Site, g: LayerGrads) -> None:
        blocking = self.blocking_always or not site.first_mb
        Grads._offload(replace(self, overlap=not blocking), b, site, g)

    def _on_host(self, b: BlockBuilder, site: Site, g: LayerGrads, last: int) -> int:
        u = site.layer
        if site.first_mb or g.accumulate is None:
            return b.add(Join(), tag(Activity.GRAD_OFFLOAD, self.id, Phase.BACKWARD, u), after=[last],
                         writes=(grad_home(u),))
        return b.add(g.accumulate, tag(Activity.GRAD_ACCUMULATE, self.id, Phase.BACKWARD, u,
                                       label="CPU add into the host gradient"), "grad_host", after=[last],
                     writes=(grad_home(u),))


@dataclass(frozen=True)
class TorchCpuAdam(CpuOptimizer):
    """PyTorch's optimizer on the CPU after backward: one call over the whole shard (``clip``:
    ``clip_grad_norm_`` before it); the spans say which torch code ran."""

    label: str = "torch Adam (CPU)"

    def _step_group(self, b: BlockBuilder, g: int) -> int:
        io = self.groups[g]
        for flow in io.before_adam:
            b.add(flow, self._t(Activity.OPTIMIZER, g, "clip_grad_norm_ (CPU)"), STEP)
        return b.add(io.adam, self._t(Activity.OPTIMIZER, g, self.label), STEP)


# ------------------------------------------------------------------ builders
def _dtype_bytes(c: Ctx) -> tuple[float, float, float, float]:
    """Bytes per element of the original (sharded) dtype, param_dtype, reduce_dtype and a moment."""
    pr = c.cfg.workload.precision
    return (DTYPE_BYTES[pr.master_params], DTYPE_BYTES[pr.params], DTYPE_BYTES[pr.grads],
            DTYPE_BYTES[pr.optimizer_moments])


def param_fetch(c: Ctx) -> ParamFetch:
    """Per layer: the shard copied up in its original dtype, then the all-gather in param_dtype."""
    orig, param_dtype, _, _ = _dtype_bytes(c)
    out = []
    for lay in c.layers:
        shard = lay.params / c.sz.param_part
        gather = c.collective(lay.params * param_dtype, 1.0) if c.sz.param_part > 1 else None
        out.append(LayerFetch(whole(lay.params * param_dtype), None,
                              c.paths.dma(True, whole(shard * orig), c.st.pin_memory), gather))
    return within_budget(c, ParamFetch(tuple(out), None), fixed_param_budget_bytes(c.cfg))


def grads(c: Ctx) -> FsdpGrads:
    """Per layer: reduce-scatter in reduce_dtype, the shard's gradient down in the original
    dtype, the CPU add from the second micro-batch on."""
    orig, _, reduce_dtype, _ = _dtype_bytes(c)
    out = []
    for lay in c.layers:
        shard = lay.params / c.sz.grad_part
        full = lay.params * reduce_dtype
        out.append(LayerGrads(c.collective(full, 1.0), True, buffer_bytes=whole(full),
                              d2h=c.paths.dma(False, whole(shard * orig), c.st.pin_memory), host_tier=c.host,
                              accumulate=c.paths.host_copy(whole(3 * shard * orig))))
    return FsdpGrads(tuple(out), True, None, blocking_always=not c.st.pin_memory)


def optimizer(c: Ctx) -> TorchCpuAdam:
    """The CPU step over the rank's shard (one group), the implementation the options name."""
    opts = read_options(c.st, Options)
    orig, _, _, moment = _dtype_bytes(c)
    decoupled = c.cfg.workload.optimizer.kind == "adamw"
    adam = adam_passes(opts.optimizer, orig, moment, opts.weight_decay, decoupled)
    clip = (torch_step_flow(c, c.sz.local_params, clip_passes(orig)),) if opts.clip_grad_norm else ()
    io = GroupIO(torch_step_flow(c, c.sz.local_params, adam), before_adam=clip)
    label = f"torch {'AdamW' if decoupled else 'Adam'} (CPU, {opts.optimizer.value})"
    return TorchCpuAdam((io,), ((0,),), False, len(c.layers), label=label)


def static_state(c: Ctx) -> StaticState:
    """The CUDA reserve, then the host shards: parameters and gradients (pinned with
    ``pin_memory``) in the original dtype, the moments (pageable)."""
    orig, _, _, moment = _dtype_bytes(c)
    local = c.sz.local_params
    moments = local * c.cfg.workload.optimizer.moments * moment
    items = (StaticItem(Tier.GPU, whole(c.cfg.hardware.gpu.reserved_bytes), "reserved (CUDA context, allocator)",
                        TensorKind.RESERVED),
             StaticItem(c.host, whole(local * orig), "sharded params (original dtype)", TensorKind.OPT_STATE),
             StaticItem(c.host, whole(local * orig), "sharded grads (original dtype)", TensorKind.GRAD_OPT),
             StaticItem(Tier.HOST_PAGEABLE, whole(moments), "optimizer moments (torch.zeros_like)",
                        TensorKind.OPT_STATE))
    return StaticState(tuple(i for i in items if i.nbytes > 0), 0)


def compose(cfg: RunConfig, sz: StateSizes | None = None) -> System:
    """FSDP2's mechanisms in the standard order (:data:`~offsim.systems._parts.FORWARD_ORDER`,
    :data:`~offsim.systems._parts.BACKWARD_ORDER`), the step synchronous after backward."""
    c = build_ctx(cfg, sz)
    read_options(c.st, Options)
    mechs = {"static": static_state(c), "compute": compute(c), "activations": activations(c), "grads": grads(c),
             "optimizer": optimizer(c), "params": param_fetch(c)}
    sites = {SiteKind.INIT: (("static", Stage.RUN),), SiteKind.FORWARD: FORWARD_ORDER,
             SiteKind.BACKWARD: BACKWARD_ORDER, SiteKind.ITERATION_END: (("params", Stage.DONE),),
             SiteKind.STEP: (("optimizer", Stage.RUN),)}
    return System(mechs, sites, len(c.layers), cfg.workload.training.grad_accumulation,  # type: ignore[arg-type]
                  cfg.iterations, 1, notes(cfg), tuple(lay.name for lay in c.layers))


#: Said about the schedule when units stay gathered after forward and micro-batches accumulate.
KEPT_ACROSS_MICRO_BATCHES = (
    "reshard_after_forward=False (reuse_distance_params > 0) with gradient accumulation: the gathered units also "
    "stay from one micro-batch to the next, so each is copied up once per iteration; FSDP2 reshards every unit "
    "after its backward and copies it up again in each micro-batch's forward (H2D under-counted by the number "
    "of micro-batches)")


def notes(cfg: RunConfig) -> tuple[str, ...]:
    """What the schedule shown does not do as FSDP2 does (:data:`KEPT_ACROSS_MICRO_BATCHES`)."""
    kept = cfg.strategy.reuse_distance_params > 0 and cfg.workload.training.grad_accumulation > 1
    return (KEPT_ACROSS_MICRO_BATCHES,) if kept else ()

