"""``--samples N``: the draws of the assumed inputs a command runs, and how they are printed
(p10/p50/p90 of iteration time and peak memory per tier, the draws that do not fit, the ranges
that applied). The intervals themselves are :mod:`offsim.intervals`."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from rich.table import Table

from offsim.commands._common import PEAK_LABELS, configured, console, fail, gib, say

if TYPE_CHECKING:
    from offsim.config.run import RunConfig
    from offsim.intervals import RunIntervals
    from offsim.results import RunResult

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
    """Fits in k of N; each draw that does not fit (tier, reason, factors); the ranges applied."""
    lines = [f"fits in {iv.fits} of {iv.samples} draws of the assumed inputs"]
    for m in iv.misfits[:MISFIT_LINES]:
        drawn = ", ".join(f"{name} x{f:.3g}" for name, f in m.factors)
        lines.append(f"  draw {m.draw} does not fit ({m.tier}): {m.reason}; drawn: {drawn}")
    if len(iv.misfits) > MISFIT_LINES:
        lines.append(f"  ... and {len(iv.misfits) - MISFIT_LINES} more draws that do not fit (--json lists all)")
    where = f"{assumptions or 'validation/assumptions.yaml'} and the files' own 'assumed'"
    lines.append(f"ranges that applied ({where}; each factor drawn log-uniformly, sources in --json):"
                 if iv.ranges else f"no range of {where} applies to this configuration")
    for r in iv.ranges:
        values = ", ".join(f"{p} = {'curve' if v is None else f'{v:.4g}'}" for p, v in r.values)
        origin = "" if r.origin == "assumptions file" else f" ({r.origin})"
        lines.append(f"  {r.id}{origin} x{r.scale[0]:.3g}-x{r.scale[1]:.3g}: {values}")
    return lines


def print_intervals(iv: RunIntervals, result: RunResult, assumptions: Path | None) -> None:
    """The intervals table and the lines under it."""
    console.print(intervals_table(iv, result))
    for line in intervals_lines(iv, assumptions):
        say(line)
