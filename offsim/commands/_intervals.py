"""``--samples N``: the draws of the assumed inputs a command runs, and how they are printed
(p10/p50/p90 of iteration time and peak memory per tier, the draws that do not fit, the ranges
that applied). The intervals themselves are :mod:`offsim.intervals`."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.markup import escape
from rich.table import Table

from offsim.commands._common import PEAK_LABELS, configured, console, fail, gib, say

if TYPE_CHECKING:
    import pandas as pd

    from offsim.config.run import RunConfig
    from offsim.intervals import RunIntervals
    from offsim.results import RunResult
    from offsim.validation_intervals import FigureIntervals

#: Draws that do not fit printed one per line; the rest are counted (``--json`` lists all).
MISFIT_LINES = 5


def sample_run(cfg: RunConfig, samples: int, seed: int, assumptions: Path | None, *,
               progress: bool) -> RunIntervals:
    """``samples`` draws of the assumed inputs of ``cfg`` (progress on stderr); bad input exits 2."""
    from offsim.errors import OffsimError
    from offsim.intervals import run_intervals
    from offsim.report.progress import progress_bar
    from offsim.validation_intervals import default_assumptions_path, load_assumptions

    try:
        ranges = load_assumptions(assumptions or default_assumptions_path())
        with progress_bar(samples, "sampling the assumed inputs", enabled=progress) as advance:
            return run_intervals(cfg, ranges, samples, seed, on_draw=advance)
    except OffsimError as exc:
        fail(str(exc))


def _seconds(x: float | None) -> str:
    return "-" if x is None else f"{x:.4g} s"


def intervals_table(iv: RunIntervals, result: RunResult) -> Table:
    """The run's own value (the profile as written) beside p10 / p50 / p90 of the iteration time
    and of each tier's peak (tiers the run lacks left out)."""
    t = Table(title=f"p10 / p50 / p90 over the {iv.fits} of {iv.samples} draws of the assumed inputs "
                    f"that fit (seed {iv.seed})")
    for col in ("metric", "as written", "p10", "p50", "p90"):
        t.add_column(col, justify="left" if col == "metric" else "right")
    m = result.metrics
    fits = m.feasible
    t.add_row("iteration time", _seconds(m.iteration_time_s) if fits else "does not fit",
              *(map(_seconds, iv.iteration_time_s) if iv.iteration_time_s else ["-"] * 3))
    for tier in iv.peak_bytes or dict.fromkeys(("gpu", "host_pinned", "host")):
        q = iv.peak_bytes.get(tier)
        if (q and q[2]) or configured(result.config, tier):
            t.add_row(PEAK_LABELS.get(tier, f"peak {tier}"), gib(getattr(m.peak_bytes, tier)) if fits else "-",
                      *(map(gib, q) if q else ["-"] * 3))
    return t


def intervals_lines(iv: RunIntervals, assumptions: Path | None) -> list[str]:
    """Fits in k of N; each draw that does not fit (tier, reason, factors; or the rule of the
    files its values break); the ranges applied."""
    lines = [f"fits in {iv.fits} of {iv.samples} draws of the assumed inputs"]
    choice = {r.id for r in iv.ranges if r.choices is not None}
    for m in iv.misfits[:MISFIT_LINES]:
        drawn = ", ".join(f"{name} = {f}" if name in choice else f"{name} x{f:.3g}" for name, f in m.factors)
        tier = "" if m.tier is None else f" ({m.tier})"  # None: its values break a rule of the files
        lines.append(f"  draw {m.draw} does not fit{tier}: {m.reason}; drawn: {drawn}")
    if len(iv.misfits) > MISFIT_LINES:
        lines.append(f"  ... and {len(iv.misfits) - MISFIT_LINES} more draws that do not fit (--json lists all)")
    where = f"{assumptions or 'validation/assumptions.yaml'} and the files' own 'assumed'"
    lines.append(f"ranges that applied ({where}; each factor drawn log-uniformly, sources in --json):"
                 if iv.ranges else f"no range of {where} applies to this configuration")
    for r in iv.ranges:
        values = ", ".join(f"{p} = {_value(v)}" for p, v in r.values)
        origin = "" if r.origin == "assumptions file" else f" ({r.origin})"
        lines.append(f"  {r.id}{origin} {_range_text(r.scale, r.choices, r.weights)}: {values}")
    return lines


def _value(v: Any) -> str:
    if v is None:
        return "curve"
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def _range_text(scale: tuple[float, float] | None, choices: tuple[Any, ...] | None,
                weights: tuple[float, ...] | None) -> str:
    """``x0.8-x1.08``, or ``one of a, b`` (with ``weights 12:23`` when not uniform)."""
    if choices is None:
        low, high = scale or (1.0, 1.0)
        return f"x{low:.3g}-x{high:.3g}"
    weighted = "" if weights is None else " weights " + ":".join(f"{w:g}" for w in weights)
    return "one of " + ", ".join(map(str, choices)) + weighted


def uncovered_lines(figures: list[FigureIntervals]) -> list[str]:
    """One line per validation figure that an interval leaves out: on which side of which
    source's interval the measured value lies and which assumed inputs move the figure, or that
    none does (:meth:`~offsim.validation_intervals.FigureIntervals.uncovered`)."""
    out = [(f, why) for f in figures if f.role == "validation" and (why := f.uncovered()) is not None]
    if not out:
        return []
    lines = ["figures an interval leaves out, and the assumed inputs that move them (rank correlation over the draws):"]
    lines.extend(f"  {f.case_id} {f.metric}: {why}" for f, why in out)
    return lines


def print_intervals(iv: RunIntervals, result: RunResult, assumptions: Path | None) -> None:
    """The intervals table and the lines under it."""
    console.print(intervals_table(iv, result))
    for line in intervals_lines(iv, assumptions):
        say(line)


# ----------------------------------------------------------------------------- compare --samples
def sample_variants(variants: list[tuple[Any, Any, Any]], samples: int, seed: int, assumptions: Path | None,
                    steps: tuple[int, int], *, progress: bool) -> list[RunIntervals | None]:
    """Each variant (hardware, workload, strategy) of ``offsim compare``, run for ``steps``
    (iterations, warm-up), at the same ``samples`` draws (one seed; the same ranges apply to every
    variant of one profile and workload, so draw i is the same machine for all: the comparison is
    paired). A variant whose policy errs gets None; bad input exits 2."""
    from offsim.config.run import make_run_config
    from offsim.errors import OffsimError, PolicyError
    from offsim.intervals import run_intervals
    from offsim.report.progress import progress_bar
    from offsim.validation_intervals import default_assumptions_path, load_assumptions

    found: list[RunIntervals | None] = []
    try:
        ranges = load_assumptions(assumptions or default_assumptions_path())
        with progress_bar(samples * len(variants), "sampling the assumed inputs", enabled=progress) as advance:
            for hw, wl, st in variants:
                cfg = make_run_config(hw, wl, st, iterations=steps[0], warmup_iterations=steps[1])
                try:
                    found.append(run_intervals(cfg, ranges, samples, seed, on_draw=advance))
                except PolicyError:  # its point row says why
                    found.append(None)
    except OffsimError as exc:
        fail(str(exc))
    return found


def fastest_draws(groups: list[Any], found: list[RunIntervals | None]) -> list[int | None]:
    """Per variant, in how many draws it is the fastest of the variants of its group (``groups``:
    a key per variant, e.g. its budgets; a tie within 1e-9 counts for each variant that ties);
    None where the group's variants did not see the same draws (other ranges applied) or the
    variant has no draws."""
    counts: list[int | None] = [None] * len(found)
    for key in dict.fromkeys(groups):
        members = {i: iv for i, (g, iv) in enumerate(zip(groups, found, strict=True)) if g == key and iv is not None}
        first = next(iter(members.values()), None)
        if first is None or any(iv.factors != first.factors for iv in members.values()):
            continue
        wins = dict.fromkeys(members, 0)
        for d in range(first.samples):
            fits = {i: t for i, iv in members.items() if (t := iv.draw_times_s[d]) is not None}
            best = min(fits.values(), default=math.inf)
            for i, t in fits.items():
                wins[i] += t <= best * (1 + 1e-9)
        for i, w in wins.items():
            counts[i] = w
    return counts


def interval_columns(table: pd.DataFrame, found: list[RunIntervals | None]) -> pd.DataFrame:
    """``table`` (one row per variant, in ``found``'s order) with the iteration time's p10/p50/p90
    over the draws that fit, ``fits_draws`` ("k/N") and ``fastest_draws`` within its budgets."""
    out = table.copy()
    qs = [iv.iteration_time_s if iv is not None else None for iv in found]
    for i, name in enumerate(("p10", "p50", "p90")):
        out[f"iteration_{name}_s"] = [q[i] if q else math.nan for q in qs]
    out["fits_draws"] = [f"{iv.fits}/{iv.samples}" if iv is not None else "-" for iv in found]
    budgets = [(str(a), str(b)) for a, b in zip(table.get("cache_gib", [None] * len(table)),
                                                table.get("dram_cache_gib", [None] * len(table)), strict=True)]
    out["fastest_draws"] = fastest_draws(budgets, found)
    return out


def variant_intervals_table(table: pd.DataFrame, samples: int, seed: int) -> Table:
    """One row per variant: its time as written beside p10 / p50 / p90 over the draws that fit,
    in how many draws it fits and in how many it is the fastest of its budgets."""
    t = Table(title=f"each variant at the same {samples} draws of the assumed inputs (seed {seed})")
    for col in ("variant", "GPU buf GiB", "DRAM GiB", "iteration s", "p10 s", "p50 s", "p90 s", "fits",
                "fastest"):
        t.add_column(col, justify="left" if col == "variant" else "right")

    def num(v: Any) -> str:
        return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.4g}"

    for r in table.to_dict("records"):
        t.add_row(escape(str(r["variant"])), num(r.get("cache_gib")), num(r.get("dram_cache_gib")),
                  num(r.get("iteration_time_s")) if r.get("feasible") else "does not fit",
                  num(r["iteration_p10_s"]), num(r["iteration_p50_s"]), num(r["iteration_p90_s"]),
                  str(r["fits_draws"]), num(r["fastest_draws"]))
    return t
