"""``offsim sweep`` (a grid of what-if points) and ``offsim size`` (the cheapest machine for a target).

A sweep keeps its results store and tables only in ``-o/--out`` (then it resumes where it
stopped) and its figures only in ``--figures``; without ``-o`` the points are held in a scratch
store that is removed at the end, and the summary and the fastest points are printed.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table
from rich.text import Text

from offsim.commands import _options as opt
from offsim.commands._common import (
    ExitCode,
    check_out_dir,
    check_out_file,
    console,
    err_console,
    fail,
    print_json,
    say,
)
from offsim.errors import OffsimError


class RateColumn(ProgressColumn):
    """Points per second over the recent past."""

    def render(self, task: Task) -> Text:
        speed = task.finished_speed or task.speed
        return Text("-- pts/s" if speed is None else f"{speed:,.1f} pts/s", style="progress.data.speed")


class _Bar:
    """Adapts run_sweep's progress callback to a rich progress bar."""

    def __init__(self, progress: Progress, name: str) -> None:
        self.progress, self.name = progress, name
        self.task: Any = None
        self.last = 0

    def __call__(self, done: int, total: int) -> None:
        if self.task is None:
            self.task = self.progress.add_task(self.name, total=total, completed=done)
        else:
            self.progress.advance(self.task, done - self.last)
        self.last = done


def _status_table(frame: Any) -> Table:
    t = Table(title="points by status", show_header=True)
    t.add_column("status")
    t.add_column("points", justify="right")
    if not frame.empty:
        for status, n in frame["status"].value_counts().sort_index().items():
            t.add_row(str(status), str(n))
    return t


def sweep(
    spec: Annotated[Path, typer.Argument(help="sweep spec YAML (see sweeps/*.yaml)")],
    out: Annotated[Path | None, opt.out(
        "output folder: the results store (resumable) and results.csv/.parquet")] = None,
    workers: Annotated[
        int | None, typer.Option(min=1, help="local worker processes (default: all cores; 1: in-process)")
    ] = None,
    scheduler: Annotated[
        str | None, typer.Option(help="address of a running Dask scheduler, e.g. tcp://host:8786")
    ] = None,
    prefilter: Annotated[
        bool, typer.Option(help="skip simulating points that do not fit, or whose time bound read off "
                                "the compiled schedule is dominated")
    ] = True,
    yes: Annotated[bool, typer.Option("--yes", help="allow more than 1,000,000 points")] = False,
    max_points: Annotated[
        int | None, typer.Option(min=1, help="evaluate at most this many new points, then stop")
    ] = None,
    fresh: Annotated[bool, typer.Option(help="discard results already in --out")] = False,
    figures: opt.Figures = None,
    as_json: opt.Json = False,
    quiet: opt.Quiet = False,
) -> None:
    """Run a grid of what-if points (hardware, workload, strategy), local or on Dask; with -o, kept
    in a resumable store with its tables; without, printed only."""
    from offsim.sweep.spec import load_spec

    check_out_dir(out)
    check_out_dir(figures, "--figures")
    try:
        plan = load_spec(spec, yes=yes)
        with _store_folder(out) as folder:
            outcome = _run_with_bar(plan, folder, quiet or as_json, workers=workers, scheduler=scheduler,
                                    prefilter=prefilter, max_points=max_points, fresh=fresh)
    except OffsimError as exc:
        fail(str(exc))
    files = _write_outputs(outcome, plan, out, figures)
    if as_json:
        print_json(_outcome_doc(outcome, files, out))
    else:
        _print_outcome(outcome, plan.axis_keys, files, out, quiet)
    _sweep_exit(outcome, out)


@contextmanager
def _store_folder(out: Path | None) -> Iterator[Path]:
    """``out``, or a scratch folder removed after the sweep when ``-o`` is not given."""
    if out is not None:
        yield out
        return
    with tempfile.TemporaryDirectory(prefix="offsim-sweep-") as scratch:
        yield Path(scratch)


def _run_with_bar(plan: Any, out: Path, quiet: bool, **options: Any) -> Any:
    """:func:`~offsim.sweep.execute.run_sweep` with a progress bar on stderr (unless ``quiet``)."""
    from offsim.sweep.execute import run_sweep

    cols = [
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        RateColumn(),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
    ]
    with Progress(*cols, console=err_console, disable=quiet, transient=False) as progress:
        return run_sweep(plan, out, progress=_Bar(progress, escape(plan.name)), **options)


def _write_outputs(outcome: Any, plan: Any, out: Path | None, figures: Path | None) -> list[Path]:
    """The tables in ``out``, and the figures in ``figures`` once every point is stored."""
    from offsim.sweep.execute import write_tables
    from offsim.sweep.figures import write_figures

    files = [] if out is None else write_tables(outcome.frame, out)
    if figures is not None and outcome.complete:
        files += write_figures(outcome.frame, plan.axis_keys, figures)
    return files


def _outcome_doc(outcome: Any, files: list[Path], out: Path | None) -> dict[str, Any]:
    """The ``--json`` summary of a sweep; without ``-o`` it carries every point's row (``points``)."""
    counts = outcome.frame["status"].value_counts().to_dict() if not outcome.frame.empty else {}
    doc = {"out": None if out is None else str(out), "total": outcome.total, "stored": len(outcome.frame),
           "new": outcome.new, "reused": outcome.reused, "complete": outcome.complete,
           "interrupted": outcome.interrupted, "signal": outcome.signal_name,
           "failed_chunks": outcome.failed_chunks, "points_per_s": outcome.points_per_s,
           "status": {str(k): int(v) for k, v in counts.items()}, "files": [str(f) for f in files]}
    if out is None:
        frame = outcome.frame.astype(object).where(outcome.frame.notna(), None)
        doc["points"] = frame.to_dict(orient="records")
    return doc


#: Points the summary of a sweep without ``-o`` lists (the fastest first).
FASTEST_SHOWN = 10


def _print_outcome(outcome: Any, axes: list[str], files: list[Path], out: Path | None, quiet: bool) -> None:
    """The human summary: points by status, speed, files written; without ``-o``, the fastest points."""
    if not quiet:
        console.print(_status_table(outcome.frame))
    where = f" in {out}" if out is not None else ""
    say(f"{outcome.new} points evaluated ({outcome.points_per_s:,.1f} points/s), {outcome.reused} reused; "
        f"{len(outcome.frame)} of {outcome.total}{where}")
    for f in files:
        say(f"  wrote {f}")
    if out is None and not quiet:
        fastest = _fastest_table(outcome.frame, axes)
        if fastest is not None:
            console.print(fastest)
        say("results not kept: -o DIR keeps every point (a resumable store, results.csv and .parquet)",
            stderr=True)


def _fastest_table(frame: Any, axes: list[str]) -> Table | None:
    """The :data:`FASTEST_SHOWN` fastest points that fit: their axis values, time and throughput."""
    if frame.empty or "iteration_time_s" not in frame:
        return None
    ok = frame[frame["status"] == "ok"].sort_values("iteration_time_s").head(FASTEST_SHOWN)
    if ok.empty:
        return None
    t = Table(title=f"fastest {len(ok)} of {int((frame['status'] == 'ok').sum())} points that fit")
    cost = "cost_per_million_tokens_usd" in ok and bool(ok["cost_per_million_tokens_usd"].notna().any())
    for name in [*axes, "s/iter", "tokens/s", *(["USD/M tokens"] if cost else [])]:
        t.add_column(escape(name), justify="left" if name in axes else "right")
    for _, row in ok.iterrows():
        cells = [escape(str(row[a])) for a in axes]
        cells += [f"{row['iteration_time_s']:.4g}", f"{row['tokens_per_s']:,.0f}"]
        t.add_row(*cells, *([_fmt(dict(row), "cost_per_million_tokens_usd", ",.2f")] if cost else []))
    return t


def _sweep_exit(outcome: Any, out: Path | None) -> None:
    """Exit 143 on SIGTERM, 130 on Ctrl-C (saying how to resume), 1 when chunks were lost."""
    resume = ("finished points are saved; run the same command again to resume" if out is not None
              else "nothing was kept (no -o); give -o DIR to make a sweep resumable")
    if outcome.interrupted:
        code = ExitCode.TERMINATED if outcome.signal_name == "SIGTERM" else ExitCode.INTERRUPTED
        say(f"{'stopped by SIGTERM' if code == ExitCode.TERMINATED else 'interrupted'}: {resume}", stderr=True)
        raise typer.Exit(code)
    if outcome.failed_chunks:
        fail(f"{outcome.failed_chunks} chunks were lost to worker failures; run again to retry them", ExitCode.NO)
    if not outcome.complete:
        again = "run the same command again to continue" if out is not None else "give -o DIR to continue later"
        say(f"stopped before the end (--max-points); {again}")


# ----------------------------------------------------------------------------- size
class Objective(StrEnum):
    """What ``size`` minimises: the purchase price, the steps up the value lists, or the price when known."""

    AUTO = "auto"
    COST = "cost"
    SIZE = "size"


def _parse_scalar(text: str) -> Any:
    return yaml.safe_load(text) if text.strip() else text


def _parse_assignments(items: list[str], what: str, many: bool) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise OffsimError(f"{what} expects KEY=VALUE{',VALUE...' if many else ''}, got {item!r}")
        out[key.strip()] = [_parse_scalar(v) for v in value.split(",")] if many else _parse_scalar(value)
    return out


def _fmt(row: dict[str, Any], key: str, fmt: str) -> str:
    v = row.get(key)
    return "-" if v is None or v != v else format(v, fmt)


def _result_text(row: dict[str, Any]) -> str:
    if row.get("status") == "ok":
        return f"{row['iteration_time_s']:.4g} s/iter, {row['tokens_per_s']:,.0f} tokens/s"
    if row.get("status") == "too_slow":
        return f"too slow: at least {row['time_lower_bound_s']:.4g} s/iter (bound: {row['bound_binding']})"
    if row.get("status") == "infeasible":
        return f"does not fit: {row.get('infeasible_reason')}"
    return f"{row.get('status')}: {row.get('error')}"


def _time_cell(row: dict[str, Any]) -> str:
    status = row.get("status")
    if status == "ok":
        return f"{row['iteration_time_s']:.4g}"
    if status == "too_slow":
        return f">= {row['time_lower_bound_s']:.4g}"
    return "no fit" if status == "infeasible" else str(status)


def _size_table(result: Any) -> Table:
    title = "cheapest" if result.objective == "cost" else "smallest"
    t = Table(title=f"{title} machine for {_goal_text(result.goal)}")
    t.add_column("")
    for k in result.dims:
        t.add_column(escape(k), justify="right")
    t.add_column("s/iter", justify="right")
    t.add_column("tokens/s", justify="right")
    priced = result.objective == "cost"
    if priced:
        t.add_column("USD", justify="right")
    rows = [("answer", result.answer), ("runner-up", result.runner_up)]
    rows += [(f"{k} -1 step", c) for k, c in result.steps_down.items()]
    for label, cand in rows:
        if cand is None:
            continue
        r = cand.row
        cells = [
            escape(label),
            *[escape(str(cand.overrides[k])) for k in result.dims],
            _time_cell(r),
            _fmt(r, "tokens_per_s", ",.0f"),
        ]
        t.add_row(*cells, *([_fmt(r, "capex_usd", ",.0f")] if priced else []))
    return t


def _goal_text(goal: Any) -> str:
    parts = []
    if goal.max_iteration_s is not None:
        parts.append(f"<= {goal.max_iteration_s:g} s per iteration")
    if goal.min_tokens_per_s is not None:
        parts.append(f">= {goal.min_tokens_per_s:g} tokens/s")
    return " and ".join(parts)


def _why(result: Any) -> list[str]:
    lines = []
    a, r = result.answer, result.runner_up
    if a is None:
        big = result.largest
        lines.append(
            f"no combination meets the target; the largest ({_ov(big.overrides, result.dims)}) gives "
            f"{_result_text(big.row)}"
        )
        if big.row.get("bound_binding"):
            lines.append(
                f"even there the time is bounded below by '{big.row['bound_binding']}' "
                f"({big.row['time_lower_bound_s']:.4g} s): vary another dimension (e.g. gpu, cpu_cores, "
                "the strategy) or relax the target"
            )
        return lines
    lines.append(
        f"answer: {_ov(a.overrides, result.dims)}: {_result_text(a.row)}; the binding lower bound is "
        f"'{a.row.get('bound_binding')}'"
    )
    if r is not None:
        if result.objective == "cost" and r.objective > a.objective:
            extra = r.objective - a.objective
            diff = f"costs {extra:,.0f} USD more ({100 * extra / a.objective:.0f}%)"
        elif r.size > a.size:
            diff = f"is a larger machine ({r.size - a.size} more step(s) up the value lists)"
        else:
            diff = "is as cheap and as small but slower"
        also = f"also meets the target ({_result_text(r.row)})"
        lines.append(f"runner-up: {_ov(r.overrides, result.dims)} {also} but {diff}")
    else:
        lines.append(
            "no runner-up: every other combination that meets the target has at least the answer's parts"
        )
    for key, c in result.steps_down.items():
        if c is not None and not result.goal.met(c.row):
            lines.append(f"with {key} = {c.overrides[key]} instead: {_result_text(c.row)}")
    lines += result.notes
    lines.append(f"{len(result.evaluated)} of {result.grid_points} grid points evaluated")
    return lines


def _ov(overrides: dict[str, Any], order: Any) -> str:
    return ", ".join(f"{k}={overrides[k]}" for k in order)


def size_command(
    vary: Annotated[
        str, typer.Option(help="comma-separated dimensions to search, e.g. dram_gib,nvme_drives,pcie_gen")
    ],
    hardware: opt.Hardware = opt.HARDWARE,
    workload: opt.Workload = opt.WORKLOAD,
    strategy: opt.Strategy = opt.STRATEGY,
    target_iteration_s: Annotated[
        float | None, typer.Option(help="largest acceptable iteration time, s")
    ] = None,
    target_tokens_per_s: Annotated[float | None, typer.Option(help="smallest acceptable throughput")] = None,
    values: Annotated[
        list[str] | None, typer.Option("--values", help="candidate values: KEY=A,B,C (repeatable)")
    ] = None,
    set_: Annotated[
        list[str] | None, typer.Option("--set", help="fixed override for every point: KEY=VALUE")
    ] = None,
    objective: Annotated[
        Objective, typer.Option(help="cost (purchase price), size (fewest steps up), or auto")
    ] = Objective.AUTO,
    prefilter: Annotated[
        bool, typer.Option(help="settle points that do not fit, or whose time bound read off the compiled "
                                "schedule misses the target, without simulating")
    ] = True,
    iterations: opt.Iterations = opt.ITERATIONS,
    out: Annotated[Path | None, opt.out("write every evaluated point as CSV here")] = None,
    as_json: opt.Json = False,
    quiet: opt.Quiet = False,
) -> None:
    """Find the cheapest (or smallest) machine meeting a target, by a monotone search."""
    from offsim.sweep.evaluate import Goal
    from offsim.sweep.sizing import size

    check_out_file(out)
    try:
        goal = Goal(target_iteration_s, target_tokens_per_s)
        dims = [d.strip() for d in vary.split(",") if d.strip()]
        result = size(hardware, workload, strategy, dims, goal,
                      values=_parse_assignments(values or [], "--values", many=True),
                      fixed=_parse_assignments(set_ or [], "--set", many=False),
                      objective=objective.value, prefilter=prefilter, iterations=iterations)
    except OffsimError as exc:
        fail(str(exc))
    if out is not None:
        result.evaluated.to_csv(out, index=False)
    if as_json:
        print_json(_size_doc(result))
    else:
        _print_size(result, quiet)
        if out is not None and not quiet:
            say(f"evaluated points written to {out}")
    if result.answer is None:
        raise typer.Exit(ExitCode.NO)


def _print_size(result: Any, quiet: bool) -> None:
    """The answer's table and why (only the first line with ``quiet``, unless there is no answer)."""
    if result.answer is not None:
        console.print(_size_table(result))
    why = _why(result)
    for line in why if not quiet or result.answer is None else why[:1]:
        say(f"- {line}")


def _size_doc(result: Any) -> dict[str, Any]:
    """The ``--json`` answer of ``offsim size``."""

    def pack(c: Any) -> Any:
        return None if c is None else {"overrides": c.overrides, "objective": c.objective, "row": c.row}

    return {
        "objective": result.objective,
        "answer": pack(result.answer),
        "runner_up": pack(result.runner_up),
        "largest": pack(result.largest),
        "steps_down": {k: pack(c) for k, c in result.steps_down.items()},
        "evaluated": len(result.evaluated),
        "grid_points": result.grid_points,
        "why": _why(result),
    }


def register(app: typer.Typer) -> None:
    """Add ``sweep`` and ``size`` to the offsim CLI."""
    from offsim.sweep.overrides import ALIASES

    aliases = "\n\n".join(f"{k}: {v}" for k, v in ALIASES.items())
    epilog = (
        "Axis keys are dotted paths (hardware.dram.capacity_gib, workload.training.micro_batch, "
        f"strategy.prefetch_depth, run.iterations) or these aliases:\n\n{aliases}"
    )
    app.command("sweep", epilog=epilog)(sweep)
    app.command("size")(size_command)
