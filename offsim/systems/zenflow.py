"""DeepSpeed ZenFlow (Lan et al., arXiv 2505.12242; DeepSpeed ``deepspeed/runtime/zenflow/`` at
``edaa722126``): ZeRO-Offload (stage 1/2) whose CPU step is split by importance and made
asynchronous.

Per step (an offsim iteration is one ZenFlow step, ``engine.step()``; ZenFlow sets DeepSpeed's
``gradient_accumulation_steps`` to ``update_interval``, ``zenflow/engine.py:configure_zenflow``, so
in DeepSpeed every forward/backward is a step: a workload with several micro-batches per iteration
is taken here as one step over all of them):

* the top-k columns by column |g| sum (``topk_ratio`` of every 2-D weight) are updated on the GPU
  by a selective AdamW over b16 moments (``ops/adam/zenflow_torch_adam.py``), after the owners
  broadcast the selected gradients (``zenflow_stage_1_and_2.py:_process_selected_fp32_groups_grad``);
* the b16 partition gradient goes to the host as in ZeRO-Offload (the shared gradient mechanism);
  inside a window the running sum comes back up to be added on the GPU (``stage_1_and_2.py``
  accumulate-through-GPU: 2 B/element H2D on every step but the window's first); on the window's
  last step the sum goes down once more as fp32 into ``overlap_grad[parity]`` (4 B/element,
  ``async_inplace_copy_grad_to_fp32_buffer_from_gpu``);
* every ``update_interval`` steps (the window's boundary), with ``overlap_step``, the training
  process waits for the CPU worker's previous step, copies the fp32 ``stale_param`` into the b16
  partition on the GPU (host-side cast, pageable, 2 B/element), all-gathers it, unscales the
  window's gradient and submits the CPU Adam of the window just closed to the worker process, which
  runs on the rank's cores less ``ceil(pt_reserved_cores_perc x cores)`` (``zenflow_utils.py:
  _split_affinity``) while the GPU runs the next window (``ZenFlowZeroOptimizerParallel.step``).
  Without ``overlap_step`` (and in the ``full_warm_up_rounds``) the CPU step is synchronous.
* every select boundary the selection is refreshed (column sums over the owner's slice) and the
  next step's backward first copies the GPU b16 weights back into the fp32 master
  (``backward_prologue`` -> ``sync_fp32_param_from_gpu``; 2 B/element D2H, pageable).

The DeepSpeed code, as read, lets a second window's step be submitted before the first one's is
waited for (``wait_last_update_and_copy`` returns early once, at ``first_update_round_after_warmup``),
so at most two worker steps are outstanding; the worker runs them one after the other, so the
steady rate is the one modelled here, where each boundary waits for the previous boundary's step
(the paper's one-window lag).

Modelled approximately: the per-step H2D of the running sum, the boundary's fp32 D2H of the
window gradient, the selected gradients' broadcast and the selective step are emitted after
backward (in DeepSpeed they run per bucket inside it: a system's micro-batch ops are the same in
every iteration, so what differs by window position is emitted with the step);
1-D tensors (always fully selected) are counted at ``topk_ratio`` like the 2-D weights (they are
< 0.1% of a 7B model's parameters). The ``auto`` update interval (a rule on gradient statistics)
is not modelled: an integer ``update_interval`` is required. The last simulated step submits no
CPU step (its update belongs to steps after the run; in a long run it overlaps them), so the run
ends when its last step does.

Steady metrics hold whole windows only when the steady iterations are a multiple of
``update_interval`` (e.g. ``--warmup-iterations u --iterations u + k u``): a schedule note says
so otherwise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from enum import StrEnum
from typing import Literal

from pydantic import Field

from offsim.config.base import Frozen
from offsim.config.run import RunConfig
from offsim.config.workload import DTYPE_BYTES
from offsim.core.enums import Activity, Link, MechanismId, Phase, Res, StreamKind, TensorKind, Tier
from offsim.core.window import MeasureWindow
from offsim.errors import ConfigError
from offsim.mechanisms.base import BlockBuilder, Need, Setup, Site, SiteKind, Stage, tag
from offsim.mechanisms.compute import COMPUTE
from offsim.mechanisms.grads import Grads, LayerGrads, grad_home
from offsim.plan import cpu_adam
from offsim.plan.cpu_adam import RateOrigin
from offsim.plan.footprint import StateSizes
from offsim.plan.paths import UNCAPPED_BYTES_PER_S
from offsim.schedule.ops import Alloc, Delay, Flow, Free, Join, StreamSpec, Tag, TensorRef, Wait
from offsim.systems._compile import System
from offsim.systems._options import read_options
from offsim.systems._parts import Ctx, build_ctx, optimizer_dram_bpp, standard, whole

OPTIONS: frozenset[str] = frozenset()

WORKER = "zenflow_worker"  # the CPU optimizer process (its own cores)
UP, DOWN = "zenflow_h2d", "zenflow_d2h"  # the window's gradient copies
WINDOW_DONE = TensorRef(TensorKind.OPT_STATE, unit=-1, group=-4)  # written when a worker step ends

#: GPU bytes per parameter of the selective AdamW over b16 state: read and write the b16
#: parameter (2 + 2), read the b16 gradient (2), read and write two b16 moments (4 + 4)
#: (``zenflow_torch_adam.py``: torch ``adamw`` over column-indexed views of b16 tensors).
SELECTIVE_ADAM_BYTES_PER_PARAM = 14.0
#: b16 bytes per selected element the GPU keeps: its gradient (2) and two b16 moments (2 + 2)
#: (new_systems.md §1 Memory).
SELECTED_GRAD_BYTES, SELECTED_MOMENT_BYTES = 2.0, 4.0
#: host DRAM bytes per element of ``sync_fp32_param_from_gpu``: the b16 copy lands (2), is cast
#: to fp32 (2 read + 4 write) and copied into the master (4 + 4).
RESYNC_DRAM_BYTES = 16.0


class SelectStrategy(StrEnum):
    """``select_strategy``: the unit of ``select_interval`` (``zenflow_config.py``)."""

    AUTO = "auto"    # reselect once per epoch
    STEP = "step"    # select_interval in steps
    EPOCH = "epoch"  # select_interval in epochs


class Options(Frozen):
    """ZenFlow's knobs, DeepSpeed's names and defaults (``deepspeed/runtime/zenflow/
    zenflow_config.py:ZenFlowConfig`` at ``edaa722126``), plus ``steps_per_epoch``.

    Attributes:
        topk_ratio: share of every 2-D weight's columns updated on the GPU each step.
        select_strategy / select_interval: how often the top-k columns are chosen again.
        update_interval: the window u (steps) between CPU updates; ``auto`` (a rule on gradient
            statistics) is not modelled.
        overlap_step: the CPU step runs in a worker process over the next window.
        offload: the selected columns' moments live in pinned host memory, copied in and out
            around each selective step.
        auto_ratio: the ``auto`` update rule's threshold (accepted, unused: no ``auto``).
        full_warm_up_rounds: leading steps that are ordinary full (synchronous) updates.
        pt_reserved_cores_perc: share of a rank's cores kept for the training process; the worker
            gets the rest.
        steps_per_epoch: offsim's stand-in for ``len(training_dataloader)`` (DeepSpeed sets it at
            run time); None: unknown, so an epoch-based selection happens once, at the start
            (DeepSpeed's ``select_interval = 0``).
    """

    topk_ratio: float = Field(default=0.1, ge=0.0, le=1.0)
    select_strategy: SelectStrategy = Field(default=SelectStrategy.AUTO, strict=False)
    select_interval: Literal["auto"] | int = "auto"
    update_interval: Literal["auto"] | int = "auto"
    overlap_step: bool = False
    offload: bool = False
    auto_ratio: float = Field(default=0.99, ge=0.0, le=1.0)
    full_warm_up_rounds: int = Field(default=0, ge=0)
    pt_reserved_cores_perc: float = Field(default=0.5, ge=0.0, le=1.0)
    steps_per_epoch: int | None = Field(default=None, ge=1)


def update_interval(o: Options, strategy: str) -> int:
    """The window u; ``auto`` is refused (its rule reads gradient statistics offsim does not model)."""
    if isinstance(o.update_interval, str) or o.update_interval < 1:
        raise ConfigError(f"strategy '{strategy}': zenflow update_interval must be an integer >= 1 (got "
                          f"{o.update_interval!r}); the 'auto' rule needs gradient statistics offsim does not "
                          "model (DeepSpeed's tutorial example uses 4)")
    return o.update_interval


def select_interval(o: Options, strategy: str) -> int:
    """Steps between reselections, 0 for none after the first (``engine.py:configure_zenflow``)."""
    if o.select_strategy is SelectStrategy.AUTO:
        return o.steps_per_epoch or 0  # epoch-based, interval 1
    if isinstance(o.select_interval, str) or o.select_interval < 1:
        raise ConfigError(f"strategy '{strategy}': zenflow select_strategy {o.select_strategy} needs an integer "
                          f"select_interval >= 1 (got {o.select_interval!r})")
    if o.select_strategy is SelectStrategy.STEP:
        return o.select_interval
    return o.select_interval * (o.steps_per_epoch or 0)


@dataclass(frozen=True, slots=True)
class StepPlan:
    """What one step does besides forward and backward.

    Attributes:
        selective: the selective GPU step runs (after the warm-up).
        selects: the top-k columns are chosen in this step (column sums).
        sums_up: the window's running sum comes up to be added on the GPU (not the window's first step).
        boundary: the window closes: the fp32 window gradient goes down.
        synchronous: the CPU step runs at once and the step waits for it (no overlap, or warm-up).
        waits: the step waits for the previous window's CPU step and installs its parameters.
        submits: the step submits its window's CPU step.
        resyncs: the next step's backward starts by copying the GPU weights into the master.
    """

    selective: bool
    selects: bool
    sums_up: bool
    boundary: bool
    synchronous: bool
    waits: bool
    submits: bool
    resyncs: bool


def _is_boundary(it: int, u: int, s: int, warm: int) -> bool:
    """``engine.py:is_zenflow_update_boundary`` with a fixed u, at 0-based step ``it``."""
    if it + 1 < warm:
        return True
    return (it + 1 - warm) % u == 0 or (s != 0 and (it + 1) % s == 0)


def _is_select(it: int, s: int, warm: int) -> bool:
    """``zenflow_stage_1_and_2.py:is_zenflow_select_boundary`` at step ``it``."""
    return it - warm >= 0 and (it - warm == 0 or (s != 0 and it % s == 0))


def step_plans(o: Options, iterations: int, strategy: str = "zenflow") -> tuple[StepPlan, ...]:
    """The plan of each of ``iterations`` steps (pure: no configuration but the options)."""
    u, s, warm = update_interval(o, strategy), select_interval(o, strategy), o.full_warm_up_rounds
    if s != 0 and s < u:  # engine.py:configure_zenflow raises the same
        raise ConfigError(f"strategy '{strategy}': zenflow select interval {s} steps is below update_interval {u}; "
                          "DeepSpeed requires select_interval >= update_interval")
    plans, submitted, window_start = [], False, True
    for it in range(iterations):
        boundary = _is_boundary(it, u, s, warm)
        sync = boundary and (it < warm or not o.overlap_step)
        last = it == iterations - 1
        submits = boundary and (sync or not last)
        plans.append(StepPlan(selective=it >= warm, selects=_is_select(it, s, warm), sums_up=not window_start,
                              boundary=boundary, synchronous=sync, waits=boundary and not sync and submitted,
                              submits=submits, resyncs=not last and _is_select(it + 1, s, warm)))
        submitted = submitted or (submits and not sync)
        window_start = boundary
    return tuple(plans)


@dataclass(frozen=True)
class ZenFlowStep:
    """ZenFlow's optimizer: the selective GPU step each step, the window's traffic and the CPU
    worker's step over the whole partition at each window boundary (module docstring).

    Attributes:
        plans: per iteration, what its step does (:func:`step_plans`).
        n_layers: layers whose gradients a step waits for.
        selective_s: the selective AdamW on the GPU (HBM-bound), seconds.
        column_sums_s: the column |g| sums of a selection over the owner's slice, seconds.
        selected_broadcast: the owners' broadcast of the selected gradients (None: one rank).
        moments_up / moments_down: the selected moments in and out (``offload``; else None).
        sum_up: the window's running b16 sum H2D.
        window_down: the window's fp32 gradient D2H into ``overlap_grad``.
        unscale: the host pass over the window's fp32 gradient before submitting.
        adam: the worker's CPU Adam over the partition (its cores' share of the CPU).
        cast / upload / gather: ``stale_param`` cast to b16 on the host, copied H2D, all-gathered.
        resync: the GPU weights D2H into the master at a reselection, then ``resync_host``.
        gpu_bytes / host_pinned_bytes / host_bytes: what ZenFlow holds beyond ZeRO-Offload.
    """

    plans: tuple[StepPlan, ...]
    n_layers: int
    selective_s: float
    column_sums_s: float
    selected_broadcast: Flow | None
    moments_up: Flow | None
    moments_down: Flow | None
    sum_up: Flow
    window_down: Flow
    unscale: Flow
    adam: Flow
    cast: Flow
    upload: Flow
    gather: Flow | None
    resync: Flow
    resync_host: Flow
    gpu_bytes: tuple[tuple[str, int], ...]
    host_pinned_bytes: tuple[tuple[str, int], ...]
    host_bytes: tuple[tuple[str, int], ...]
    update_interval: int = 1
    id: MechanismId = MechanismId.CPU_OPTIMIZER

    def measure_window(self) -> MeasureWindow:
        """Whole windows after the first: the steps of a window differ (the boundary's CPU step
        is made once per window) and the first window has no CPU step beside it; and one step
        after the last measured window, whose boundary then submits its CPU step as every
        window's does (the run's last step submits none)."""
        u = self.update_interval
        return MeasureWindow(lead=u, tail=1, period=u,
                             why=f"zenflow measures whole windows of update_interval {u} after the first (the CPU "
                                 "step runs once per window, beside the next)")

    def setup(self) -> Setup:
        return Setup(streams=(StreamSpec(WORKER, StreamKind.CPU), StreamSpec(UP, StreamKind.COPY, in_order=False),
                              StreamSpec(DOWN, StreamKind.COPY, in_order=False)))

    def footprint(self) -> tuple[Need, ...]:
        """The selected columns' gradients and moments on the GPU (moments in pinned host memory
        with ``offload``, brought to the GPU for each selective step: counted as held, the fit
        check has no moment for the step), the second fp32 gradient buffer and the b16
        accumulation buffer (pinned), ``stale_param`` and the worker's second moment set
        (pageable): all held through the run."""
        needs = [Need(tier, what, n) for tier, items in self._held() for what, n in items]
        if self.moments_up is not None:  # counted as held: no moment of the footprint is "the step"
            needs.append(Need(Tier.GPU, "selected moments brought in for the selective step (offload)",
                              self.moments_up.nbytes))
        return tuple(needs)

    def _held(self) -> tuple[tuple[Tier, tuple[tuple[str, int], ...]], ...]:
        return ((Tier.GPU, self.gpu_bytes), (Tier.HOST_PINNED, self.host_pinned_bytes),
                (Tier.HOST_PAGEABLE, self.host_bytes))

    def _t(self, activity: Activity, label: str = "", mech: MechanismId | None = None) -> Tag:
        return tag(activity, mech or self.id, Phase.OPTIMIZER, label=label)

    def emit(self, b: BlockBuilder, site: Site, stage: Stage) -> None:
        if stage is not Stage.RUN:
            return
        if site.what is SiteKind.INIT:
            self._allocate(b)
        elif site.what is SiteKind.STEP:
            self._step(b, self.plans[site.iteration])

    def _allocate(self, b: BlockBuilder) -> None:
        for k, (tier, items) in enumerate(self._held()):
            for j, (what, n) in enumerate(items):
                if n > 0:
                    b.add(Alloc(tier, n, TensorRef(TensorKind.BUFFER, unit=-5 - k, group=j)),
                          self._t(Activity.HOST_SETUP, what), "init")

    def _step(self, b: BlockBuilder, p: StepPlan) -> None:
        home = b.add(Join(), self._t(Activity.OPTIMIZER, "gradients home (end of backward)"), COMPUTE,
                     reads=tuple(grad_home(u) for u in range(self.n_layers)), stall=Wait("gradient offload"))
        if p.selects and self.column_sums_s > 0:
            b.add(Delay(self.column_sums_s), self._t(Activity.OPTIMIZER, "top-k column selection (column |g| sums)",
                                                    MechanismId.GPU_OPTIMIZER), COMPUTE)
        if p.selective:
            self._selective(b)
        if p.sums_up:
            b.add(self.sum_up, self._t(Activity.GRAD_ACCUMULATE, "window's running sum up, added on the GPU"), UP,
                  after=[home])
        if p.boundary:
            self._boundary(b, p, b.add(self.window_down, self._t(Activity.GRAD_OFFLOAD, "window gradient (fp32) "
                                                                 "into overlap_grad"), DOWN, after=[home]))
        if p.resyncs:
            b.add(self.resync, self._t(Activity.PARAM_UPDATE, "GPU weights into the fp32 master (reselection)"),
                  COMPUTE, stall=Wait("the master resynced from the GPU"))
            b.add(self.resync_host, self._t(Activity.PARAM_UPDATE, "master cast and copied (reselection)"), COMPUTE)

    def _selective(self, b: BlockBuilder) -> None:
        """The selected gradients broadcast, the selected moments in (``offload``), the selective
        AdamW, the moments out, on the compute stream."""
        gpu = MechanismId.GPU_OPTIMIZER
        if self.selected_broadcast is not None:
            b.add(self.selected_broadcast, self._t(Activity.GRAD_REDUCE, "selected gradients broadcast", gpu), COMPUTE)
        moments = TensorRef(TensorKind.OPT_STATE, unit=-6)
        if self.moments_up is not None:  # copy_mv_from_cpu: GPU copies, dropped after copy_mv_to_cpu
            b.add(Alloc(Tier.GPU, self.moments_up.nbytes, moments), self._t(Activity.OPT_H2D, "", gpu), COMPUTE)
            b.add(self.moments_up, self._t(Activity.OPT_H2D, "selected moments in", gpu), COMPUTE)
        b.add(Delay(self.selective_s), self._t(Activity.OPTIMIZER, "selective AdamW (top-k columns)", gpu), COMPUTE)
        if self.moments_down is not None:
            b.add(self.moments_down, self._t(Activity.OPT_D2H, "selected moments out", gpu), COMPUTE)
            b.add(Free(Tier.GPU, moments), self._t(Activity.OPT_D2H, "", gpu), COMPUTE)

    def _boundary(self, b: BlockBuilder, p: StepPlan, down: int) -> None:
        """The window's end: synchronous (step, then install) or overlapped (install the previous
        window's result, then submit this one)."""
        if p.waits:
            b.add(Join(), self._t(Activity.OPTIMIZER, "waits for the previous window's CPU step"), COMPUTE,
                  reads=(WINDOW_DONE,), stall=Wait("the previous window's CPU step"))
            self._install(b)
        if p.submits:
            self._submit(b, down)
        if p.synchronous:
            b.add(Join(), self._t(Activity.OPTIMIZER, "waits for the CPU step"), COMPUTE, reads=(WINDOW_DONE,),
                  stall=Wait("the CPU optimizer step"))
            self._install(b)

    def _submit(self, b: BlockBuilder, down: int) -> None:
        last = b.add(Join(), self._t(Activity.GRAD_OFFLOAD, "waits for the window gradient"), COMPUTE, after=[down],
                     stall=Wait("the window gradient"))
        last = b.add(self.unscale, self._t(Activity.OPTIMIZER, "unscale the window gradient"), COMPUTE, after=[last])
        last = b.add(self.adam, self._t(Activity.OPTIMIZER, "CPU Adam (worker process)"), WORKER, after=[last])
        b.add(Join(), self._t(Activity.OPTIMIZER, "worker step done"), WORKER, after=[last], writes=(WINDOW_DONE,))

    def _install(self, b: BlockBuilder) -> None:
        b.add(self.cast, self._t(Activity.PARAM_UPDATE, "stale_param cast to 16-bit on the host"), COMPUTE,
              stall=Wait("parameters from the CPU"))
        b.add(self.upload, self._t(Activity.PARAM_UPDATE, "parameters up"), COMPUTE,
              stall=Wait("parameters from the CPU"))
        if self.gather is not None:
            b.add(self.gather, self._t(Activity.PARAM_GATHER), COMPUTE)


def worker_cpu_share(cfg: RunConfig, ranks_per_node: int, o: Options) -> float:
    """The worker's CPU Adam rate as a share of the rank's (its cores: the rank's less
    ``ceil(pt_reserved_cores_perc x cores)``; all of them if that leaves none or all,
    ``zenflow_utils.py:_split_affinity``). Synchronous steps use all the rank's cores. A measured
    rate scales with the cores; a derived one through :func:`offsim.plan.cpu_adam.rank_adam_params_per_s`."""
    if not o.overlap_step:
        return 1.0
    hw = cfg.hardware
    cores = max(1, hw.cpu.cores // ranks_per_node)
    reserved = math.ceil(o.pt_reserved_cores_perc * cores)
    worker = cores - reserved if 0 < reserved < cores else cores
    if hw.cpu.optimizer_rate_origin is RateOrigin.MEASURED:
        return worker / cores
    host = hw.cpu.adam_host(hw.dram.bandwidth_bytes_per_s)
    return (cpu_adam.rank_adam_params_per_s(host, ranks_per_node, worker)
            / cpu_adam.rank_adam_params_per_s(host, ranks_per_node, cores))


def _host_pass(nbytes: float) -> Flow:
    """A host pass (PyTorch CPU op over ATen's threads) touching ``nbytes`` of DRAM."""
    return Flow(whole(nbytes), ((Res.DRAM, 1.0),), UNCAPPED_BYTES_PER_S, (Link.DRAM_COPY,))


def _held_bytes(c: Ctx, o: Options) -> dict[Tier, tuple[tuple[str, int], ...]]:
    """What ZenFlow holds beyond the ZeRO-Offload state (new_systems.md §1 Memory, from
    ``initialize_optimizer_states`` and the worker process)."""
    sz, k = c.sz, o.topk_ratio
    pr, master = sz.local_params, DTYPE_BYTES[c.cfg.workload.precision.master_params]
    moments = sz.optimizer_bytes_per_param - master
    selected = k * sz.params_total
    pinned = Tier.HOST_PINNED if c.st.pin_memory else Tier.HOST_PAGEABLE
    gpu = [("selected columns' gradients (b16)", whole(selected * SELECTED_GRAD_BYTES))]
    if not o.offload:
        gpu.append(("selected columns' moments (b16)", whole(selected * SELECTED_MOMENT_BYTES)))
    host = [("stale_param (fp32 copy the worker writes)", whole(pr * master)),
            ("the worker's second moment set", whole(pr * moments))]
    pin = [("second fp32 gradient buffer (overlap_grad[1])", whole(pr * sz.host_grad_bytes_per_param)),
           ("b16 gradient accumulation buffer", whole(pr * c.bpp_grad))]
    if o.offload:
        pin.append(("selected columns' moments (offload)", whole(selected * SELECTED_MOMENT_BYTES)))
    out = {Tier.GPU: tuple(gpu), Tier.HOST_PAGEABLE: tuple(host)}
    out[pinned] = out.get(pinned, ()) + tuple(pin)
    return out


def zenflow_step(c: Ctx, o: Options) -> ZenFlowStep:
    """ZenFlow's optimizer from the run's sizes and the options."""
    sz, st, hw = c.sz, c.st, c.cfg.hardware
    pr, pinned = sz.local_params, st.pin_memory
    selected = o.topk_ratio * sz.params_total
    master = DTYPE_BYTES[c.cfg.workload.precision.master_params]
    dram_bpp = optimizer_dram_bpp(c) - c.bpp_param + master  # the worker writes stale_param in fp32
    share = worker_cpu_share(c.cfg, sz.ranks_per_node, o)
    adam = Flow(whole(pr * dram_bpp), ((Res.CPU, 1.0 / (dram_bpp * share)), (Res.DRAM, 1.0)), UNCAPPED_BYTES_PER_S,
                (Link.CPU,))
    mv = whole(selected * SELECTED_MOMENT_BYTES)
    held = _held_bytes(c, o)
    return ZenFlowStep(
        step_plans(o, c.cfg.iterations, st.name), len(c.layers),
        selected * SELECTIVE_ADAM_BYTES_PER_PARAM / hw.gpu.hbm_bytes_per_s,
        pr * c.bpp_grad / hw.gpu.hbm_bytes_per_s,
        c.collective(selected * c.bpp_grad, 1.0),
        c.paths.dma(True, mv, True) if o.offload else None, c.paths.dma(False, mv, True) if o.offload else None,
        c.paths.dma(True, whole(pr * c.bpp_grad), pinned),
        c.paths.dma(False, whole(pr * sz.host_grad_bytes_per_param), pinned),
        _host_pass(2 * pr * sz.host_grad_bytes_per_param), adam,
        _host_pass(pr * (master + c.bpp_param)), c.paths.dma(True, whole(pr * c.bpp_param), pinned=False),
        c.collective(sz.param_bytes, 1.0) if st.zero_stage in (1, 2) else None,
        c.paths.dma(False, whole(pr * c.bpp_param), pinned=False), _host_pass(pr * RESYNC_DRAM_BYTES),
        held.get(Tier.GPU, ()), held.get(Tier.HOST_PINNED, ()), held.get(Tier.HOST_PAGEABLE, ()),
        update_interval(o, st.name))


def _check(cfg: RunConfig) -> None:
    """ZenFlow extends ZeRO-Offload stage 1/2 (``offload_optimizer.device: cpu``, parameters and
    gradients as ZeRO-2)."""
    st = cfg.strategy
    pl = st.placement
    if st.zero_stage not in (1, 2) or pl.params != "gpu" or pl.grads != "cpu" or st.optimizer_device != "cpu" \
            or pl.optimizer_states != "cpu":
        raise ConfigError(f"strategy '{st.name}': zenflow (stage 1/2) needs zero_stage 1 or 2, params on the gpu, "
                          "grads and optimizer_states on the cpu and optimizer_device cpu")


def notes(cfg: RunConfig, o: Options) -> tuple[str, ...]:
    """What the schedule's reader must know about this run's windows."""
    u = update_interval(o, cfg.strategy.name)
    steady = cfg.iterations - cfg.warmup_iterations
    if steady % u != 0:
        return (f"zenflow: the {steady} steady iterations are not whole windows of update_interval {u}, so the "
                "steady metrics over- or under-count the CPU step made once per window (run with warmup u and "
                "u + k u iterations)",)
    return ()


def _lands_in_pinned(g: LayerGrads) -> bool:
    """The layer's gradient takes ZeRO-Offload's plain host path (to the pinned buffer, no
    layer-wise update, no NVMe, not ZeRO-3's round trip): the one ZenFlow accumulates through the
    GPU."""
    return (g.offloaded and g.update is None and g.cast is None and g.roundtrip_h2d is None
            and g.host_buffer_bytes == 0)


@dataclass(frozen=True)
class WindowGrads(Grads):
    """ZeRO-Offload's gradient mechanism without its host accumulation pass: the sum was made on
    the GPU and the copy lands in the pinned buffer as it is
    (``stage_1_and_2.py:async_accumulate_grad_in_cpu_via_gpu``), so the copy's end is the
    gradient's arrival in its home: a :class:`Join` that writes it (what the optimizer waits
    for), not a host flow of no bytes."""

    def _on_host(self, b: BlockBuilder, site: Site, g: LayerGrads, last: int) -> int:
        if not _lands_in_pinned(g):
            return super()._on_host(b, site, g, last)
        u = site.layer
        return b.add(Join(), tag(Activity.GRAD_ACCUMULATE, self.id, Phase.BACKWARD, u,
                                 label="the sum is in the pinned buffer (added on the GPU)"),
                     after=[last], writes=(grad_home(u),))


def window_grads(grads: Grads, u: int, micro_batches: int) -> WindowGrads:
    """ZeRO-Offload's gradient path as ZenFlow runs it: the partition's b16 gradient (the running
    sum) is copied into the pinned buffer each step and added to on the GPU, not on the host
    (``stage_1_and_2.py:async_accumulate_grad_in_cpu_via_gpu``), so no host accumulation pass
    (:class:`WindowGrads`); with u = 1 (and one micro-batch) every step is a window's first and
    last, so only the fp32 copy goes down (``copy_grads_in_partition`` skips the b16 one for a
    lone backward)."""
    lone = u == 1 and micro_batches == 1
    layers = tuple(replace(g, accumulate_first=None, accumulate=None, d2h=None if lone else g.d2h)
                   if _lands_in_pinned(g) else g for g in grads.layers)
    return WindowGrads(**{f.name: getattr(grads, f.name) for f in fields(grads)} | {"layers": layers})


def compose(cfg: RunConfig, sz: StateSizes | None = None) -> System:
    """ZeRO-Offload's mechanisms with ZenFlow's step in place of the CPU optimizer; every step
    differs (window position, last step), so each iteration has its own step block."""
    _check(cfg)
    o = read_options(cfg.strategy, Options)
    c = build_ctx(cfg, sz)
    base = standard(c)
    grads = base.mechanisms["grads"]
    assert isinstance(grads, Grads)
    u = update_interval(o, cfg.strategy.name)
    mechs = {**base.mechanisms, "grads": window_grads(grads, u, base.micro_batches), "optimizer": zenflow_step(c, o)}
    sites = {**base.sites, SiteKind.INIT: (*base.sites[SiteKind.INIT], ("optimizer", Stage.RUN))}
    return replace(base, mechanisms=mechs, sites=sites, step_period=max(1, cfg.iterations - 1),  # type: ignore[arg-type]
                   notes=base.notes + notes(cfg, o))
