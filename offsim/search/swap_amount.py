"""Fuyou's automatic activation swap amount.

Fuyou (Liao et al., arXiv 2403.06504 v1, "automatic activation swapping management"; v2, LoHan,
"holistic traffic-aware activation swapping") swaps the activations of some transformer blocks
to SSD through host memory and recomputes the others from a checkpoint of their input. Swapping
more blocks adds PCIe and SSD time; recomputing more adds GPU time. Fuyou profiles one iteration
and chooses the amount that minimises the predicted iteration time, the largest of the
per-resource times: as the swapped amount grows the GPU term falls and the I/O terms rise, so
the predicted time falls and then rises (v2 solves it as a convex problem).

offsim does the same in two stages, for the plans "swap the first ``n`` blocks, recompute the
rest" (:class:`offsim.policies.per_block.PerBlockConfig`; early blocks are swapped because
backward reaches them last), ``n`` from 0 to the number of blocks:

1. **Model.** The schedule's bottleneck bound (:func:`offsim.plan.time_bound.time_lower_bound`:
   the least work of each plan's compiled schedule on the GPU compute stream, each PCIe
   direction, the NVMe array, DRAM, the CPU optimizer, each copy queue) with the GPU term
   raised by the two stalls an aggregate bound misses (:func:`swap_stalls_s`): forward waits
   when the copies out fall behind the compute (at most ``prefetch_depth + 2`` blocks in
   flight), and backward waits for a read that takes longer than the ``prefetch_depth`` blocks
   of backward it hides under. The model's best count among the admissible plans (below: GPU
   memory; ties to the smaller ``n``) heads a short list with both extremes (all recomputed,
   all swapped) and two neighbours of the best, those admissible.
2. **Profile.** Like Fuyou's profiling iteration, each listed plan is simulated
   (:data:`PROFILE_ITERATIONS` iterations) and the fastest feasible one is kept: never slower,
   as profiled, than recomputing every block when that plan is admissible.

**GPU memory.** Fuyou's rule bounds the swapped amount by the GPU memory left for the swap
buffers as well as by the SSD/PCIe time (arXiv 2403.06504 v1 §4, "automatic activation swapping
management", as issue 18 states it: the paper's text was not at hand here; its artifact,
github.com/Crispig/Ratel ``utils.py``
``get_act_swap_list``, grows the swap list until the swap time reaches a share of forward and
allocates one buffer per swapped tensor). A swapped block's activations stay on the GPU until
their copy out ends and forward waits while more than ``prefetch_depth + 1`` offloaded layers
occupy it (:class:`offsim.mechanisms.activations.Activations`), so the buffers a plan needs are
the largest sum of the kept bytes of ``prefetch_depth + 2`` consecutive offloaded layers (swapped
blocks' full activations, recomputed blocks' host checkpoints): :class:`GpuRoom`. A count is
admissible only when those buffers fit in what the plan's other GPU needs leave of the device
(:func:`gpu_room`, the fit check's margin rule), and when its footprint fits every tier.

When no plan fits, ``n`` is 0 and the simulator's fit check reports why.

The search sits above planning and the engine (it runs both): :func:`resolve_auto_swap` writes
its choice into the configuration (``AutoSwapConfig.chosen``) before anything plans it.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Literal

from offsim.config.run import RunConfig
from offsim.fit_check import footprint_of
from offsim.mechanisms.activations import Activations
from offsim.plan.footprint import Footprint, StateSizes, state_sizes
from offsim.plan.time_bound import time_lower_bound
from offsim.policies.auto_swap import AutoSwapConfig, ChosenSwap
from offsim.policies.per_block import PerBlockConfig
from offsim.schedule.bound import GPU_COMPUTE
from offsim.simulation import simulate_resolved
from offsim.systems._registry import compose

#: Relative slack under which two estimates count as equal (then the smaller swap count wins).
TIE_TOLERANCE = 1e-6
#: Iterations each short-listed plan is simulated for (one warm-up, one measured; one more with
#: the delayed parameter update, whose last iteration is not measured).
PROFILE_ITERATIONS = 2


@dataclass(frozen=True)
class SwapCandidate:
    """One swap count and what the bottleneck model predicts for it.

    Attributes:
        blocks: blocks whose activations are swapped (the first ones in forward order).
        bound_s: the schedule's bound of that plan (:func:`time_lower_bound`), seconds.
        estimate_s: the bound with the GPU term raised by the read stalls, seconds.
        binding: the term that sets the estimate ("GPU compute", "PCIe H2D", "NVMe array", ...).
        fits: the plan's memory footprint fits every tier.
        gpu: Fuyou's GPU-memory bound of the plan (its swap buffers and the room left for them).
        simulated_s: the profiled (simulated) iteration time when short-listed; ``inf`` when
            the simulation found it infeasible; None when not profiled.
    """

    blocks: int
    bound_s: float
    estimate_s: float
    binding: str
    fits: bool
    gpu: GpuRoom
    simulated_s: float | None = None

    @property
    def admissible(self) -> bool:
        """Fuyou's rule and the fit check both accept the plan."""
        return self.fits and self.gpu.fits


@dataclass(frozen=True)
class SwapChoice:
    """The chosen swap count, out of ``total_blocks``, and every candidate evaluated."""

    blocks: int
    total_blocks: int
    candidates: tuple[SwapCandidate, ...]

    @property
    def chosen(self) -> SwapCandidate:
        """The candidate for the chosen count."""
        return self.candidates[self.blocks]

    @property
    def gpu_limit(self) -> int:
        """The most blocks whose swap buffers fit the GPU room (Fuyou's GPU-memory bound)."""
        return max((c.blocks for c in self.candidates if c.gpu.fits), default=0)

    @property
    def gpu_binds(self) -> bool:
        """GPU memory, not time, sets the amount: the count with the least estimate over all
        counts (ties to the smaller) is more than the GPU room admits."""
        best_s = min(c.estimate_s for c in self.candidates)
        time_best = min(c.blocks for c in self.candidates if c.estimate_s <= best_s * (1 + TIE_TOLERANCE))
        return not self.candidates[time_best].gpu.fits


def per_block_plan(cfg: RunConfig, swapped: int, total_blocks: int,
                   tier: Literal["cpu", "nvme"]) -> RunConfig:
    """``cfg`` with the activation policy "swap the first ``swapped`` blocks to ``tier``,
    recompute the others" (their checkpoints where the configured policy keeps them)."""
    st = cfg.strategy
    ckpt_tier: Literal["gpu", "cpu", "nvme"] = getattr(st.policies.activations, "checkpoint_tier", "gpu")
    act = PerBlockConfig(offload=swapped, recompute=total_blocks - swapped, tier=tier, checkpoint_tier=ckpt_tier)
    pol = st.policies.model_copy(update={"activations": act})
    return cfg.model_copy(update={"strategy": st.model_copy(update={"policies": pol})})


def swap_stalls_s(cfg: RunConfig, sz: StateSizes, tier: Literal["cpu", "nvme"], n: int) -> float:
    """GPU seconds per micro-batch that ``n`` swapped blocks wait for their copies.

    Out (forward): each block's full activations go GPU -> host (pinned PCIe) and, for NVMe,
    on to the array at the rank's share of its write rate; with the staging pool holding
    fewer than two blocks the two legs run one after the other. At most ``depth + 2`` blocks
    may be in flight, so the forward of the swapped blocks cannot run ahead of the copies by
    more than ``depth + 1`` blocks: stall = max(0, (n - depth - 1) x out - (n - 1) x forward).
    Back (backward): NVMe read then host -> GPU, started ``depth`` blocks ahead: per block
    max(0, back - depth x block backward)."""
    if n == 0:
        return 0.0
    block = next(lay for lay in sz.layers if lay.is_block)
    hw, st = cfg.hardware, cfg.strategy
    nbytes = block.act_full_bytes
    out_s = nbytes / hw.host_link.d2h.pinned.peak_bytes_per_s
    back_s = nbytes / hw.host_link.h2d.pinned.peak_bytes_per_s
    if tier == "nvme" and hw.nvme is not None:
        write_s = nbytes * sz.ranks_per_node / hw.nvme.write_bytes_per_s
        pipelined = st.pinned_buffer_count * st.pinned_buffer_bytes >= 2 * nbytes
        out_s = max(out_s, write_s) if pipelined else out_s + write_s
        back_s += nbytes * sz.ranks_per_node / hw.nvme.read_bytes_per_s
    depth = st.prefetch_depth
    forward = max(0.0, (n - depth - 1) * out_s - (n - 1) * block.fwd_s)
    backward = n * max(0.0, back_s - depth * block.bwd_s)
    return forward + backward


#: bytes of precision of the GPU budget's bisection
_BUDGET_RESOLUTION_BYTES = 1.0


@dataclass(frozen=True)
class GpuRoom:
    """One plan's swap buffers against the GPU memory left for them (module docstring, "GPU
    memory"), bytes per rank.

    Attributes:
        buffers_bytes: what the offloaded layers in flight hold: the largest sum of the kept
            bytes of ``prefetch_depth + 2`` consecutive offloaded layers, in forward order.
        left_bytes: the largest GPU need the device takes (:func:`gpu_budget_bytes`) less the
            plan's other GPU needs (its footprint without the offloaded layers in flight).
    """

    buffers_bytes: float
    left_bytes: float

    @property
    def fits(self) -> bool:
        """The buffers fit in the room left."""
        return self.buffers_bytes <= self.left_bytes


def gpu_budget_bytes(fp: Footprint) -> float:
    """The largest GPU need (bytes per rank) that ``fp``'s device takes: at most its capacity and
    not out of memory by the allocator's margin (:meth:`Footprint.first_overflow`, gpu_memory.md
    §4), found by bisection so that the verdict is the fit check's own rule."""
    def fits(need_bytes: float) -> bool:
        only_gpu = {t: (need_bytes if t == "gpu" else 0.0) for t in fp.need_bytes}
        return Footprint(only_gpu, fp.capacity_bytes, fp.breakdown).first_overflow() is None

    lo, hi = 0.0, fp.capacity_bytes["gpu"]
    if fits(hi):
        return hi
    while hi - lo > _BUDGET_RESOLUTION_BYTES:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def swap_buffers_bytes(acts: Activations) -> float:
    """The bytes the throttle lets offloaded layers hold on the GPU at once: the largest sum of
    ``depth + 2`` consecutive offloaded layers' kept bytes, in forward order."""
    kept = [a.kept_bytes for a in acts.layers if a.offloaded]
    window = acts.depth + 2
    return float(max((sum(kept[i:i + window]) for i in range(max(1, len(kept) - window + 1))), default=0))


#: the fit check's item for the offloaded layers in flight (Activations.footprint)
IN_FLIGHT_ITEM = "activations in flight"


def gpu_room(fp: Footprint, acts: Activations | None, budget_bytes: float) -> GpuRoom:
    """Fuyou's bound for a plan whose footprint is ``fp`` and whose activations mechanism is
    ``acts``: its swap buffers, and what its other GPU needs leave of ``budget_bytes``."""
    if acts is None:
        return GpuRoom(0.0, budget_bytes - fp.need_bytes["gpu"])
    other = fp.need_bytes["gpu"] - fp.breakdown["gpu"].get(IN_FLIGHT_ITEM, 0.0)
    return GpuRoom(swap_buffers_bytes(acts), budget_bytes - other)


def swap_candidates(cfg: RunConfig, sz: StateSizes, tier: Literal["cpu", "nvme"]) -> list[SwapCandidate]:
    """The estimate, the fit and Fuyou's GPU bound of every swap count from 0 to the number of blocks."""
    total = sum(1 for lay in sz.layers if lay.is_block)
    ga = cfg.workload.training.grad_accumulation
    out = []
    budget: float | None = None
    for n in range(total + 1):
        plan = per_block_plan(cfg, n, total, tier)
        bound = time_lower_bound(plan, sz)
        stall = ga * swap_stalls_s(cfg, sz, tier, n)
        terms = {**bound.terms_s, GPU_COMPUTE: bound.terms_s.get(GPU_COMPUTE, 0.0) + stall}
        binding = max(terms, key=lambda k: terms[k])
        system = compose(plan, sz)
        fp = footprint_of(system, plan, sz)
        budget = gpu_budget_bytes(fp) if budget is None else budget
        acts = next((m for m in system.mechanisms.values() if isinstance(m, Activations)), None)
        room = gpu_room(fp, acts, budget)
        out.append(SwapCandidate(n, bound.seconds, terms[binding], binding, fp.first_overflow() is None, room))
    return out


def model_choice(cands: list[SwapCandidate]) -> int | None:
    """The admissible count with the least estimate (ties to the smaller); None if none is."""
    fitting = [c for c in cands if c.admissible]
    if not fitting:
        return None
    best_s = min(c.estimate_s for c in fitting)
    return min(c.blocks for c in fitting if c.estimate_s <= best_s * (1 + TIE_TOLERANCE))


def short_list(cands: list[SwapCandidate], best: int) -> list[int]:
    """The counts to profile: the model's best, its neighbours an eighth of the blocks away,
    and both extremes, those admissible, in ascending order."""
    total = len(cands) - 1
    step = max(1, total // 8)
    wanted = {0, total, best, max(0, best - step), min(total, best + step)}
    return sorted(n for n in wanted if cands[n].admissible)


def profile_s(cfg: RunConfig, n: int, total: int, tier: Literal["cpu", "nvme"]) -> float:
    """Simulated steady iteration time of the plan with ``n`` swapped blocks; ``inf`` when the
    simulation finds it does not fit."""
    plan = per_block_plan(cfg, n, total, tier)
    plan = plan.model_copy(update={"iterations": PROFILE_ITERATIONS, "warmup_iterations": 1, "tail_iterations": 0})
    m = simulate_resolved(plan).metrics
    return m.iteration_time_s if m.feasible and m.iteration_time_s is not None else math.inf


def choose_swap_blocks(cfg: RunConfig, sz: StateSizes, tier: Literal["cpu", "nvme"]) -> SwapChoice:
    """Model, short list, profile (module docstring). Memoised per configuration."""
    key = (cfg.model_dump_json(), tier)
    if key not in _CHOICES:
        if len(_CHOICES) >= _CACHE_SIZE:
            _CHOICES.pop(next(iter(_CHOICES)))
        _CHOICES[key] = _choose(cfg, sz, tier)
    return _CHOICES[key]


_CACHE_SIZE = 64
_CHOICES: dict[tuple[str, str], SwapChoice] = {}


def _choose(cfg: RunConfig, sz: StateSizes, tier: Literal["cpu", "nvme"]) -> SwapChoice:
    cands = swap_candidates(cfg, sz, tier)
    total = len(cands) - 1
    best = model_choice(cands)
    if best is None:
        return SwapChoice(0, total, tuple(cands))
    timed = {n: profile_s(cfg, n, total, tier) for n in short_list(cands, best)}
    for n, t in timed.items():
        cands[n] = dataclasses.replace(cands[n], simulated_s=t)
    fastest = min(timed, key=lambda n: (timed[n], n))
    chosen = best if math.isinf(timed[fastest]) else fastest
    return SwapChoice(chosen, total, tuple(cands))


def resolve_auto_swap(cfg: RunConfig) -> RunConfig:
    """``cfg`` with an ``auto-swap`` activation policy's amount chosen (``chosen`` filled); any
    other configuration, or one already resolved, unchanged."""
    act = cfg.strategy.policies.activations
    if not isinstance(act, AutoSwapConfig) or act.chosen is not None:
        return cfg
    choice = choose_swap_blocks(cfg, state_sizes(cfg), act.tier)
    c = choice.chosen
    note = f"; model {c.estimate_s:.3g} s/iteration ({c.binding})"
    if c.simulated_s is not None:
        note += f", profiled {c.simulated_s:.3g} s"
    if choice.gpu_binds:
        note += f"; GPU memory bounds the swap at {choice.gpu_limit} blocks"
    chosen = ChosenSwap(blocks=choice.blocks, total_blocks=choice.total_blocks, note=note)
    st = cfg.strategy
    pol = st.policies.model_copy(update={"activations": act.model_copy(update={"chosen": chosen})})
    return cfg.model_copy(update={"strategy": st.model_copy(update={"policies": pol})})
