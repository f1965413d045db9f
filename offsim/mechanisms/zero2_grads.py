"""DeepSpeed ZeRO-1/2 CPU offload's gradient path (ZeRO-Offload), as its source moves them.

After a bucket is reduced, ``reduce_ipg_grads`` calls ``copy_grads_in_partition`` for each owned
parameter on one CUDA stream: the compute stream when ``overlap_comm`` is false (the stage-1/2
default in every release, zero/constants.py then zero/config.py), else ``reduction_stream``
(stage2.py v0.3.x, stage_1_and_2.py since v0.5.9; deepspeed_runtime.md §4, §14.2):

* micro-batch k > 0: ``async_accumulate_grad_in_cpu_via_gpu`` copies the pinned 16-bit CPU
  accumulator up into ``temp_grad_buffer_for_gpu_offload`` (H2D, 2 B per element, non_blocking)
  and adds it to the gradient on the GPU;
* the 16-bit D2H of the sum into the accumulator, on the micro-batches
  :class:`~offsim.plan.deepspeed_versions.Z12AccumMode` says;
* the boundary: ``async_inplace_copy_grad_to_fp32_buffer_from_gpu`` casts the owned slice on the
  GPU (``.float()``) and copies it into the pinned fp32 gradient (D2H, 4 B per element).

Nothing of it is added on the host (no CPU accumulation pass). With ``overlap_comm`` false the
copies are kernels' neighbours on the compute stream, so backward waits for them; with it true the
compute stream waits for the reduction stream at the next bucket (v0.3.x ``average_tensor``:
``torch.cuda.synchronize()``; later ``current_stream().wait_stream(reduction_stream)``), so one
bucket's copies overlap the next bucket's backward; after the last bucket
``independent_gradient_partition_epilogue`` synchronizes, so backward ends with the last copies.
offsim's bucket is a layer.

GPU memory: the IPG bucket buffer(s) live only through backward (``setup_buckets``, v0.3.x
``backward``, makes them at backward's first gradient; ``independent_gradient_partition_epilogue``
-> ``_release_ipg_buffers`` drops them, every release from v0.3.16 to edaa72212), so the step,
which runs after the epilogue (engine.py ``step`` at the boundary), does not meet them;
``temp_grad_buffer_for_gpu_offload`` (the largest parameter, model dtype) is made once in
``DeepSpeedZeroOptimizer.__init__`` and held for the run (deepspeed_runtime.md §4).
"""

from __future__ import annotations

from dataclasses import dataclass

from offsim.core.enums import Activity, MechanismId, Phase, StreamKind, TensorKind, Tier
from offsim.mechanisms.base import BlockBuilder, Moment, Need, Setup, Site, SiteKind, Stage, tag
from offsim.mechanisms.compute import COMPUTE, grad16
from offsim.mechanisms.grads import grad_home
from offsim.plan.deepspeed_versions import Z12AccumMode
from offsim.schedule.ops import (
    CUR_MB,
    Acquire,
    Alloc,
    Delay,
    Flow,
    Free,
    Join,
    PoolSpec,
    Release,
    StreamSpec,
    TensorRef,
    Wait,
)

#: the stream ``copy_grads_in_partition`` runs on (the compute stream's neighbour when
#: ``overlap_comm`` is false: the mechanism then makes the compute stream wait for it)
Z12_STREAM = "z12_grads"
#: one bucket's copies in flight before the compute stream waits (``overlap_comm`` true)
Z12_INFLIGHT = "z12_inflight"
#: the IPG bucket buffer(s) (and the offload temporary, when not apart): allocated when backward
#: starts and freed at its end (stage2.py ``backward`` / stage_1_and_2.py ``setup_buckets`` make
#: ``ipg_buffer``; ``independent_gradient_partition_epilogue`` -> ``_release_ipg_buffers``)
IPG_BUFFERS = TensorRef(TensorKind.BUFFER, unit=-1, group=-2, mb=CUR_MB)
#: ``temp_grad_buffer_for_gpu_offload`` apart: allocated at start-up and never freed
#: (stage_1_and_2.py ``DeepSpeedZeroOptimizer.__init__``)
OFFLOAD_BUFFER = TensorRef(TensorKind.BUFFER, unit=-1, group=-3)
#: the footprint's items
IPG_WHAT = "ZeRO-2 IPG bucket buffer(s)"
OFFLOAD_WHAT = "ZeRO-2 offload gradient buffer (temp_grad_buffer_for_gpu_offload)"
BOTH_WHAT = "ZeRO-2 reduce bucket and offload buffer"


def lp_d2h_on(mode: Z12AccumMode, first_mb: bool, last_mb: bool) -> bool:
    """Whether micro-batch (``first_mb``, ``last_mb``) copies the 16-bit sum down
    (``async_accumulate_grad_in_cpu_via_gpu``; never with one micro-batch per step, which calls
    it not at all)."""
    if first_mb and last_mb:
        return False
    if mode is Z12AccumMode.D2H_EVERY_MB:
        return True
    if mode is Z12AccumMode.DROP_MIDDLE:
        return first_mb
    return not last_mb


@dataclass(frozen=True)
class Z12LayerGrads:
    """One layer's copies (bytes of this rank's owned elements): ``ipg_copy_s``, the compute
    stream's copy of each gradient into the IPG bucket (all of the layer's elements, read and
    written in 16 bits; ``reduce_independent_p_g_buckets_and_remove_grads`` with
    ``contiguous_gradients``, which offload forces on); ``reduce``, the data-parallel reduction
    (None: one rank); ``lp_h2d`` / ``lp_d2h``, the 16-bit accumulator up / down; ``gpu_add_s``,
    the GPU add of the accumulator; ``fp32_d2h``, the boundary's fp32 copy."""

    ipg_copy_s: float
    reduce: Flow | None
    lp_h2d: Flow
    lp_d2h: Flow
    gpu_add_s: float
    fp32_d2h: Flow


@dataclass(frozen=True)
class Zero2Grads:
    """DeepSpeed ZeRO-1/2 offload gradients per layer (module docstring); ``overlap``:
    ``overlap_comm``; ``accumulate``: more than one micro-batch per step; ``gpu_buffer_bytes``:
    the IPG bucket(s), allocated per backward, with ``temp_grad_buffer_for_gpu_offload`` when
    ``offload_buffer_bytes`` is None; ``accumulator_bytes``: the 16-bit CPU accumulators (whole
    owned parameters, created at the first micro-batch) in ``accumulator_tier``.

    ``offload_buffer_bytes`` (None: not apart, the whole of ``gpu_buffer_bytes`` is held through
    the step): ``temp_grad_buffer_for_gpu_offload`` apart, allocated at the start-up site
    (:data:`SiteKind.INIT`, stage RUN: the system's order must list the mechanism there) and held;
    the IPG bucket(s) are then held only through forward and backward
    (:data:`Moment.FORWARD_BACKWARD`), as the timeline frees them at the epilogue."""

    layers: tuple[Z12LayerGrads | None, ...]
    overlap: bool
    mode: Z12AccumMode
    gpu_buffer_bytes: int
    accumulator_bytes: int
    accumulator_tier: Tier = Tier.HOST_PINNED
    offload_buffer_bytes: int | None = None
    id: MechanismId = MechanismId.GRADS

    def setup(self) -> Setup:
        return Setup(streams=(StreamSpec(Z12_STREAM, StreamKind.COPY, in_order=True),),
                     pools=(PoolSpec(Z12_INFLIGHT, 1),))

    def footprint(self) -> tuple[Need, ...]:
        """The GPU buffers and, when accumulating, the pinned 16-bit accumulators: apart, the IPG
        bucket(s) through forward and backward (stage_1_and_2.py ``_release_ipg_buffers`` at the
        epilogue) and the offload buffer held; else both held (the step is counted as meeting
        them)."""
        acc = Need(self.accumulator_tier, "16-bit CPU gradient accumulator", self.accumulator_bytes)
        if self.offload_buffer_bytes is None:
            return (Need(Tier.GPU, BOTH_WHAT, self.gpu_buffer_bytes), acc)
        return (Need(Tier.GPU, IPG_WHAT, self.gpu_buffer_bytes, Moment.FORWARD_BACKWARD), acc,
                Need(Tier.GPU, OFFLOAD_WHAT, self.offload_buffer_bytes))

    def emit(self, b: BlockBuilder, site: Site, stage: Stage) -> None:
        if site.what is SiteKind.INIT and stage is Stage.RUN and self.offload_buffer_bytes:
            # DeepSpeedZeroOptimizer.__init__ (cpu_offload): torch.zeros(largest_param_numel) on the GPU
            b.add(Alloc(Tier.GPU, self.offload_buffer_bytes, OFFLOAD_BUFFER),
                  tag(Activity.HOST_SETUP, self.id, Phase.INIT, label=OFFLOAD_WHAT), "init")
            return
        if site.what is not SiteKind.BACKWARD or stage is not Stage.AFTER:
            return
        g = self.layers[site.layer]
        if g is None:
            return
        u = site.layer
        t = tag(Activity.GRAD_OFFLOAD, self.id, Phase.BACKWARD, u)
        if site.position == 0:
            b.add(Alloc(Tier.GPU, self.gpu_buffer_bytes, IPG_BUFFERS), t)
        b.add(Delay(g.ipg_copy_s), tag(Activity.GRAD_ACCUMULATE, self.id, Phase.BACKWARD, u,
                                       label="gradients copied into the IPG bucket"), COMPUTE)
        deps: list[int] = []
        if self.overlap:  # the compute stream waits for the previous bucket's copies
            deps.append(b.add(Acquire(Z12_INFLIGHT, 1), tag(
                Activity.GRAD_OFFLOAD, self.id, Phase.BACKWARD, u, label="waits for the previous bucket's copies"),
                COMPUTE, stall=Wait("the reduction stream (previous bucket)")))
        last = b.add(Join(), t, Z12_STREAM, after=deps, reads=(grad16(u),))
        last = self._copies(b, site, g, last)
        end = b.add(Join(), t, after=[last], writes=(grad_home(u),))
        if u == 0:  # the last layer of backward: the epilogue releases the buffers
            b.add(Free(Tier.GPU, IPG_BUFFERS), t, after=[end])
        if self.overlap:
            b.add(Release(Z12_INFLIGHT, 1), t, after=[end])
            if u == 0:  # independent_gradient_partition_epilogue: if overlap_comm, the host synchronizes
                # (stage2.py v0.3.x torch.cuda.synchronize / reduction_stream.synchronize;
                # stage_1_and_2.py get_accelerator().synchronize()), so backward ends with the last copies
                b.add(Join(), tag(Activity.GRAD_OFFLOAD, self.id, Phase.BACKWARD, u,
                                  label="waits for the reduction stream (end of backward)"), COMPUTE, after=[end],
                      stall=Wait("the reduction stream at the end of backward (epilogue synchronize)"))
        else:
            b.add(Join(), tag(Activity.GRAD_OFFLOAD, self.id, Phase.BACKWARD, u,
                              label="gradient copies on the compute stream"), COMPUTE, after=[end],
                  stall=Wait("gradient copies on the compute stream (overlap_comm false)"))

    def _copies(self, b: BlockBuilder, site: Site, g: Z12LayerGrads, last: int) -> int:
        """The reduction, then ``copy_grads_in_partition``'s copies in issue order."""
        u = site.layer
        t = tag(Activity.GRAD_OFFLOAD, self.id, Phase.BACKWARD, u)
        if g.reduce is not None:
            last = b.add(g.reduce, tag(Activity.GRAD_REDUCE, self.id, Phase.BACKWARD, u), Z12_STREAM, after=[last])
        if not site.first_mb:
            last = b.add(g.lp_h2d, t, Z12_STREAM, after=[last])
            last = b.add(Delay(g.gpu_add_s), tag(Activity.GRAD_ACCUMULATE, self.id, Phase.BACKWARD, u), Z12_STREAM,
                         after=[last])
        if lp_d2h_on(self.mode, site.first_mb, site.last_mb):
            last = b.add(g.lp_d2h, t, Z12_STREAM, after=[last])
        if site.last_mb:
            last = b.add(g.fp32_d2h, t, Z12_STREAM, after=[last])
        return last
