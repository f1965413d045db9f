"""``offsim compare`` (policies side by side, scored against OPT) and ``offsim rok`` (the
recompute-offload-keep curve)."""

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
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x / 1e9:.3f}"


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


def _print_compare(table, title: str) -> None:  # a DataFrame
    t = Table(title=title)
    cols = [("variant", "variant"), ("iteration s", "iteration_time_s"), ("GPU stall s", "stall_s"),
            ("CPU wait s", "stall_dram_optimizer_s"),
            ("H2D GB", "h2d_bytes"), ("D2H GB", "d2h_bytes"), ("NVMe rd GB", "nvme_read_bytes"),
            ("NVMe wr GB", "nvme_write_bytes"), ("hit GPU", "hit_rate_gpu_params"),
            ("hit DRAM", "hit_rate_dram_optimizer"), ("peak GPU GiB", "peak_gpu_bytes"),
            ("peak host GiB", "peak_host_bytes"), ("regret GB", "regret_bytes"),
            ("regret stall s", "regret_stall_s"),
            ("regret iter s", "regret_iteration_s")]
    for label, _ in cols:
        t.add_column(label, justify="left" if label == "variant" else "right", no_wrap=label == "variant")
    for row in table.to_dict("records"):
        if not row["feasible"]:
            t.add_row(row["variant"], "[red]n/a[/]", *[""] * (len(cols) - 2))
            continue
        cells = []
        for _, key in cols[1:]:
            v = row.get(key)
            if key.endswith("_bytes") and key.startswith("peak"):
                cells.append(_num(None if v is None else v / 2**30, ".2f"))
            elif key.endswith("_bytes"):
                cells.append(_gb(v))
            elif key.startswith("hit_rate"):
                cells.append(_num(v, ".0%") if v is not None and v == v else "-")
            else:
                cells.append(_num(v))
        t.add_row(row["variant"], *cells)
    wide.print(t)
    for row in table.to_dict("records"):
        if not row["feasible"]:
            wide.print(f"[red]{row['variant']}[/]: {row['infeasible_reason']}", highlight=False)


def compare(
    hardware: HardwareOpt = "tiny",
    workload: WorkloadOpt = "tiny",
    strategy: Annotated[str, typer.Option("--strategy", "-s", help="base strategy the policies apply to")]
    = "zero-infinity-nvme",
    policies: Annotated[str | None, typer.Option(
        help="comma-separated policy names, '+' joins several "
             "(e.g. lru,fifo,belady,keep-last-4,lru+alternating)",
    )] = None,
    strategies: Annotated[str | None, typer.Option(
        help="comma-separated strategies to run as they are")] = None,
    param_buffer_gib: Annotated[str, typer.Option(
        help="GPU parameter budget for the policy variants: GiB, 'auto' (what the plan leaves free) "
             "or 'none'",
    )] = "auto",
    dram_cache_gib: Annotated[float | None, typer.Option(help="DRAM cache over NVMe optimizer state")] = None,
    iterations: Annotated[int, typer.Option(help="optimizer steps to simulate")] = 3,
    warmup: Annotated[int, typer.Option(help="leading steps left out of the metrics")] = 1,
    csv: Annotated[Path, typer.Option(help="write the table as CSV here")] = Path("offsim-compare.csv"),
    html: Annotated[Path, typer.Option(help="write the plotly chart here")] = Path("offsim-compare.html"),
) -> None:
    """Run several policies (or strategies) on one profile and workload side by side: time,
    stall, bytes per link, hit rate and peak memory per tier, regret against OPT."""
    from offsim.cli import fail
    from offsim.compare import DEFAULT_POLICIES, policy_variants, run_variants
    from offsim.config.loading import load_strategy
    from offsim.errors import OffsimError
    from offsim.report.compare_figures import compare_figure, write_html

    try:
        variants = []
        if policies or not strategies:
            base = load_strategy(strategy)
            names = policies or DEFAULT_POLICIES
            variants += policy_variants(base, names, _buffer(param_buffer_gib), dram_cache_gib)
        for name in filter(None, (s.strip() for s in (strategies or "").split(","))):
            variants.append((name, load_strategy(name)))
        table, _ = run_variants(hardware, workload, variants, iterations, warmup)
    except OffsimError as exc:
        fail(str(exc))
        return
    title = f"{workload} on {hardware}: policies over {strategy}"
    _print_compare(table, title)
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
