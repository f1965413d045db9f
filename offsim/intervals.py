"""Prediction intervals of one run (issue 23 part 3): ``offsim run --samples N``.

The inputs of a profile, workload or strategy that are assumptions rather than measurements carry
a range (``validation/assumptions.yaml``, each with its source in the hardware references). A run
with ``--samples N`` simulates ``N`` Latin-hypercube draws of the ranges that apply to its
configuration (:func:`offsim.validation_intervals.drawn_configs`, the draws ``offsim validate
--samples`` makes for a case) and reports:

* p10 / p50 / p90 of the iteration time and of the peak bytes of each memory tier over the draws
  that fit (a draw that does not fit is not simulated: it has neither an iteration time nor a
  simulated peak; the planner's need its verdict compared is not mixed in: it counts what the
  allocator needs beyond the simulated peak, 1.9 and 1.3 GiB more on the RTX 4090 profile for
  qwen3-8b with ZeRO-Offload and llama2-7b with ZeRO-Infinity to CPU);
* "fits in k of N draws", and for each draw that does not fit the tier, the verdict's reason (need,
  capacity, largest items) and the factors the draw applied (the why);
* each range that applied: its id, the factor range, the values of the run it scales, its source.

The ranges are those a profile or a workload declares for its own fields (``assumed``,
:mod:`offsim.config.assumed`), then those of the assumptions file (the shipped
``validation/assumptions.yaml`` unless another is given) on the fields the files do not declare.
A range of that file may be a discrete choice (``choices``, drawn uniformly or by ``weights``:
a strategy's DeepSpeed version switch, for one), reported with the value each draw chose.

Quantiles are linear between order statistics (:func:`offsim.validation_intervals.quantile`,
numpy's default).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from offsim.config.run import RunConfig
from offsim.validation_intervals import (
    DECLARING,
    HIGH_Q,
    LOW_Q,
    MID_Q,
    Assumption,
    BrokenRule,
    Models,
    applies,
    drawn_configs,
    quantile,
    run_value,
    simulate_draw,
    with_declared,
)

#: The memory tiers of :class:`offsim.metrics.PeakBytes`, in its order.
TIERS = ("gpu", "host_pinned", "host", "nvme", "pfs")

Quantiles = tuple[float, float, float]  # p10, p50, p90


@dataclass(frozen=True)
class RangeUsed:
    """One assumed range that applied to the run, with the values of the run it scales."""

    id: str
    scale: tuple[float, float] | None  # the factor's range, drawn log-uniformly (None: a choice)
    values: tuple[tuple[str, Any], ...]  # (path, the run's value; None for a curve)
    source: str
    origin: str = "assumptions file"  # or "hardware profile" / "workload": the file's own ``assumed``
    choices: tuple[Any, ...] | None = None  # a discrete range: the values drawn among
    weights: tuple[float, ...] | None = None  # their weights (None: uniform)

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable form."""
        return {"id": self.id, "scale": None if self.scale is None else list(self.scale),
                "choices": None if self.choices is None else list(self.choices),
                "weights": None if self.weights is None else list(self.weights),
                "values": dict(self.values), "source": self.source, "origin": self.origin}


@dataclass(frozen=True)
class Misfit:
    """A draw that does not fit: which tier, the verdict's reason, and the factors drawn; or the
    rule of the input files its values break (``rule``; ``tier`` None), which no run could pass."""

    draw: int  # 1-based
    tier: str | None
    reason: str
    factors: tuple[tuple[str, Any], ...]  # (range id, factor; or the value chosen)
    rule: BrokenRule | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable form."""
        return {"draw": self.draw, "tier": self.tier, "reason": self.reason, "factors": dict(self.factors),
                "rule": None if self.rule is None else self.rule.to_dict()}


@dataclass(frozen=True)
class RunIntervals:
    """p10/p50/p90 of one configuration over draws of its assumed inputs."""

    samples: int
    seed: int
    fits: int  # draws that fit
    ranges: tuple[RangeUsed, ...]
    iteration_time_s: Quantiles | None  # over the draws that fit; None when none fits
    peak_bytes: dict[str, Quantiles]  # tier -> over the draws that fit
    misfits: tuple[Misfit, ...]
    factors: tuple[tuple[tuple[str, Any], ...], ...] = ()  # per draw: (range id, factor or choice)
    draw_times_s: tuple[float | None, ...] = ()  # per draw: its iteration time (None: does not fit)

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable form (the ``intervals`` of ``offsim run --samples N --json``)."""
        def q(v: Quantiles | None) -> dict[str, float] | None:
            return None if v is None else dict(zip(("p10", "p50", "p90"), v, strict=True))

        return {"samples": self.samples, "seed": self.seed, "fits": self.fits,
                "iteration_time_s": q(self.iteration_time_s),
                "peak_bytes": {t: q(v) for t, v in self.peak_bytes.items()},
                "misfits": [m.to_dict() for m in self.misfits],
                "ranges": [r.to_dict() for r in self.ranges],
                "factors": [dict(f) for f in self.factors], "draw_times_s": list(self.draw_times_s)}


def quantiles(values: Sequence[float]) -> Quantiles | None:
    """p10, p50, p90 of ``values`` (None when empty)."""
    if not values:
        return None
    return quantile(values, LOW_Q), quantile(values, MID_Q), quantile(values, HIGH_Q)


def models_of(cfg: RunConfig) -> Models:
    """The profile, workload and strategy a run configuration holds, as the draws perturb them."""
    return {"hardware": cfg.hardware, "workload": cfg.workload, "strategy": cfg.strategy}


def ranges_used(models: Models, assumptions: Sequence[Assumption]) -> list[RangeUsed]:
    """The ranges that apply to ``models``, each with the values it scales (the CPU Adam rate as
    the node runs it: per-rank rate times ranks, as the draws scale it)."""
    out = []
    for a in assumptions:
        if not applies(a, models):
            continue
        values: list[tuple[str, Any]] = []
        for p in a.paths:
            v = run_value(models, p)
            number = isinstance(v, int | float) and not isinstance(v, bool)
            values.append((p, float(v) if number else v if a.is_choice else None))
        origin = DECLARING.get(a.id.split(":")[0], "assumptions file")
        out.append(RangeUsed(a.id, a.scale, tuple(values), " ".join(a.source.split()), origin,
                             None if a.choices is None else tuple(a.choices),
                             None if a.weights is None else tuple(a.weights)))
    return out


def _misfit(index: int, metrics: Any, factors: tuple[tuple[str, Any], ...]) -> Misfit:
    return Misfit(index, metrics.infeasible_tier, str(metrics.infeasible_reason), factors)


def run_intervals(cfg: RunConfig, assumptions: Sequence[Assumption], samples: int, seed: int = 0,
                  on_draw: Callable[[], None] | None = None) -> RunIntervals:
    """Simulate ``samples`` draws of the assumed inputs that apply to ``cfg`` (its iterations and
    warm-up kept): the ranges its profile and workload declare, then those of ``assumptions`` on
    other fields; take p10/p50/p90 of the iteration time and of each tier's peak bytes.
    Reproducible for a ``seed``; ``on_draw`` is called after each draw (progress)."""
    models = models_of(cfg)
    assumptions = with_declared(models, assumptions)
    used = ranges_used(models, assumptions)
    chosen = [a for a in assumptions if any(a.id == r.id for r in used)]
    times: list[float] = []
    peaks: dict[str, list[float]] = {t: [] for t in TIERS}
    misfits = []
    drawn_factors = []
    draw_times: list[float | None] = []
    draws = drawn_configs(models, chosen, samples, str(seed), iterations=cfg.iterations,
                          warmup=cfg.warmup_iterations)
    for index, (factors, drawn) in enumerate(draws, start=1):
        drawn_factors.append(tuple((a.id, f) for a, f in factors))
        m = simulate_draw(drawn)
        if isinstance(m, BrokenRule):
            draw_times.append(None)
            misfits.append(Misfit(index, None, m.text(), drawn_factors[-1], m))
        elif m.feasible:
            draw_times.append(m.iteration_time_s)
            times.extend([] if m.iteration_time_s is None else [m.iteration_time_s])
            for t in TIERS:
                peaks[t].append(float(getattr(m.peak_bytes, t)))
        else:
            draw_times.append(None)
            misfits.append(_misfit(index, m, drawn_factors[-1]))
        if on_draw is not None:
            on_draw()
    peak_q = {t: q for t, v in peaks.items() if (q := quantiles(v)) is not None}
    return RunIntervals(samples, seed, samples - len(misfits), tuple(used), quantiles(times), peak_q,
                        tuple(misfits), tuple(drawn_factors), tuple(draw_times))
