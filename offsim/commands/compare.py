"""``offsim compare`` (policies side by side, scored against bounds on the bytes any policy must
move, over one or several cache sizes) and ``offsim rok`` (the recompute-offload-keep curve).

Both share the habits of every command (:mod:`offsim.commands._common`): ``-H/-w`` default to
the README's main example; ``-s`` defaults to a strategy with something to vary (caches over
NVMe for ``compare``, activations in HBM for ``rok``: the main example's ZeRO-Offload has
neither); files are written only where ``-o/--out`` (the CSV) and ``--html`` (the chart) say;
``--json`` prints the rows on stdout; ``-q`` leaves out the table (``compare`` still prints its
decision sentence, the answer).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from offsim.commands import _options as opt
from offsim.commands._common import ExitCode, check_out_file, console, fail, load_config, print_json, say
from offsim.report.progress import progress_bar

if TYPE_CHECKING:  # pandas is imported where a table is built (issue 16: start-up)
    import pandas as pd

#: ``compare``'s base strategy: a GPU parameter buffer and a DRAM cache over NVMe to vary.
COMPARE_STRATEGY = "zero-infinity-nvme"
#: ``rok``'s strategy for everything but activations.
ROK_STRATEGY = "zero-infinity-cpu"

wide = console if console.is_terminal else Console(width=170)  # logs and pipes: do not squeeze the table


def _gb(x: float | None) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x / 1e9:.4g}"


def _num(x: float | None, fmt: str = ".4g") -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, fmt)


def _buffer(text: str) -> float | str | None:
    if text in ("none", ""):
        return None
    if text == "auto":
        return "auto"
    try:
        return float(text)
    except ValueError:
        from offsim.errors import ConfigError

        raise ConfigError(f"--param-buffer-gib: expected a number, 'auto' or 'none', got '{text}'") from None


def _sizes(text: str, option: str) -> list[float]:
    """``2,4,8`` -> [2.0, 4.0, 8.0]."""
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        from offsim.errors import ConfigError

        raise ConfigError(f"{option}: expected comma-separated GiB, e.g. 2,4,8; got '{text}'") from None


#: The table's columns (label, CSV column); the CSV has more (D2H, peak host, per-cache bounds).
COLUMNS = [("variant", "variant"), ("GPU buf GiB", "cache_gib"), ("DRAM GiB", "dram_cache_gib"),
           ("iteration s", "iteration_time_s"), ("GPU stall s", "stall_s"),
           ("CPU wait s", "stall_dram_optimizer_s"), ("H2D GB", "h2d_bytes"),
           ("NVMe rd GB", "nvme_read_bytes"), ("NVMe wr GB", "nvme_write_bytes"),
           ("hit GPU", "hit_rate_gpu_params"), ("hit DRAM", "hit_rate_dram_optimizer"),
           ("peak GPU GiB", "peak_gpu_bytes"),
           ("total GB", "total_bytes"), ("bound GB", "lower_bound_bytes"), ("regret GB", "regret_bytes"),
           ("exact", "bound_exact"), ("time bound s", "iteration_time_lower_bound_s")]


def _cell(key: str, v: object) -> str:
    if key.endswith("_bytes") and key.startswith("peak"):
        return _num(None if v is None else v / 2**30, ".2f")  # type: ignore[operator]
    if key.endswith("_bytes"):
        return _gb(v)  # type: ignore[arg-type]
    if key.startswith("hit_rate"):
        return _num(v, ".0%") if v is not None and v == v else "-"  # type: ignore[arg-type]
    if key == "bound_exact":
        return "-" if v is None or v != v else ("yes" if v else "no")
    if key.endswith("_gib"):
        return "-" if v is None or v != v else _num(v, ".3g")  # type: ignore[arg-type]
    return _num(v)  # type: ignore[arg-type]


def _row_cells(row: dict[str, Any], keys: list[str]) -> list[str]:
    """A row's cells; an infeasible one shows its budgets and n/a."""
    if row["feasible"]:
        return [_cell(key, row.get(key)) for key in keys]
    cells = [_cell(key, row.get(key)) if key.endswith("_gib") else "" for key in keys]
    first = next((i for i, key in enumerate(keys) if not key.endswith("_gib")), None)
    if first is not None:
        cells[first] = "[red]n/a[/]"
    return cells


def _print_compare(table: pd.DataFrame, title: str) -> None:
    t = Table(title=escape(title))
    cols = [(label, key) for label, key in COLUMNS if key in table]
    for label, _ in cols:
        t.add_column(label, justify="left" if label == "variant" else "right", no_wrap=label == "variant")
    for row in table.to_dict("records"):
        t.add_row(escape(str(row["variant"])), *_row_cells(row, [key for _, key in cols[1:]]))
    wide.print(t)
    for row in table.to_dict("records"):
        if not row["feasible"]:
            wide.print(f"[red]{escape(str(row['variant']))}[/]: {escape(str(row['infeasible_reason']))}",
                       highlight=False)


def _notes(table: pd.DataFrame) -> list[str]:
    """What to read under the table: how the bounds are made, bound gaps, Belady's anomalies."""
    from offsim.compare import anomalies

    ok = table[table["feasible"].astype(bool)] if "bound_exact" in table else table.iloc[0:0]
    gaps = ok[~ok["bound_exact"].astype(bool)] if not ok.empty else ok
    lines = []
    if not ok.empty:
        lines.append("Bounds: lower = min-cost flow over the access sequence the engine served (Berger et al., "
                     "SIGMETRICS 2018); 'exact' = it meets the best schedule found, so it is the optimum "
                     "for fetch on demand.")
        lines.append("Time bound: no eviction policy with these budgets runs an iteration faster on the modelled "
                     "machine (fewest bytes over each link and the NVMe array at peak rate, compute, CPU optimizer; "
                     "perfect overlap assumed, so a limit, not a prediction).")
        methods = {str(v) for c in ok if c.startswith("bound_method_") for v in ok[c].dropna()}
        if "pfoo" in methods:
            lines.append("Some sequences were too long for one flow: their bounds are PFOO's (flows over segments; "
                         "lower = the larger of PFOO-L and the segments' cut, upper = PFOO-U), with the gap shown.")
    for row in gaps.drop_duplicates(["cache_gib", "dram_cache_gib"]).to_dict("records"):
        gap = (row["upper_bound_bytes"] - row["lower_bound_bytes"]) / 1e9
        lines.append(f"bound gap at {row['cache_gib']} GiB / {row['dram_cache_gib']} GiB: the best schedule found "
                     f"moves {gap:.3g} GB per iteration more than the lower bound")
    for column in ("cache_gib", "dram_cache_gib"):
        lines += [f"more bytes with a larger cache ({column}): {line}" for line in anomalies(table, column)]
    return lines


def compare(
    hardware: opt.Hardware = opt.HARDWARE,
    workload: opt.Workload = opt.WORKLOAD,
    strategy: Annotated[str, opt.strategy("base strategy the policies apply to (one with caches to vary)")]
    = COMPARE_STRATEGY,
    policies: Annotated[str | None, typer.Option(
        help="comma-separated policy names, '+' joins several "
             "(e.g. lru,fifo,belady,belady-size,keep-last-4,lru+alternating)",
    )] = None,
    strategies: Annotated[str | None, typer.Option(
        help="comma-separated strategies to run as they are")] = None,
    param_buffer_gib: Annotated[str, typer.Option(
        help="GPU parameter budget for the policy variants: GiB, 'auto' (what the plan leaves free) "
             "or 'none'",
    )] = "auto",
    cache_gib: Annotated[str | None, typer.Option(
        help="GPU parameter budgets to sweep, GiB, comma-separated (e.g. 2,4,8,16,32): a row per policy "
             "and size, and the curve; replaces --param-buffer-gib")] = None,
    dram_cache_gib: Annotated[str | None, typer.Option(
        help="DRAM cache over NVMe optimizer state, GiB; comma-separated to sweep (e.g. 10,20,40)")] = None,
    iterations: opt.Iterations = opt.ITERATIONS,
    warmup: opt.Warmup = opt.WARMUP,
    out: Annotated[Path | None, opt.out("write the table as CSV here", "--csv")] = None,
    html: opt.Html = None,
    as_json: opt.Json = False,
    quiet: opt.Quiet = False,
    samples: opt.Samples = 0,
    seed: opt.Seed = 0,
    assumptions: opt.Assumptions = None,
) -> None:
    """Run several policies (or strategies) on one profile and workload side by side: time,
    stall, bytes per link, hit rate and peak memory per tier, and bytes against the lower bound
    any policy must move (and the best schedule found), over one or several cache sizes. The
    first line is the decision (per budget, the fastest policy and its distance to the bound);
    --quiet prints only that line. With --samples N, each variant at the same N draws of the
    assumed inputs: p10-p90 of its time, in how many it fits and is the fastest. Exit 1 when no
    variant fits."""
    from offsim.compare import decision

    check_out_file(out)
    check_out_file(html, "--html")
    table, variants = _run_compare(hardware, workload, strategy, policies, strategies, param_buffer_gib, cache_gib,
                                   dram_cache_gib, iterations, warmup, quiet)
    if samples:
        from offsim.commands._intervals import interval_columns, sample_variants

        found = sample_variants(variants, samples, seed, assumptions, (iterations, warmup), progress=not quiet)
        table = interval_columns(table, found)
    title = f"{workload} on {hardware}: policies over {strategy}"
    files = _write_outputs(table, title, out, html, "compare")
    sentence = decision(table)
    if as_json:
        print_json({"decision": sentence, "notes": _notes(table), "files": files,
                    "rows": table.to_dict("records")})
    else:
        say(sentence)
        if not quiet:
            _print_study(table, title, files, (samples, seed))
    if not _any_feasible(table):
        raise typer.Exit(ExitCode.NO)


def _print_study(table: pd.DataFrame, title: str, files: dict[str, str], draws: tuple[int, int]) -> None:
    """The table, with ``draws`` (samples, seed) the variants' intervals, the notes, the files written."""
    _print_compare(table, title)
    if draws[0]:
        from offsim.commands._intervals import variant_intervals_table

        wide.print(variant_intervals_table(table, *draws))
    for line in _notes(table):
        say(line)
    _say_written(files)


def _run_compare(hardware: str, workload: str, strategy: str, policies: str | None, strategies: str | None,
                 param_buffer_gib: str, cache_gib: str | None, dram_cache_gib: str | None, iterations: int,
                 warmup: int, quiet: bool) -> tuple[pd.DataFrame, list[tuple[Any, Any, Any]]]:
    """The variants (policy variants of ``strategy`` and strategies as they are), simulated, and
    each variant's (hardware, workload, strategy) in the table's row order; bad input exits 2.

    Every strategy is read as ``offsim run`` reads it (:func:`load_config`): a DeepSpeed,
    Accelerate or Megatron-Core file with the workload, its notes on stderr. The policy variants
    run with the batch and precision the base strategy's file sets; each of ``--strategies`` with
    those its own file sets, so its row is what ``offsim run`` gives for it.
    """
    import pandas as pd

    from offsim.compare import DEFAULT_POLICIES, policy_variants, run_variants, tighten_upper_bounds
    from offsim.errors import OffsimError

    groups: list[tuple[Any, Any, list[tuple[str, Any]]]] = []
    if policies or not strategies:
        cfg = load_config(hardware, workload, strategy, iterations=iterations, warmup=warmup, quiet=quiet)
        try:
            buffers = _sizes(cache_gib, "--cache-gib") if cache_gib else _buffer(param_buffer_gib)
            drams = _sizes(dram_cache_gib, "--dram-cache-gib") if dram_cache_gib else None
            variants = policy_variants(cfg.strategy, policies or DEFAULT_POLICIES, buffers, drams)
        except OffsimError as exc:
            fail(str(exc))
        groups.append((cfg.hardware, cfg.workload, list(variants)))
    named = [name for name in (s.strip() for s in (strategies or "").split(",")) if name]
    for name in named:  # bad input exits 2 before any simulation
        load_config(hardware, workload, name, iterations=iterations, warmup=warmup, quiet=quiet)
    if named:
        groups.append((hardware, workload, [(name, name) for name in named]))
    tables = []
    with progress_bar(sum(len(g[2]) for g in groups), "simulating variants", enabled=not quiet) as advance:
        for hw, wl, variants in groups:
            try:
                table, _ = run_variants(hw, wl, variants, iterations, warmup,
                                        on_variant=lambda label: advance(1, f"simulated {label}"))
            except OffsimError as exc:
                fail(str(exc))
            tables.append(table)
    return (tighten_upper_bounds(pd.concat(tables, ignore_index=True)),
            [(hw, wl, st) for hw, wl, variants in groups for _, st in variants])


def _write_outputs(table: pd.DataFrame, title: str, out: Path | None, html: Path | None,
                   kind: str) -> dict[str, str]:
    """Write the CSV and the chart where asked (nothing otherwise); the files written, by kind."""
    from offsim.report.compare_figures import compare_figure, rok_figure, write_html

    files = {}
    if out is not None:
        table.to_csv(out, index=False)
        files["csv"] = str(out)
    if html is not None:
        figure = compare_figure(table, title) if kind == "compare" else rok_figure(table, title)
        write_html(figure, html)
        files["html"] = str(html)
    return files


def _say_written(files: dict[str, str]) -> None:
    what = {"csv": "table", "html": "chart"}
    if files:
        say(", ".join(f"{what[k]} written to {v}" for k, v in files.items()))


def _any_feasible(table: pd.DataFrame) -> bool:
    return "feasible" in table and bool(table["feasible"].astype(bool).any())


def rok(
    hardware: opt.Hardware = opt.HARDWARE,
    workload: opt.Workload = opt.WORKLOAD,
    strategy: Annotated[str, opt.strategy("strategy for everything but activations")] = ROK_STRATEGY,
    points: Annotated[int, typer.Option(min=1, help="block counts per placement (0 .. all blocks)")] = 6,
    iterations: opt.Iterations = opt.ITERATIONS,
    warmup: opt.Warmup = opt.WARMUP,
    out: Annotated[Path | None, opt.out("write the curve as CSV here", "--csv")] = None,
    html: opt.Html = None,
    as_json: opt.Json = False,
    quiet: opt.Quiet = False,
) -> None:
    """The ROK curve: GPU memory saved against time cost of recomputing, offloading to DRAM or
    offloading to NVMe the activations of 0..all blocks. Exit 1 when no point fits."""
    from offsim.compare import rok_curve, rok_runs
    from offsim.errors import OffsimError

    check_out_file(out)
    check_out_file(html, "--html")
    cfg = load_config(hardware, workload, strategy, iterations=iterations, warmup=warmup, quiet=quiet)
    try:
        total = rok_runs(cfg.hardware, cfg.workload, cfg.strategy, points)
        with progress_bar(total, "simulating the curve", enabled=not quiet) as advance:
            curve = rok_curve(cfg.hardware, cfg.workload, cfg.strategy, points, iterations, warmup,
                              on_run=lambda: advance())
    except OffsimError as exc:
        fail(str(exc))
    files = _write_outputs(curve, f"ROK curve: {workload} on {hardware}", out, html, "rok")
    if as_json:
        print_json({"files": files, "rows": curve.to_dict("records")})
    elif not quiet:
        _print_rok(curve, f"ROK curve: {workload} on {hardware} ({strategy})")
        _say_written(files)
    if not _any_feasible(curve):
        raise typer.Exit(ExitCode.NO)


def _print_rok(curve: pd.DataFrame, title: str) -> None:
    t = Table(title=escape(title))
    for col in ("placement", "blocks", "iteration s", "time cost s", "peak GPU GiB", "saved GiB"):
        t.add_column(col, justify="left" if col == "placement" else "right")
    for r in curve.to_dict("records"):
        it = _num(r["iteration_time_s"]) if r["feasible"] else "infeasible"
        t.add_row(r["placement"], str(r["blocks"]), it,
                  _num(r["time_cost_s"]), _num(r["gpu_bytes"] / 2**30, ".2f"),
                  _num(r["memory_saved_bytes"] / 2**30, ".2f"))
    wide.print(t)


def register(app: typer.Typer) -> None:
    """Add ``compare`` and ``rok`` to the CLI."""
    app.command()(compare)
    app.command()(rok)
