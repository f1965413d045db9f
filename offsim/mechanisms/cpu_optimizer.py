"""The CPU optimizer step, per sub-group, after backward.

Sub-groups are visited in the order policy's order for the iteration. Each one: its state comes
into host memory (read from NVMe into a pinned swap buffer, or through the DRAM cache over
NVMe-resident state: a policy-managed cache ``dram_optimizer`` whose misses read and whose dirty
victims write back), CPU Adam updates it (bound by the CPU's params/s and by DRAM), its state goes
back to NVMe, and its updated 16-bit parameters go home (H2D, then an all-gather for ZeRO-1/2;
or an NVMe write). On DeepSpeed ZeRO-3 the step's thread waits for that upload or write before
the sub-group's state goes back and the next sub-group starts (``GroupIO.home_blocks``:
``stage3.py::_reassign_or_swap_out_fp16_params``). With ``pipeline`` the next sub-group's read
and the previous one's write overlap the current update (DeepSpeed ``pipeline_read``/
``pipeline_write``). Beside the loop the GPU may update a resident share (Twin-Flow).
DeepSpeed's first step creates each sub-group's moments as pageable tensors, freed once swapped
out; its fp16 overflow check allocates temporaries first.

Deep Optimizer States (``split``) streams some sub-groups through the GPU instead: their fp32
state and gradient go H2D into one of a few GPU buffers, GPU Adam updates them, the state goes
back D2H, while the CPU updates the others. Which ones is decided when the step starts (a
:class:`~offsim.schedule.ops.Choose`: the option is (sub-groups on the GPU, buffers), spread
through the iteration's order by :func:`~offsim.plan.optimizer_split.interleave`).

The step runs on its own CPU stream (``cpu_step``): the compute stream waits for it at the
iteration end, or, with the delayed parameter update (ZeRO-Offload DPU), only for the previous
step, so that the step overlaps the next iteration's forward and backward.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import cast

from offsim.core.enums import Activity, CacheId, ChoiceId, MechanismId, Phase, StreamKind, TensorKind, Tier
from offsim.core.window import MeasureWindow
from offsim.mechanisms.base import (
    BlockBuilder,
    Moment,
    Need,
    Setup,
    Site,
    SiteKind,
    Stage,
    StorageIO,
    io_pools,
    parallel,
    tag,
)
from offsim.mechanisms.compute import COMPUTE
from offsim.mechanisms.grads import grad_home
from offsim.plan.optimizer_split import interleave
from offsim.schedule.ops import (
    Access,
    Alloc,
    Block,
    CacheSpec,
    ChoiceSpec,
    Choose,
    Delay,
    Done,
    Flow,
    Free,
    Join,
    Ready,
    StreamSpec,
    Tag,
    TensorRef,
    Wait,
)

STEP = "cpu_step"
STEP_DONE = TensorRef(TensorKind.OPT_STATE, unit=-1, group=-2)  # written when a step ends


@dataclass(frozen=True)
class GroupIO:
    """One sub-group's step: the flows in order and the host bytes held meanwhile.

    Attributes:
        adam: CPU Adam over the sub-group.
        swap_in / swap_out: its state from / to NVMe (or the PFS); None when it stays in DRAM.
        grads_in: its gradients from NVMe (None when they are in DRAM).
        swap_buffer_bytes: pinned bytes its swap holds while in flight (0 on DeepSpeed's pool).
        grads_buffer_bytes: pinned bytes its gradient read holds (DRAM-cache path).
        first_step_bytes: pageable moments the first step creates (DeepSpeed), freed at swap-out.
        params_home: its 16-bit parameters going home, then ``gather`` (ZeRO-1/2 all-gather).
        before_adam / after_adam: host passes in order on the step's thread around Adam
            (DeepSpeed: ``unscale_and_clip_grads`` before, the fp32 -> 16-bit cast after;
            :func:`offsim.plan.cpu_adam.step_passes`).
        home_blocks: the step's thread waits for ``params_home`` right after the cast, before the
            sub-group's state is swapped out and the next sub-group starts (DeepSpeed ZeRO-3,
            ``stage3.py::_reassign_or_swap_out_fp16_params``: a blocking ``copy_`` into the GPU's
            16-bit partition, or ``_partitioned_params_swap_out``'s synchronous NVMe write); False:
            the upload runs beside the step (ZeRO-1/2's non_blocking H2D).
        home_gpu_bytes: GPU bytes the blocking upload lands in before a GPU cast, held while it
            runs (ZeRO-1/2 v0.14.1-v0.16.9: ``.to(gpu)`` of the fp32 partition; 0: none).
    """

    adam: Flow
    swap_in: StorageIO | None = None
    swap_out: StorageIO | None = None
    grads_in: StorageIO | None = None
    swap_buffer_bytes: int = 0
    grads_buffer_bytes: int = 0
    first_step_bytes: int = 0
    params_home: Flow | None = None
    gather: Flow | None = None
    before_adam: tuple[Flow, ...] = ()
    after_adam: tuple[Flow, ...] = ()
    home_blocks: bool = False
    home_gpu_bytes: int = 0


@dataclass(frozen=True)
class StreamedGroup:
    """One sub-group's round trip through the GPU (Deep Optimizer States).

    Attributes:
        buffer_bytes: GPU bytes its fp32 state and gradient take while there.
        to_gpu: the H2D copy of state and gradient.
        adam_s: GPU Adam over it (HBM-bound), seconds.
        to_host: the D2H copy of the updated state (and of the 16-bit parameters when they
            live on the host).
        gather: ZeRO-1/2's all-gather of its updated parameters (None: none).
    """

    buffer_bytes: int
    to_gpu: Flow
    adam_s: float
    to_host: Flow
    gather: Flow | None = None


@dataclass(frozen=True)
class GpuSplit:
    """The sub-groups a step may stream through the GPU; the option (sub-groups on the GPU,
    GPU buffers) is chosen when the step starts (``default`` without a policy)."""

    groups: tuple[StreamedGroup, ...]
    default: tuple[int, int] = (0, 0)


@dataclass(frozen=True)
class CpuOptimizer:
    """The after-backward CPU step.

    Attributes:
        groups: per sub-group, its flows.
        orders: the order policy's traversal, per iteration.
        pipeline: overlap reads and writes with updates.
        dram_cache: the DRAM cache over NVMe state (capacity, unit bytes, write-back flows).
        overflow_check_bytes: DeepSpeed's fp16 overflow-check temporaries (pageable).
        resident_s: Twin-Flow's GPU Adam over the GPU-resident share (0: none), then
            ``resident_gather``.
        delayed: the delayed parameter update (the step overlaps the next iteration).
        n_layers: layers whose gradients the step waits for.
        on_storage: the state lives on NVMe (or the PFS): waits for it count against the DRAM
            optimizer cache.
        storage_cache: without a DRAM cache, a zero-capacity one that counts every sub-group's
            read and write-back (DeepSpeed reads and writes all of them every step).
        split: sub-groups the step may stream through the GPU (None: all on the CPU).
        overflow_scan: DeepSpeed ZeRO-3's fp16 overflow check, the isinf and isnan scans of the
            host gradient accumulator on the step's thread before any sub-group (``stage3.py::
            step`` -> ``_overflow_check_and_loss_scale_update`` -> ``has_overflow``), while its
            temporaries (``overflow_check_bytes``) are alive; None: no check (bf16).
    """

    groups: tuple[GroupIO, ...]
    orders: tuple[tuple[int, ...], ...]
    pipeline: bool
    n_layers: int
    dram_cache: CacheSpec | None = None
    overflow_check_bytes: int = 0
    resident_s: float = 0.0
    resident_gather: Flow | None = None
    delayed: bool = False
    on_storage: bool = False
    storage_cache: CacheSpec | None = None
    io_concurrency: int | None = None
    split: GpuSplit | None = None
    overflow_scan: Flow | None = None
    id: MechanismId = MechanismId.CPU_OPTIMIZER
    _programs: dict[tuple[Hashable, Hashable], Block] = field(default_factory=dict, compare=False, repr=False)

    def setup(self) -> Setup:
        streams: tuple[StreamSpec, ...] = (StreamSpec(STEP, StreamKind.CPU),
                                           StreamSpec("gpu_opt", StreamKind.GPU_COMPUTE, in_order=False))
        caches = tuple(c for c in (self.dram_cache, self.storage_cache) if c is not None)
        choices: tuple[ChoiceSpec, ...] = ()
        if self.split is not None:
            streams += (StreamSpec("opt_h2d", StreamKind.COPY, in_order=False),
                        StreamSpec("opt_d2h", StreamKind.COPY, in_order=False))
            choices = (ChoiceSpec(ChoiceId.OPTIMIZER_SPLIT, self.split.default, self.split_program),)
        return Setup(streams=streams, pools=io_pools(self.io_concurrency), caches=caches, choices=choices)

    def measure_window(self) -> MeasureWindow:
        """With the delayed parameter update (ZeRO-Offload, arXiv 2101.06840 Sec. 4.3) a step
        overlaps the next iteration: the first measured iteration needs a step before it, and the
        last step has no iteration after it, so it is left out."""
        if not self.delayed:
            return MeasureWindow()
        return MeasureWindow(lead=1, tail=1, why="the delayed parameter update overlaps each step with the next "
                                                 "iteration, so the first and the last are not measured")

    def footprint(self) -> tuple[Need, ...]:
        """Pinned buffers of the sub-groups in flight (3 pipelined: reading, updating, writing;
        else 1), the DRAM cache's budget, and the host transients of a step: the overflow check's
        temporaries at its start, the moments the first step creates per sub-group in flight.
        With the GPU split, the streamed sub-groups take what the GPU has free (elastic)."""
        in_flight = 3 if self.pipeline else 1
        largest = {f: max((getattr(io, f) for io in self.groups), default=0)
                   for f in ("swap_buffer_bytes", "grads_buffer_bytes", "first_step_bytes")}
        needs = [Need(Tier.HOST_PINNED, "optimizer swap buffers", in_flight * largest["swap_buffer_bytes"]),
                 Need(Tier.HOST_PINNED, "sub-group gradient buffers of the DRAM cache",
                      in_flight * largest["grads_buffer_bytes"]),
                 Need(Tier.HOST_PAGEABLE, "transient peak at a step (overflow check)", self.overflow_check_bytes,
                      Moment.STEP_START),
                 Need(Tier.HOST_PAGEABLE, "transient peak at the first step (optimizer moments created)",
                      in_flight * largest["first_step_bytes"], Moment.FIRST_STEP)]
        if self.dram_cache is not None and self.dram_cache.capacity_bytes is not None:
            needs.append(Need(self.dram_cache.tier, "DRAM cache of optimizer state", self.dram_cache.capacity_bytes))
        upload = max((io.home_gpu_bytes for io in self.groups), default=0)
        if upload:
            # with the delayed parameter update the step overlaps the next forward and backward:
            # the upload meets their activations (held, not a moment of its own)
            needs.append(Need(Tier.GPU, "fp32 partition uploaded before its GPU cast", upload,
                              None if self.delayed else Moment.STEP))
        if self.split is not None and self.split.groups:
            unit = max(s.buffer_bytes for s in self.split.groups)
            needs.append(Need(Tier.GPU, "optimizer sub-groups streamed to the GPU", in_flight * unit, unit_bytes=unit))
        return tuple(needs)

    def _t(self, activity: Activity, group: int = -1, label: str = "") -> Tag:
        return tag(activity, self.id, Phase.OPTIMIZER, group=group, label=label)

    def emit(self, b: BlockBuilder, site: Site, stage: Stage) -> None:
        if site.what is not SiteKind.STEP or stage is not Stage.RUN:
            return
        grads = tuple(grad_home(u) for u in range(self.n_layers))
        if self.delayed:  # the compute stream waits only for the previous step: a GPU stall too
            b.add(Join(), self._t(Activity.OPTIMIZER, label="waits for the previous step"), COMPUTE,
                  reads=(STEP_DONE,), stall=Wait("the previous optimizer step"))
        start = b.add(Join(), self._t(Activity.OPTIMIZER, label="gradients home"), STEP, reads=grads)
        tmp = TensorRef(TensorKind.WORKSPACE, group=-3)
        if self.overflow_check_bytes:
            b.add(Alloc(Tier.HOST_PAGEABLE, self.overflow_check_bytes, tmp), self._t(Activity.OPTIMIZER), STEP)
        if self.overflow_scan is not None:
            start = b.add(self.overflow_scan, self._t(Activity.OPTIMIZER, label="fp16 overflow check (isinf, isnan)"),
                          STEP)
        if self.overflow_check_bytes:
            start = b.add(Free(Tier.HOST_PAGEABLE, tmp), self._t(Activity.OPTIMIZER), STEP)
        side = self._resident(b, start)
        k = site.iteration % len(self.orders)
        if self.split is None:
            ends = self._groups(b, self.orders[k], site.first_iteration)
        else:
            ends = [b.add(Choose(ChoiceId.OPTIMIZER_SPLIT, (k, site.first_iteration)),
                          self._t(Activity.OPTIMIZER, label="sub-groups split between the GPU and the CPU"), STEP)]
        end = b.add(Join(), self._t(Activity.OPTIMIZER, label="step done"), STEP, after=[*side, *ends],
                    writes=(STEP_DONE,))
        if not self.delayed:
            b.add(Join(), self._t(Activity.OPTIMIZER, label="waits for the step"), COMPUTE, after=[end],
                  stall=Wait("the optimizer step"))  # a GPU stall like every other wait of the compute stream

    def _resident(self, b: BlockBuilder, start: int) -> list[int]:
        if self.resident_s <= 0:
            return []
        last = b.add(Delay(self.resident_s), self._t(Activity.OPTIMIZER, label="GPU Adam (GPU-resident share)"),
                     "gpu_opt", after=[start])
        if self.resident_gather is not None:
            last = b.add(self.resident_gather, self._t(Activity.PARAM_GATHER), after=[last])
        return [last]

    def split_program(self, variant: Hashable, option: Hashable) -> Block:
        """The step's sub-groups with ``option`` = (sub-groups on the GPU, GPU buffers), spread
        through the order of ``variant`` = (order index, first iteration)."""
        key = (variant, option)
        if key not in self._programs:
            k, first = cast(tuple[int, bool], variant)
            n_gpu, buffers = cast(tuple[int, int], option)
            order = self.orders[k]
            on_gpu = interleave(list(order), n_gpu)
            b = BlockBuilder(f"optimizer step, {n_gpu} of {len(order)} sub-groups on the GPU")
            b.add(Join(), self._t(Activity.OPTIMIZER, label=f"{n_gpu} sub-groups go to the GPU"), STEP)
            self._streamed(b, [g for g in order if g in on_gpu], buffers)
            self._groups(b, tuple(g for g in order if g not in on_gpu), first)
            self._programs[key] = b.build()
        return self._programs[key]

    def _streamed(self, b: BlockBuilder, groups: list[int], buffers: int) -> None:
        """Each sub-group through the GPU, at most ``buffers`` at once: the j-th takes the
        buffer the (j - buffers)-th frees (they finish in order: every stage is a FIFO queue)."""
        assert self.split is not None
        frees: list[int] = []
        for j, g in enumerate(groups):
            s, there = self.split.groups[g], _gpu_buffer(g)
            t_in, t_out = self._t(Activity.OPT_H2D, g), self._t(Activity.OPT_D2H, g)
            free_buffer = frees[j - buffers] if j >= buffers else 0
            last = b.add(Alloc(Tier.GPU, s.buffer_bytes, there), t_in, after=[free_buffer])
            last = b.add(s.to_gpu, t_in, "opt_h2d", after=[last])
            last = b.add(Delay(s.adam_s), self._t(Activity.OPTIMIZER, g, f"GPU Adam sub-group {g}"), "gpu_opt",
                         after=[last])
            last = b.add(s.to_host, t_out, "opt_d2h", after=[last])
            frees.append(b.add(Free(Tier.GPU, there), t_out, after=[last]))
            if s.gather is not None:
                b.add(s.gather, self._t(Activity.PARAM_GATHER, g), after=[frees[-1]])

    def _groups(self, b: BlockBuilder, order: tuple[int, ...], first: bool) -> list[int]:
        """The sub-group loop; returns the ids the step's end waits for."""
        if not order:
            return []
        writes: list[int] = []
        reading = self._read(b, order[0], first, after=[b.last_on(STEP) or 0])
        for k, g in enumerate(order):
            stall = Wait("the sub-group's state", CacheId.DRAM_OPTIMIZER) if self.on_storage else None
            got = b.add(Join(), self._t(Activity.OPT_SWAP_IN, g, "waits for the sub-group's state"), STEP,
                        after=[reading], stall=stall)
            if self.pipeline and k + 1 < len(order):
                reading = self._read(b, order[k + 1], first, after=[got])
            adam = self._step_group(b, g)
            if self.pipeline and writes and self.groups[g].swap_out is not None and self.dram_cache is None:
                # pipelined_optimizer_swapper.py swap_out_optimizer_state: the previous sub-group's
                # async write completes (_complete_swap_out(ASYNC_SWAP_OUT)) before this one starts
                adam = b.add(Join(), self._t(Activity.OPT_SWAP_OUT, g, "waits for the previous sub-group's write"),
                             STEP, after=[writes[-1]])
            write = self._write(b, g, first, after=[adam])
            if self.pipeline:
                writes.append(write)
            else:
                wait = b.add(Join(), self._t(Activity.OPT_SWAP_OUT, g), STEP, after=[write])
                if k + 1 < len(order):
                    reading = self._read(b, order[k + 1], first, after=[wait])
        return writes

    def _step_group(self, b: BlockBuilder, g: int) -> int:
        """Sub-group ``g``'s host passes and CPU Adam, in order on the step's thread."""
        io = self.groups[g]
        for flow in io.before_adam:
            b.add(flow, self._t(Activity.OPTIMIZER, g, f"unscale gradients, sub-group {g}"), STEP)
        last = b.add(io.adam, self._t(Activity.OPTIMIZER, g, f"CPU Adam sub-group {g}"), STEP)
        for flow in io.after_adam:
            last = b.add(flow, self._t(Activity.OPTIMIZER, g, f"cast to 16-bit, sub-group {g}"), STEP)
        if io.home_blocks and io.params_home is not None:
            t = self._t(Activity.PARAM_UPDATE, g)
            if io.home_gpu_bytes:
                b.add(Alloc(Tier.GPU, io.home_gpu_bytes, _upload_buffer(g)), t, STEP)
            last = b.add(io.params_home, t, STEP)
            if io.home_gpu_bytes:
                last = b.add(Free(Tier.GPU, _upload_buffer(g)), t, STEP)
        return last

    def _read(self, b: BlockBuilder, g: int, first: bool, after: list[int]) -> int:
        io = self.groups[g]
        last = b.add(Join(), self._t(Activity.OPT_SWAP_IN, g), after=after)
        if io.swap_in is None and io.grads_in is None and self.dram_cache is None:
            return last
        if first and io.first_step_bytes:
            last = b.add(Alloc(Tier.HOST_PAGEABLE, io.first_step_bytes, _moments(g)), self._t(Activity.OPT_SWAP_IN, g),
                         after=[last])
        t = self._t(Activity.OPT_SWAP_IN, g)
        if self.storage_cache is not None:
            last = b.add(Access(CacheId.DRAM_OPTIMIZER, g), t, after=[last])
        if self.dram_cache is not None:
            last = b.add(Access(CacheId.DRAM_OPTIMIZER, g), t, after=[last])
            last = b.add(Ready(CacheId.DRAM_OPTIMIZER, g), t, after=[last])
            if io.grads_in is not None:
                last = b.add(Alloc(Tier.HOST_PINNED, io.grads_buffer_bytes, _grads_buffer(g)), t, after=[last])
                last = parallel(b, io.grads_in, t, [last])
            return last
        last = b.add(Alloc(Tier.HOST_PINNED, io.swap_buffer_bytes, _swap_buffer(g)), t, after=[last])
        if io.swap_in is not None:
            last = parallel(b, io.swap_in, t, [last])
        if io.grads_in is not None:
            last = parallel(b, io.grads_in, t, [last])
        return last

    def _write(self, b: BlockBuilder, g: int, first: bool, after: list[int]) -> int:
        io = self.groups[g]
        t = self._t(Activity.OPT_SWAP_OUT, g)
        last = b.add(Join(), t, after=after)
        staged = io.swap_in is not None or io.grads_in is not None
        if self.dram_cache is not None:
            if io.grads_in is not None:
                last = b.add(Free(Tier.HOST_PINNED, _grads_buffer(g)), t, after=[last])
            last = b.add(Done(CacheId.DRAM_OPTIMIZER, g), t, after=[last])
        else:
            if io.swap_out is not None:
                last = parallel(b, io.swap_out, t, [last])
            if staged:
                last = b.add(Free(Tier.HOST_PINNED, _swap_buffer(g)), t, after=[last])
            if self.storage_cache is not None:
                last = b.add(Done(CacheId.DRAM_OPTIMIZER, g), t, after=[last])
        if (staged or self.dram_cache is not None) and first and io.first_step_bytes:
            last = b.add(Free(Tier.HOST_PAGEABLE, _moments(g)), t, after=[last])
        home = self._t(Activity.PARAM_UPDATE, g)
        if io.params_home is not None and not io.home_blocks:
            last = b.add(io.params_home, home, after=[last])
        if io.gather is not None:
            last = b.add(io.gather, self._t(Activity.PARAM_GATHER, g), after=[last])
        return last


def _moments(g: int) -> TensorRef:
    return TensorRef(TensorKind.OPT_STATE, group=g, mb=0)


def _gpu_buffer(g: int) -> TensorRef:
    return TensorRef(TensorKind.BUFFER, group=g, unit=-3)


def _upload_buffer(g: int) -> TensorRef:
    return TensorRef(TensorKind.BUFFER, group=g, unit=-4)


def _swap_buffer(g: int) -> TensorRef:
    return TensorRef(TensorKind.BUFFER, group=g)


def _grads_buffer(g: int) -> TensorRef:
    return TensorRef(TensorKind.BUFFER, group=g, unit=-2)


def dram_cache_programs(state_bytes: dict[int, int], tier: Tier, swap_in: dict[int, StorageIO],
                        swap_out: dict[int, StorageIO]) -> tuple[dict[int, Block], dict[int, Block]]:
    """Fetch (hold, read) and evict (write back, free) programs of the DRAM optimizer cache."""
    fetch, evict = {}, {}
    for g, nbytes in state_bytes.items():
        state = TensorRef(TensorKind.OPT_STATE, group=g)
        b = BlockBuilder(f"sub-group {g} into the DRAM cache")
        t = tag(Activity.OPT_SWAP_IN, MechanismId.CPU_OPTIMIZER, Phase.OPTIMIZER, group=g)
        parallel(b, swap_in[g], t, [b.add(Alloc(tier, nbytes, state), t)])
        fetch[g] = b.build()
        b = BlockBuilder(f"sub-group {g} written back")
        t = tag(Activity.OPT_SWAP_OUT, MechanismId.CPU_OPTIMIZER, Phase.OPTIMIZER, group=g)
        b.add(Free(tier, state), t, after=[parallel(b, swap_out[g], t, [])])
        evict[g] = b.build()
    return fetch, evict


def storage_cache_spec(state_bytes: dict[int, int], tier: Tier) -> CacheSpec:
    """The zero-capacity DRAM optimizer cache of a step without one: every sub-group misses and
    is written back after its update; its bytes move in the sub-group's own flows, so the
    programs do nothing."""
    empty = {}
    for g in state_bytes:
        b = BlockBuilder(f"sub-group {g} read by the step")
        b.add(Join(), tag(Activity.OPT_SWAP_IN, MechanismId.CPU_OPTIMIZER, Phase.OPTIMIZER, group=g))
        empty[g] = b.build()
    return CacheSpec(CacheId.DRAM_OPTIMIZER, tier, 0, dict(state_bytes), empty, dict(empty), persistent=True,
                     writes_back=True)
