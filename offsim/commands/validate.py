"""``offsim validate``: predicted vs measured on published cases (and, with --real, on a real run)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import typer
from rich.markup import escape
from rich.table import Table

from offsim.commands import _options as opt
from offsim.commands._common import (
    ExitCode,
    check_out_file,
    console,
    fail,
    print_json,
    say,
    strict_json,
)

if TYPE_CHECKING:  # the validation module imports the simulator: loaded only when cases run
    from offsim.validation import CaseResult, Summary
    from offsim.validation_intervals import CoverageStats, Draws, FigureIntervals

#: Issue 23's target for the share of measured values within their p10-p90 interval.
TARGET_COVERAGE = 0.80


def _fmt(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:.4g}"


Holdout = Literal["source", "case"]


def validate(
    cases: Annotated[Path | None, typer.Option(
        help="cases YAML (default: the shipped validation/cases.yaml)")] = None,
    out: Annotated[Path | None, opt.out(
        "write the table as CSV here, intervals included (with --real: the report as JSON)", "--csv")] = None,
    strict: Annotated[bool, typer.Option(hidden=True, help="no effect: a miss always exits 1")] = False,
    samples: opt.Samples = 0,
    assumptions: opt.Assumptions = None,
    holdout: Annotated[str, typer.Option(
        help="residuals an interval may use: 'source' leaves out the case's whole source, 'case' the case")
    ] = "source",
    seed: opt.Seed = 0,
    real: Annotated[bool, typer.Option("--real", help="run the real offloaded trainer and compare")] = False,
    hardware: opt.Hardware = opt.HARDWARE,
    workload: opt.Workload = opt.WORKLOAD,
    layers: Annotated[int, typer.Option(min=1, help="(--real) blocks in the real model")] = 4,
    device: Annotated[str, typer.Option(
        help="(--real) torch device: cuda, or cpu to check the mechanics")] = "cuda",
    iterations: Annotated[int, typer.Option(min=1, help="(--real) timed iterations")] = 5,
    as_json: opt.Json = False,
    quiet: opt.Quiet = False,
) -> None:
    """Simulate each published case and print predicted vs measured with the error and a
    prediction interval per figure (p10-p90 from the held-out errors of other sources and, with
    --samples, from the assumed inputs' ranges), with their coverage; exit 1 when a case misses its
    tolerance. With --real, train for real (PyTorch) on -H/-w and compare per phase with the
    simulation of the same setup.

    Under the table, each verdict of fit that is judged (an out-of-memory case, a verdict-only
    case, a rejection, a wrong verdict) or near the edge (a marginal GPU) is stated with the GPU's
    margin, GiB to spare or short with its uncertainty, and the tier that rejects the run."""
    check_out_file(out)
    if holdout not in ("source", "case"):
        fail(f"--holdout {holdout}: give 'source' or 'case'")
    if real:
        _validate_real(hardware, workload, layers, device, iterations, out, as_json=as_json, quiet=quiet)
        return
    results, draws = _run_cases(cases, samples, assumptions, seed, progress=not (quiet or as_json))
    figures, stats = _intervals(results, draws, holdout)  # type: ignore[arg-type]
    rows = _rows(results, figures)
    summary = _summarize(results)
    if out is not None:
        import pandas as pd

        pd.DataFrame(rows).to_csv(out, index=False)
    if as_json:
        print_json({"cases": rows, "summary": summary.to_dict(), "within": summary.within, "total": summary.total,
                    "intervals": {"samples": samples, "holdout": holdout, "target_coverage": TARGET_COVERAGE,
                                  "coverage": [c.to_dict() for c in stats]}})
    else:
        if not quiet:
            _print_tables(rows, results, summary, figures, stats)
        for line in [*_summary_lines(summary), *_coverage_lines(stats, samples, holdout)]:
            say(line)
    if not summary.ok:
        raise typer.Exit(ExitCode.NO)


def _print_tables(rows: list[dict[str, Any]], results: list[CaseResult], summary: Summary,
                  figures: list[FigureIntervals], stats: list[CoverageStats]) -> None:
    """The cases with the verdicts of fit under them, the medians, the intervals and their coverage."""
    console.print(_cases_table(rows))
    for line in verdict_lines(results):
        console.print(escape(line), highlight=False, soft_wrap=True)
    console.print(_medians_table(summary))
    console.print(_intervals_table(figures))
    console.print(_coverage_table(stats))
    from offsim.commands._intervals import uncovered_lines

    for line in uncovered_lines(figures):
        console.print(escape(line), highlight=False, soft_wrap=True)


def _run_cases(cases: Path | None, samples: int, assumptions: Path | None, seed: int, *, progress: bool
               ) -> tuple[list[CaseResult], dict[str, Draws]]:
    """Simulate and judge every case of ``cases`` (default: the shipped file), and with ``samples``
    draw each case's assumed inputs; a bad file exits 2."""
    from offsim.errors import OffsimError
    from offsim.report.progress import progress_bar
    from offsim.validation import default_cases_path, load_cases, run_case
    from offsim.validation_intervals import case_draws, default_assumptions_path, load_assumptions

    try:
        loaded = load_cases(cases or default_cases_path())
        ranges = load_assumptions(assumptions or default_assumptions_path()) if samples else []
        results, draws = [], {}
        with progress_bar(len(loaded) * (1 + samples), "simulating cases", enabled=progress) as advance:
            for c in loaded:
                results.append(run_case(c))
                advance(1, f"simulating {c.id}")
                if samples:
                    draws[c.id] = case_draws(c, ranges, samples, seed, on_draw=advance)
        return results, draws
    except OffsimError as exc:
        fail(str(exc))


def _intervals(results: list[CaseResult], draws: dict[str, Draws], holdout: Holdout
               ) -> tuple[list[FigureIntervals], list[CoverageStats]]:
    from offsim.validation_intervals import coverage, figure_intervals

    figures = figure_intervals(results, draws, holdout)
    return figures, coverage(figures)


def _rows(results: list[CaseResult], figures: list[FigureIntervals]) -> list[dict[str, Any]]:
    """One row per figure (or verdict): the judge's columns, then each source's interval."""
    by_figure = {(f.case_id, f.metric): f.row() for f in figures}
    rows = []
    for r in results:
        for row in r.rows():
            extra = by_figure.get((row["id"], row["metric"]), {})
            rows.append({**row, **{k: v for k, v in extra.items() if k not in row}})
    return rows


def _summarize(results: list[CaseResult]) -> Summary:
    from offsim.validation import summarize

    return summarize(results)


def _pct(x: float | None, signed: bool = True) -> str:
    if x is None:
        return "-"
    return f"{100 * x:+.1f}%" if signed else f"{100 * x:.1f}%"


def _cases_table(rows: list[dict[str, Any]]) -> Table:
    """Predicted against measured, one row per published number (or verdict)."""
    t = Table(title="offsim vs published measurements")
    numeric = ("measured", "predicted", "error", "tolerance")
    t.add_column("case", overflow="fold")
    for col in ("verdict", "metric", *numeric, "ok"):
        t.add_column(col, justify="right" if col in numeric else "left")
    for r in rows:
        tol = "-" if r["tolerance"] is None else f"±{100 * r['tolerance']:.0f}%"
        ok = "[green]yes[/]" if r["within"] else "[red]no[/]"
        verdict = f"{r['outcome']}, {'fits' if r['feasible'] else 'rejected'}"
        verdict = verdict if r["verdict_ok"] else f"[red]{verdict}[/]"
        case = escape(r["id"]) + (" (cal.)" if r["role"] == "calibration" else "")
        t.add_row(case, verdict, escape(r["metric"]), _fmt(r["measured"]), _fmt(r["predicted"]),
                  _pct(r["error"]), tol, ok)
    return t


def is_verdict_case(r: CaseResult) -> bool:
    """A case whose verdict of fit is judged or near the edge: a verdict only (no figure), an
    outcome of out of memory, a run offsim rejects, a wrong verdict, or a GPU that is marginal
    (:class:`~offsim.plan.footprint.GpuMargin`: its sentence ends with the verdict)."""
    from offsim.plan.footprint import GpuVerdict
    from offsim.validation import Outcome

    marginal = r.gpu_margin is not None and r.gpu_margin.endswith(GpuVerdict.MARGINAL.value)
    return (not r.measures or r.case.outcome is Outcome.OOM or not r.feasible or not r.verdict_ok
            or marginal)


def verdict_lines(results: list[CaseResult]) -> list[str]:
    """Under the cases table, one line per verdict case (:func:`is_verdict_case`): what happened
    (ran or out of memory), offsim's verdict and whether it is right, the GPU verdict with its
    margin (gpu_memory.md §4, what it counts said once above) and, where another tier rejects the
    run, that tier's need and capacity."""
    cases = [r for r in results if is_verdict_case(r)]
    if not cases:
        return []
    from offsim.plan.footprint import FRAGMENTATION_SHARE

    lines = [f"verdicts of fit (judged, or near the edge), with the GPU's margin per rank (counting "
             f"{FRAGMENTATION_SHARE:.0%} allocator fragmentation and the memory outside PyTorch's pool, "
             f"gpu_memory.md §4) and the tier that rejects:"]
    for r in cases:
        verdict = "offsim accepts" if r.feasible else "offsim rejects"
        right = "right" if r.verdict_ok else "WRONG"
        other = r.infeasible_reason if not r.feasible and not (r.infeasible_reason or "").startswith("gpu") else None
        why = "" if other is None else f"; {other.split(' (')[0]}"
        lines.append(f"  {r.case.id}: {r.case.outcome}, {verdict} ({right}): GPU {_short_margin(r.gpu_margin)}{why}")
    return lines


def _short_margin(sentence: str | None) -> str:
    """The GPU margin's sentence (:meth:`~offsim.plan.footprint.GpuMargin.sentence`) without what it
    counts (said once above the lines): ``short by 0.52 ± 1.25 GiB: marginal``."""
    if sentence is None:
        return "-"
    head, counting, tail = sentence.partition(" counting ")
    return f"{head}: {tail.rsplit(': ', 1)[-1]}" if counting else sentence


def _medians_table(summary: Summary) -> Table:
    """Median relative error per case, by kind of figure (validation cases only)."""
    t = Table(title="median error per case (time or bytes; negative = offsim too fast / too small)")
    for col in ("figure", "cases", "median |error|", "median signed"):
        t.add_column(col, justify="left" if col == "figure" else "right")
    for k in summary.kinds:
        if k.cases:
            t.add_row(str(k.kind), str(k.cases), _pct(k.median_abs_error, signed=False), _pct(k.median_signed_error))
    return t


def _summary_lines(summary: Summary) -> list[str]:
    """The verdicts of fit that were wrong, the orderings and the count of misses."""
    lines = [f"wrong verdicts of fit: {len(summary.rejected_but_ran)} ran but rejected"
             + (f" ({', '.join(summary.rejected_but_ran)})" if summary.rejected_but_ran else "")
             + f"; {len(summary.accepted_but_oom)} ran out of memory but accepted"
             + (f" ({', '.join(summary.accepted_but_oom)})" if summary.accepted_but_oom else "")]
    for o in summary.orderings:
        verdict = "same order" if o.same else "WRONG order" if o.discordant_pairs else "NOT JUDGED"
        detail = "" if o.same else (f"; inverted: {', '.join(f'{a} > {b}' for a, b in o.discordant_pairs)}"
                                    if o.discordant_pairs else f"; not judged: {', '.join(o.unjudged)}")
        lines.append(f"ordering {o.group}: {verdict} (measured fastest first: {' > '.join(o.measured_order)}){detail}")
    lines.append(f"{summary.within} of {summary.total} cases within tolerance "
                 f"({summary.calibration} are calibration checks)"
                 + (f"; missed: {', '.join(summary.misses)}" if summary.misses else ""))
    return lines


def _span(f: FigureIntervals, source: str) -> str:
    iv = f.intervals.get(source)
    if iv is None:
        return "-"
    mark = "[green]in[/]" if iv.covers(f.measured) else "[red]out[/]"
    return f"{_fmt(iv.low)} - {_fmt(iv.high)} {mark}"


def _intervals_table(figures: list[FigureIntervals]) -> Table:
    """p10 - p90 per figure and source, and whether the measured value is inside."""
    t = Table(title="prediction intervals, p10 - p90 (model: held-out errors of other sources; "
                    "inputs: draws of the assumed ranges)")
    sources = [s for s in ("model", "inputs", "combined") if any(s in f.intervals for f in figures)]
    for col in ("case", "metric", "measured", "predicted", *sources):
        t.add_column(col, overflow="fold", justify="left" if col in ("case", "metric") else "right")
    for f in figures:
        case = escape(f.case_id) + (" (cal.)" if f.role == "calibration" else "")
        t.add_row(case, escape(f.metric), _fmt(f.measured), _fmt(f.predicted), *(_span(f, s) for s in sources))
    return t


def _coverage_table(stats: list[CoverageStats]) -> Table:
    """Coverage and sharpness per source and kind of figure (validation cases only)."""
    t = Table(title="coverage of the p10 - p90 intervals (validation figures; sharpness = median p90/p10)")
    for col in ("source", "figures", "covered", "coverage", "sharpness", "no interval"):
        t.add_column(col, justify="left" if col == "source" else "right")
    for c in stats:
        if c.figures or c.kind == "all":
            t.add_row(f"{c.source}, {c.kind}", str(c.figures), str(c.covered), _pct(c.coverage, signed=False),
                      "-" if c.sharpness is None else f"{c.sharpness:.2f}", str(c.without))
    return t


def _coverage_lines(stats: list[CoverageStats], samples: int, holdout: str) -> list[str]:
    """One line per source over all validation figures, against issue 23's target."""
    lines = []
    for c in stats:
        if c.kind != "all":
            continue
        how = {"model": f"held-out errors of other {'sources' if holdout == 'source' else 'cases'}",
               "inputs": f"{samples} draws of the assumed inputs per case",
               "combined": "both"}[c.source]
        if not c.figures:
            lines.append(f"interval coverage ({c.source}: {how}): no figure has one"
                         + ("" if samples or c.source == "model" else " (give --samples N)"))
            continue
        verdict = "meets" if (c.coverage or 0.0) >= TARGET_COVERAGE else "misses"
        lines.append(f"interval coverage ({c.source}: {how}): {c.covered} of {c.figures} figures "
                     f"({_pct(c.coverage, signed=False)}, {verdict} the {TARGET_COVERAGE:.0%} target), "
                     f"sharpness {c.sharpness:.2f}; {c.without} without an interval")
    return lines


def _validate_real(hardware: str, workload: str, layers: int, device: str, iterations: int,
                   out: Path | None, *, as_json: bool = False, quiet: bool = False) -> None:
    from offsim.calibrate.real_trainer import RealShape, run_real_training
    from offsim.config.loading import load_profile, load_workload
    from offsim.errors import OffsimError
    from offsim.real_validation import TARGET_ERROR, compare, simulate_twin

    try:
        import torch
    except ImportError:
        fail("--real needs PyTorch (pip install 'offsim[calibrate]')")
    try:
        profile, wl = load_profile(hardware), load_workload(workload)
        predicted = simulate_twin(profile, wl, layers)
    except OffsimError as exc:
        fail(str(exc))
    if not predicted.feasible:
        fail(f"the simulated twin does not fit: {predicted.metrics.infeasible_reason}", ExitCode.NO)
    if device.startswith("cuda") and not torch.cuda.is_available():
        fail("no CUDA device: run on a GPU machine, or pass --device cpu to check the mechanics only")
    shape = RealShape.from_workload(wl, layers=layers)
    measured = run_real_training(shape, device=device, iterations=iterations)
    rows = compare(measured, predicted)
    it = rows[-1]["error"]
    verdict = "within" if it is not None and abs(it) <= TARGET_ERROR else "outside"
    doc = {"hardware": profile.name, "workload": wl.name, "layers": layers, "device": device,
           "rows": rows, "measured": measured, "target_error": TARGET_ERROR, "iteration": verdict}
    if out is not None:
        out.write_text(strict_json(doc) + "\n")
    if as_json:
        print_json(doc)
    else:
        if not quiet:
            console.print(_real_table(rows, f"real vs simulated: {layers} blocks of {wl.name} on {device}, "
                                            f"profile {profile.name}"))
        say(f"iteration time {verdict} the {TARGET_ERROR:.0%} target")
    if verdict == "outside" and device.startswith("cuda"):  # on the CPU it checks the mechanics only
        raise typer.Exit(ExitCode.NO)


def _real_table(rows: list[dict[str, Any]], title: str) -> Table:
    t = Table(title=escape(title))
    for col in ("phase", "measured s", "predicted s", "error"):
        t.add_column(col)
    for r in rows:
        err = "-" if r["error"] is None else f"{100 * r['error']:+.1f}%"
        t.add_row(r["what"], f"{r['measured_s']:.4g}", f"{r['predicted_s']:.4g}", err)
    return t


def register(app: typer.Typer) -> None:
    """Add ``validate`` to the CLI."""
    app.command()(validate)
