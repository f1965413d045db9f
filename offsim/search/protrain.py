"""ProTrain's automatic configuration search, with offsim as the cost model.

ProTrain (Yang et al., arXiv 2406.08334, "ProTrain: Efficient LLM Training via Automatic Memory
Management") reduces memory management to a few knobs and picks them by an exhaustive search
over cost models, pruned by memory: ``n_persist`` chunks of model state stay on the GPU, the
others live in CPU memory and are prefetched into ``n_buffer`` chunk buffers; ``n_swap``
transformer blocks swap their activations to the CPU, ``n_checkpoint`` blocks recompute them,
the rest keep them in HBM.

How the knobs map onto offsim (a chunk is one layer here; ProTrain packs parameters into
fixed-size chunks in execution order):

* persistent chunks: ``policies.eviction = {kind: static, keep_first: n_persist}``; a kept layer is
  fetched once per iteration and stays for every later forward and backward of the iteration.
  ProTrain also keeps the persistent chunks' gradients and optimizer state on the GPU and
  updates them with a GPU Adam: ``optimizer_gpu_fraction`` is the persistent layers' share of
  the parameters (with every layer persistent, all but the last, as the strategy needs a host
  share). With the CPU step overlapped (``layerwise``) that share is exactly the first layers:
  their gradients never leave the GPU, a GPU Adam updates them as backward reaches them, their
  16-bit parameters are never fetched, and the CPU updates only the other layers. After backward
  it is Twin-Flow's uniform split (the GPU updates its share beside the CPU step; the persistent
  layers are then fetched once per iteration). The plan's footprint charges the share's fp32
  gradients and optimizer state to the GPU, so the fit check below is the plan's alone.
* chunk buffers and prefetch: ``prefetch_depth`` layers ahead (lookahead), within a GPU
  parameter budget of the persistent layers plus ``prefetch_depth + 1`` of the largest layer.
* block-wise activations: ``policies.activations = {kind: per-block, offload: n_swap,
  recompute: n_checkpoint, tier: cpu}`` (the first blocks swap: backward reaches them last).
* CPU step: ``overlap_cpu_step`` runs each layer's CPU Adam as soon as its gradients reach the
  host (``optimizer_schedule: layerwise``) instead of after backward; both are searched.

The search: every candidate is first checked by the fit check of its composed mechanisms
(:func:`offsim.fit_check.check_fit`; a miss is infeasible with the tier and the bytes) and
given the lower bound of its compiled schedule (:func:`offsim.plan.time_bound.time_lower_bound`). Feasible
candidates are simulated in increasing order of their bound, starting from the base strategy as
the incumbent; a candidate whose bound is no better than the best simulated time is pruned
(branch and bound: it cannot win). The best is therefore the fastest of the whole grid and never
slower than the base.
"""

from __future__ import annotations

import datetime
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from offsim.config.base import Provenance
from offsim.config.hardware import HardwareProfile
from offsim.config.loading import load_strategy
from offsim.config.run import RunConfig, make_run_config
from offsim.config.strategy import Strategy
from offsim.config.workload import Workload
from offsim.errors import InfeasibleError, OffsimError
from offsim.fit_check import check_fit
from offsim.plan.footprint import state_sizes
from offsim.plan.time_bound import time_lower_bound
from offsim.simulation import simulate_resolved
from offsim.units import GiB

if TYPE_CHECKING:
    import pandas as pd

Status = Literal["ok", "infeasible", "pruned"]


@dataclass(frozen=True)
class Knobs:
    """One ProTrain configuration (module docstring for the mapping).

    Attributes:
        persistent_layers: layers whose parameters stay on the GPU for the whole iteration
            (ProTrain ``n_persist``, counted in layers from the embedding on).
        prefetch_depth: layers fetched ahead of the one computing (ProTrain ``n_buffer`` - 1).
        swap_blocks: transformer blocks that swap their activations to CPU memory (``n_swap``).
        recompute_blocks: blocks that recompute their activations in backward (``n_checkpoint``).
        overlap_cpu_step: CPU Adam per layer during backward (else after backward).
    """

    persistent_layers: int
    prefetch_depth: int
    swap_blocks: int
    recompute_blocks: int
    overlap_cpu_step: bool

    @property
    def label(self) -> str:
        """A short human-readable name."""
        step = "cpu step overlapped" if self.overlap_cpu_step else "cpu step after backward"
        return (f"persist {self.persistent_layers}, prefetch {self.prefetch_depth}, swap {self.swap_blocks}, "
                f"recompute {self.recompute_blocks}, {step}")


@dataclass(frozen=True)
class Grid:
    """The values tried per knob; layer and block counts are fractions of the model's.

    Attributes:
        persistent_fractions: shares of the layers kept persistent.
        prefetch_depths: prefetch depths, layers.
        block_fractions: shares of the blocks for swap and for recompute (pairs whose sum
            exceeds all blocks are skipped).
        overlap_cpu_step: CPU-step schedules tried.
    """

    persistent_fractions: tuple[float, ...] = (0.0, 0.125, 0.25, 0.5, 1.0)
    prefetch_depths: tuple[int, ...] = (1, 2, 4)
    block_fractions: tuple[float, ...] = (0.0, 0.25, 0.5, 0.75, 1.0)
    overlap_cpu_step: tuple[bool, ...] = (False, True)

    @classmethod
    def named(cls, name: str) -> Grid:
        """``small`` (72 points at most, for tests and quick looks) or ``default``."""
        if name == "small":
            return cls((0.0, 0.25, 1.0), (1, 2), (0.0, 0.5, 1.0), (False, True))
        if name == "default":
            return cls()
        raise OffsimError(f"unknown search grid '{name}'; valid grids: small, default")

    def knobs(self, n_layers: int, n_blocks: int) -> Iterator[Knobs]:
        """Every distinct candidate for a model of ``n_layers`` layers, ``n_blocks`` blocks."""
        persist = sorted({round(f * n_layers) for f in self.persistent_fractions})
        blocks = sorted({round(f * n_blocks) for f in self.block_fractions})
        for p in persist:
            for d in sorted(set(self.prefetch_depths)):
                for s in blocks:
                    for r in (r for r in blocks if s + r <= n_blocks):
                        for o in sorted(set(self.overlap_cpu_step)):
                            yield Knobs(p, d, s, r, o)


@dataclass(frozen=True)
class Candidate:
    """One evaluated configuration.

    Attributes:
        label: the knobs in words, or ``base: <name>``.
        knobs: the knobs (None for the base strategy).
        status: ``ok`` (simulated), ``infeasible`` (does not fit, or a policy failed) or
            ``pruned`` (its lower bound is no better than the best simulated time).
        reason: why it is infeasible or pruned; empty when ``ok``.
        lower_bound_s: the compiled schedule's lower bound on the iteration time, seconds.
        iteration_time_s: simulated steady iteration time, seconds (``ok`` only).
        tokens_per_s: simulated throughput (``ok`` only).
        peak_gpu_bytes: simulated peak GPU memory per GPU (``ok`` only).
        strategy: the strategy evaluated.
        misfit: the plan's fit check's error when that is why it is infeasible (tier, need and
            capacity), else None.
    """

    label: str
    knobs: Knobs | None
    status: Status
    reason: str
    lower_bound_s: float | None
    iteration_time_s: float | None
    tokens_per_s: float | None
    peak_gpu_bytes: float | None
    strategy: Strategy = field(repr=False)
    misfit: InfeasibleError | None = field(default=None, repr=False, compare=False)


class NothingFitsError(InfeasibleError):
    """Neither the base nor any candidate of a search fits (``offsim tune`` exits 1).

    ``tier``, ``need_bytes`` and ``capacity_bytes`` are those of the closest miss the plan's fit
    check found (the least over its tier's capacity); ``""`` and NaN when every candidate failed in
    the simulation instead. The message (``detail``) says why, with the closest miss's figures.
    """

    def __str__(self) -> str:
        return self.detail


@dataclass(frozen=True)
class SearchResult:
    """The search's choice, the base it is measured against, and every candidate."""

    best: Candidate
    base: Candidate
    candidates: list[Candidate]

    @property
    def speedup(self) -> float | None:
        """Base iteration time over the best's (None when the base does not fit)."""
        if self.base.iteration_time_s is None or self.best.iteration_time_s is None:
            return None
        return self.base.iteration_time_s / self.best.iteration_time_s

    def table(self) -> pd.DataFrame:
        """One row per candidate (the base first), knobs as columns."""
        import pandas as pd

        rows = []
        for c in self.candidates:
            k = c.knobs
            rows.append({"label": c.label, "status": c.status, "reason": c.reason,
                         "persistent_layers": None if k is None else k.persistent_layers,
                         "prefetch_depth": None if k is None else k.prefetch_depth,
                         "swap_blocks": None if k is None else k.swap_blocks,
                         "recompute_blocks": None if k is None else k.recompute_blocks,
                         "overlap_cpu_step": None if k is None else k.overlap_cpu_step,
                         "lower_bound_s": c.lower_bound_s, "iteration_time_s": c.iteration_time_s,
                         "tokens_per_s": c.tokens_per_s, "peak_gpu_bytes": c.peak_gpu_bytes,
                         "best": c is self.best})
        return pd.DataFrame(rows)


# ---------------------------------------------------------------- knobs -> strategy
def _layer_bytes(cfg: RunConfig) -> list[float]:
    """Gathered 16-bit parameter bytes of each layer on one GPU."""
    sz = state_sizes(cfg)
    return [lay.params * sz.param_bytes / sz.params_total for lay in sz.layers]


def param_budget_gib(knobs: Knobs, layer_bytes: list[float]) -> float:
    """GPU parameter budget, GiB: the persistent layers plus ``prefetch_depth + 1`` chunk
    buffers of the largest layer (ProTrain's ``n_buffer``), at most the whole model."""
    kept = sum(layer_bytes[: knobs.persistent_layers])
    buffers = (knobs.prefetch_depth + 1) * max(layer_bytes)
    return min(sum(layer_bytes), kept + buffers) / GiB


def persistent_gpu_fraction(knobs: Knobs, layer_bytes: list[float]) -> float:
    """Share of the parameters in the persistent layers, whose gradients and optimizer state
    ProTrain keeps and updates on the GPU; with every layer persistent, all but the last (a
    strategy's ``optimizer_gpu_fraction`` is below 1)."""
    kept = min(knobs.persistent_layers, len(layer_bytes) - 1)
    return sum(layer_bytes[:kept]) / sum(layer_bytes)


def apply_knobs(base: Strategy, knobs: Knobs, layer_bytes: list[float], name: str = "protrain") -> Strategy:
    """ProTrain's strategy for ``knobs``: ZeRO-3 with parameters, gradients and optimizer state
    in (pinned, as ``base`` says) CPU memory and a CPU optimizer, except the persistent layers'
    gradients and optimizer state, updated on the GPU (module docstring); fields ProTrain does not set
    (sub-group size, pinning, allocator, reuse distance, buckets) come from ``base``."""
    d = base.model_dump()
    d.update(
        name=name, system="protrain", zero_stage=3, optimizer_device="cpu", delayed_param_update=False,
        placement={"params": "cpu", "grads": "cpu", "optimizer_states": "cpu", "activations": "gpu"},
        prefetch_depth=knobs.prefetch_depth, activation_checkpointing=None,
        grad_compression_ratio=1.0, grad_compression_flop_per_param=0.0,
        optimizer_schedule="layerwise" if knobs.overlap_cpu_step else "after-backward",
        optimizer_gpu_fraction=persistent_gpu_fraction(knobs, layer_bytes), optimizer_split="fixed",
    )
    d["policies"].update(
        eviction={"kind": "static", "keep_first": knobs.persistent_layers, "then": "reuse-distance"},
        prefetch={"kind": "lookahead"},
        activations={"kind": "per-block", "offload": knobs.swap_blocks, "recompute": knobs.recompute_blocks,
                     "tier": "cpu"},
        gpu_param_buffer_gib=param_budget_gib(knobs, layer_bytes),
    )
    return Strategy.model_validate(d)


# ---------------------------------------------------------------- evaluation
def _bound(cfg: RunConfig) -> tuple[float | None, OffsimError | None]:
    """(lower bound, None) when the plan fits, else (None, why not)."""
    sz = state_sizes(cfg)
    try:
        check_fit(cfg, sz)
    except OffsimError as exc:
        return None, exc
    return time_lower_bound(cfg, sz).seconds, None


def _simulated(label: str, knobs: Knobs | None, cfg: RunConfig, bound: float | None,
               misfit: OffsimError | None = None) -> Candidate:
    """Simulate ``cfg``; a policy failure or a misfit becomes an infeasible candidate (``misfit``,
    the plan's fit check's error, is kept with it)."""
    kept = misfit if isinstance(misfit, InfeasibleError) else None
    try:
        m = simulate_resolved(cfg).metrics
    except OffsimError as exc:
        return Candidate(label, knobs, "infeasible", str(exc), bound, None, None, None, cfg.strategy, kept)
    if not m.feasible:
        return Candidate(label, knobs, "infeasible", m.infeasible_reason or "", bound, None, None, None,
                         cfg.strategy, kept)
    return Candidate(label, knobs, "ok", "", bound, m.iteration_time_s, m.tokens_per_s, m.peak_bytes.gpu,
                     cfg.strategy)


_Planned = tuple[Knobs, RunConfig | None, float | None, Exception | None]


def _planned(hw: HardwareProfile, wl: Workload, base: Strategy, grid: Grid, iterations: int,
             warmup: int) -> list[_Planned]:
    """Every grid point with its run config and lower bound, or why it cannot run."""
    cfg0 = make_run_config(hw, wl, base, iterations=iterations, warmup_iterations=warmup)
    layer_bytes = _layer_bytes(cfg0)
    layers = state_sizes(cfg0).layers
    out: list[_Planned] = []
    for k in grid.knobs(len(layers), sum(lay.is_block for lay in layers)):
        try:
            cfg = make_run_config(hw, wl, apply_knobs(base, k, layer_bytes), iterations=iterations,
                                  warmup_iterations=warmup)
        except (OffsimError, ValueError) as exc:
            out.append((k, None, None, exc))
            continue
        bound, why = _bound(cfg)
        out.append((k, cfg, bound, why))
    return out


def _resolve(hardware: str | HardwareProfile, workload: str | Workload,
             base: str | Strategy) -> tuple[HardwareProfile, Workload, Strategy]:
    from offsim.config.loading import load_profile, load_workload

    hw = hardware if isinstance(hardware, HardwareProfile) else load_profile(hardware)
    wl = workload if isinstance(workload, Workload) else load_workload(workload)
    st = base if isinstance(base, Strategy) else load_strategy(base)
    return hw, wl, st


def search(hardware: str | HardwareProfile, workload: str | Workload,
           base: str | Strategy = "zero-infinity-cpu", grid: Grid | str = "default", *,
           iterations: int = 3, warmup: int = 1) -> SearchResult:
    """Find the fastest ProTrain configuration of ``grid`` for a profile and workload.

    The base strategy is simulated first as the incumbent; then the grid, checked for fit,
    bounded below by its compiled schedule, and simulated in order of the bound with branch-and-bound
    pruning (module docstring). Returns the best candidate (the base when nothing beats it),
    the base, and every candidate with its status and reason.

    Raises :class:`NothingFitsError` (an :class:`~offsim.errors.InfeasibleError`) when neither
    the base nor any candidate fits, naming the base's reason and the closest miss.
    """
    hw, wl, st = _resolve(hardware, workload, base)
    grid = Grid.named(grid) if isinstance(grid, str) else grid
    base_cfg = make_run_config(hw, wl, st, iterations=iterations, warmup_iterations=warmup)
    base_c = _simulated(f"base: {st.name}", None, base_cfg, *_bound(base_cfg))
    best = base_c if base_c.status == "ok" else None
    out: list[Candidate] = [base_c]
    planned = _planned(hw, wl, st, grid, iterations, warmup)
    for k, cfg, bound, why in sorted(planned, key=lambda p: math.inf if p[2] is None else p[2]):
        if cfg is None or bound is None:
            strategy = cfg.strategy if cfg is not None else st
            misfit = why if isinstance(why, InfeasibleError) else None
            out.append(Candidate(k.label, k, "infeasible", str(why), None, None, None, None, strategy, misfit))
        elif best is not None and best.iteration_time_s is not None and bound >= best.iteration_time_s:
            beaten = f"lower bound {bound:.4g} s >= best simulated {best.iteration_time_s:.4g} s"
            out.append(Candidate(k.label, k, "pruned", beaten, bound, None, None, None, cfg.strategy))
        else:
            c = _simulated(k.label, k, cfg, bound)
            out.append(c)
            if c.status == "ok" and (best is None or _faster(c, best)):
                best = c
    if best is None:
        raise _nothing_fits(out)
    return SearchResult(best, base_c, out)


def _nothing_fits(candidates: list[Candidate]) -> NothingFitsError:
    """The error of a search in which nothing fits: the base's reason, and the closest miss (the
    candidate least over its tier's capacity in the plan's fit check) with its figures."""
    base, others = candidates[0], candidates[1:]
    text = (f"no configuration fits: the base ({base.reason}) and all {len(others)} ProTrain "
            "candidates are infeasible")
    misses = [(c.misfit.need_bytes / c.misfit.capacity_bytes, c.label, c.misfit) for c in candidates
              if c.misfit is not None and c.misfit.capacity_bytes > 0]
    if not misses:
        return NothingFitsError("", math.nan, math.nan, text)
    _, label, e = min(misses, key=lambda m: m[0])
    return NothingFitsError(e.tier, e.need_bytes, e.capacity_bytes, f"{text}; the closest is {label}: {e}")


def _faster(a: Candidate, b: Candidate) -> bool:
    return (a.iteration_time_s or math.inf) < (b.iteration_time_s or math.inf)


def tuned_strategy(result: SearchResult, hardware: str, workload: str,
                   name: str = "protrain-tuned") -> Strategy:
    """The chosen strategy under its own name, with a provenance block naming the search."""
    best = result.best.strategy
    source = (f"offsim tune: ProTrain knob search (Yang et al., arXiv 2406.08334) on {hardware} / "
              f"{workload}, base {result.base.strategy.name}; chosen: {result.best.label}")
    notes = "chosen by offsim's own simulation (offsim.search.protrain); see its module docstring"
    prov = Provenance(kind="derived", source=source, date=datetime.date.today().isoformat(), notes=notes)
    about = f"ProTrain configuration tuned by offsim: {result.best.label}"
    return best.model_copy(update={"name": name, "provenance": prov, "description": about})
