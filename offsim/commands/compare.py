"""``offsim compare`` (policies side by side, scored against bounds on the bytes any policy must
move, over one or several cache sizes) and ``offsim rok`` (the recompute-offload-keep curve)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

console = Console()
HardwareOpt = Annotated[str, typer.Option("--hardware", "-H", help="hardware profile name or YAML path")]
WorkloadOpt = Annotated[str, typer.Option("--workload", "-w", help="workload name or YAML path")]
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
           ("exact", "bound_exact")]


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


def _row_cells(row: dict, keys: list[str]) -> list[str]:
    """A row's cells; an infeasible one shows its budgets and n/a."""
    if row["feasible"]:
        return [_cell(key, row.get(key)) for key in keys]
    cells = [_cell(key, row.get(key)) if key.endswith("_gib") else "" for key in keys]
    first = next((i for i, key in enumerate(keys) if not key.endswith("_gib")), None)
    if first is not None:
        cells[first] = "[red]n/a[/]"
    return cells


def _print_compare(table, title: str) -> None:  # a DataFrame
    t = Table(title=title)
    cols = [(label, key) for label, key in COLUMNS if key in table]
    for label, _ in cols:
        t.add_column(label, justify="left" if label == "variant" else "right", no_wrap=label == "variant")
    for row in table.to_dict("records"):
        t.add_row(row["variant"], *_row_cells(row, [key for _, key in cols[1:]]))
    wide.print(t)
    for row in table.to_dict("records"):
        if not row["feasible"]:
            wide.print(f"[red]{row['variant']}[/]: {row['infeasible_reason']}", highlight=False)


def _print_notes(table) -> None:  # a DataFrame
    """Bound gaps and Belady's anomalies, under the table."""
    from offsim.compare import anomalies

    ok = table[table["feasible"].astype(bool)] if "bound_exact" in table else table.iloc[0:0]
    gaps = ok[~ok["bound_exact"].astype(bool)] if not ok.empty else ok
    if not ok.empty:
        wide.print("Bounds: lower = min-cost flow over the access sequence the engine served (Berger et al., "
                   "SIGMETRICS 2018); 'exact' = it meets the best schedule found, so it is the optimum "
                   "for fetch on demand.", highlight=False)
    for row in gaps.drop_duplicates(["cache_gib", "dram_cache_gib"]).to_dict("records"):
        gap = (row["upper_bound_bytes"] - row["lower_bound_bytes"]) / 1e9
        wide.print(f"bound gap at {row['cache_gib']} GiB / {row['dram_cache_gib']} GiB: the best schedule found "
                   f"moves {gap:.3g} GB per iteration more than the lower bound", highlight=False)
    for column in ("cache_gib", "dram_cache_gib"):
        for line in anomalies(table, column):
            wide.print(f"more bytes with a larger cache ({column}): {line}", highlight=False)


def compare(
    hardware: HardwareOpt = "tiny",
    workload: WorkloadOpt = "tiny",
    strategy: Annotated[str, typer.Option("--strategy", "-s", help="base strategy the policies apply to")]
    = "zero-infinity-nvme",
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
    iterations: Annotated[int, typer.Option(help="optimizer steps to simulate")] = 3,
    warmup: Annotated[int, typer.Option(help="leading steps left out of the metrics")] = 1,
    csv: Annotated[Path, typer.Option(help="write the table as CSV here")] = Path("offsim-compare.csv"),
    html: Annotated[Path, typer.Option(help="write the plotly chart here")] = Path("offsim-compare.html"),
) -> None:
    """Run several policies (or strategies) on one profile and workload side by side: time,
    stall, bytes per link, hit rate and peak memory per tier, and bytes against the lower bound
    any policy must move (and the best schedule found), over one or several cache sizes."""
    from offsim.cli import fail
    from offsim.compare import DEFAULT_POLICIES, decision, policy_variants, run_variants
    from offsim.config.loading import load_strategy
    from offsim.errors import OffsimError
    from offsim.report.compare_figures import compare_figure, write_html

    try:
        variants = []
        if policies or not strategies:
            base = load_strategy(strategy)
            names = policies or DEFAULT_POLICIES
            buffers = _sizes(cache_gib, "--cache-gib") if cache_gib else _buffer(param_buffer_gib)
            drams = _sizes(dram_cache_gib, "--dram-cache-gib") if dram_cache_gib else None
            variants += policy_variants(base, names, buffers, drams)
        for name in filter(None, (s.strip() for s in (strategies or "").split(","))):
            variants.append((name, load_strategy(name)))
        table, _ = run_variants(hardware, workload, variants, iterations, warmup)
    except OffsimError as exc:
        fail(str(exc))
        return
    title = f"{workload} on {hardware}: policies over {strategy}"
    wide.print(decision(table), highlight=False)
    _print_compare(table, title)
    _print_notes(table)
    table.to_csv(csv, index=False)
    write_html(compare_figure(table, title), html)
    console.print(f"table written to {csv}, chart to {html}")


def rok(
    hardware: HardwareOpt = "tiny",
    workload: WorkloadOpt = "tiny",
    strategy: Annotated[str, typer.Option("--strategy", "-s", help="strategy for everything but activations")]
    = "zero-infinity-cpu",
    points: Annotated[int, typer.Option(help="block counts per placement (0 .. all blocks)")] = 6,
    iterations: Annotated[int, typer.Option(help="optimizer steps to simulate")] = 3,
    warmup: Annotated[int, typer.Option(help="leading steps left out of the metrics")] = 1,
    csv: Annotated[Path, typer.Option(help="write the curve as CSV here")] = Path("offsim-rok.csv"),
    html: Annotated[Path, typer.Option(help="write the plotly chart here")] = Path("offsim-rok.html"),
) -> None:
    """The ROK curve: GPU memory saved against time cost of recomputing, offloading to DRAM or
    offloading to NVMe the activations of 0..all blocks."""
    from offsim.cli import fail
    from offsim.compare import rok_curve
    from offsim.config.loading import load_strategy
    from offsim.errors import OffsimError
    from offsim.report.compare_figures import rok_figure, write_html

    try:
        curve = rok_curve(hardware, workload, load_strategy(strategy), points, iterations, warmup)
    except OffsimError as exc:
        fail(str(exc))
        return
    t = Table(title=f"ROK curve: {workload} on {hardware} ({strategy})")
    for col in ("placement", "blocks", "iteration s", "time cost s", "peak GPU GiB", "saved GiB"):
        t.add_column(col, justify="left" if col == "placement" else "right")
    for r in curve.to_dict("records"):
        it = _num(r["iteration_time_s"]) if r["feasible"] else "infeasible"
        t.add_row(r["placement"], str(r["blocks"]), it,
                  _num(r["time_cost_s"]), _num(r["gpu_bytes"] / 2**30, ".2f"),
                  _num(r["memory_saved_bytes"] / 2**30, ".2f"))
    wide.print(t)
    curve.to_csv(csv, index=False)
    write_html(rok_figure(curve, f"ROK curve: {workload} on {hardware}"), html)
    console.print(f"curve written to {csv}, chart to {html}")


def register(app: typer.Typer) -> None:
    """Add ``compare`` and ``rok`` to the CLI."""
    app.command()(compare)
    app.command()(rok)
