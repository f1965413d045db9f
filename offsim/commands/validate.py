"""``offsim validate``: predicted vs measured on published cases (and, with --real, on a real run)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from offsim.commands._common import (
    DEFAULT_HARDWARE,
    DEFAULT_WORKLOAD,
    EXIT_NO,
    HardwareOpt,
    JsonOpt,
    QuietOpt,
    WorkloadOpt,
    check_out_file,
    console,
    fail,
    print_json,
    say,
    strict_json,
)

if TYPE_CHECKING:  # the validation module imports the simulator: loaded only when cases run
    from offsim.validation import CaseResult, Summary


def _fmt(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:.4g}"


def validate(
    cases: Annotated[Path | None, typer.Option(
        help="cases YAML (default: the shipped validation/cases.yaml)")] = None,
    out: Annotated[Path | None, typer.Option(
        "--out", "-o", "--csv", help="write the table as CSV here (with --real: the report as JSON)")] = None,
    strict: Annotated[bool, typer.Option(hidden=True, help="no effect: a miss always exits 1")] = False,
    real: Annotated[bool, typer.Option("--real", help="run the real offloaded trainer and compare")] = False,
    hardware: HardwareOpt = DEFAULT_HARDWARE,
    workload: WorkloadOpt = DEFAULT_WORKLOAD,
    layers: Annotated[int, typer.Option(min=1, help="(--real) blocks in the real model")] = 4,
    device: Annotated[str, typer.Option(
        help="(--real) torch device: cuda, or cpu to check the mechanics")] = "cuda",
    iterations: Annotated[int, typer.Option(min=1, help="(--real) timed iterations")] = 5,
    as_json: JsonOpt = False,
    quiet: QuietOpt = False,
) -> None:
    """Simulate each published case and print predicted vs measured with the error (exit 1 when a
    case misses its tolerance); with --real, train for real (PyTorch) on -H/-w and compare per phase
    with the simulation of the same setup."""
    check_out_file(out)
    if real:
        _validate_real(hardware, workload, layers, device, iterations, out)
        return
    results = _run_cases(cases)
    rows = [row for r in results for row in r.rows()]
    summary = _summarize(results)
    if out is not None:
        import pandas as pd

        pd.DataFrame(rows).to_csv(out, index=False)
    if as_json:
        print_json({"cases": rows, "summary": summary.to_dict(), "within": summary.within, "total": summary.total})
    else:
        if not quiet:
            console.print(_cases_table(rows))
            console.print(_medians_table(summary))
        for line in _summary_lines(summary):
            say(line)
    if not summary.ok:
        raise typer.Exit(EXIT_NO)


def _run_cases(cases: Path | None) -> list[CaseResult]:
    """Simulate and judge every case of ``cases`` (default: the shipped file); a bad file exits 2."""
    from offsim.errors import OffsimError
    from offsim.validation import default_cases_path, load_cases, run_case

    try:
        return [run_case(c) for c in load_cases(cases or default_cases_path())]
    except OffsimError as exc:
        fail(str(exc))


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


def _validate_real(hardware: str, workload: str, layers: int, device: str, iterations: int,
                   out: Path | None) -> None:
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
        fail(f"the simulated twin does not fit: {predicted.metrics.infeasible_reason}", EXIT_NO)
    if device.startswith("cuda") and not torch.cuda.is_available():
        fail("no CUDA device: run on a GPU machine, or pass --device cpu to check the mechanics only")
    shape = RealShape.from_workload(wl, layers=layers)
    measured = run_real_training(shape, device=device, iterations=iterations)
    rows = compare(measured, predicted)
    title = f"real vs simulated: {layers} blocks of {wl.name} on {device}, profile {profile.name}"
    t = Table(title=escape(title))
    for col in ("phase", "measured s", "predicted s", "error"):
        t.add_column(col)
    for r in rows:
        err = "-" if r["error"] is None else f"{100 * r['error']:+.1f}%"
        t.add_row(r["what"], f"{r['measured_s']:.4g}", f"{r['predicted_s']:.4g}", err)
    console.print(t)
    it = rows[-1]["error"]
    verdict = "within" if it is not None and abs(it) <= TARGET_ERROR else "outside"
    say(f"iteration time {verdict} the {TARGET_ERROR:.0%} target")
    if out is not None:
        doc = {"hardware": profile.name, "workload": wl.name, "layers": layers, "device": device,
               "rows": rows, "measured": measured}
        out.write_text(strict_json(doc) + "\n")
    if verdict == "outside" and device.startswith("cuda"):  # on the CPU it checks the mechanics only
        raise typer.Exit(EXIT_NO)


def register(app: typer.Typer) -> None:
    """Add ``validate`` to the CLI."""
    app.command()(validate)
