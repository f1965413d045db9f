"""``offsim report``: one self-contained HTML page for a run or a comparison of runs.

Every combination of the given ``--hardware``, ``--workload`` and ``--strategy`` values is
simulated (``-s zero-offload -s zero-infinity-cpu`` compares two strategies on one machine);
the page shows the bottleneck of each in one sentence, headline metrics, the timeline, memory
and link figures and the per-layer stall table (see :mod:`offsim.report.html`).
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Annotated

import typer


def _option(long: str, short: str, what: str) -> typer.models.OptionInfo:
    return typer.Option(long, short, help=f"{what} name or YAML path; repeat to compare")


HardwareOpt = Annotated[list[str], _option("--hardware", "-H", "hardware profile")]
WorkloadOpt = Annotated[list[str], _option("--workload", "-w", "workload")]
StrategyOpt = Annotated[list[str], _option("--strategy", "-s", "strategy")]


def report(
    hardware: HardwareOpt = ["rtx4090-pcie4-ws"],  # noqa: B006 - typer reads the default, never mutated
    workload: WorkloadOpt = ["llama2-7b"],  # noqa: B006
    strategy: StrategyOpt = ["zero-offload"],  # noqa: B006
    iterations: Annotated[int, typer.Option(help="optimizer steps to simulate per run")] = 3,
    warmup: Annotated[int, typer.Option(help="leading steps left out of the metrics")] = 1,
    out: Annotated[Path, typer.Option("--out", "-o", help="HTML file to write")] = Path("report.html"),
    title: Annotated[str | None, typer.Option(help="page title")] = None,
    figures_dir: Annotated[Path | None, typer.Option("--figures", help="also write each run's figures as "
                                                     "standalone HTML files under this folder")] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="no progress bar, no summary")] = False,
) -> None:
    """Simulate one or more configurations and write an HTML report (figures, metrics, bottleneck)."""
    from offsim import make_run_config, simulate
    from offsim.commands._common import console, fail
    from offsim.errors import OffsimError
    from offsim.report.bottleneck import bottleneck
    from offsim.report.figures import run_labels, write_figures
    from offsim.report.html import write_report
    from offsim.report.progress import progress_bar

    combos = list(itertools.product(hardware, workload, strategy))
    results = []
    with progress_bar(len(combos) + 1, "simulating", enabled=not quiet) as advance:
        for hw, wl, st in combos:
            advance(0, f"simulating {wl} on {hw} with {st}")
            try:
                cfg = make_run_config(hw, wl, st, iterations=iterations, warmup_iterations=warmup)
                results.append(simulate(cfg))
            except OffsimError as exc:
                fail(str(exc))
                return
            advance()
        advance(0, "rendering the report")
        write_report(results, out, title)
        if figures_dir is not None:
            for label, r in zip(run_labels(results), results, strict=True):
                if r.feasible:
                    write_figures(r, figures_dir / _slug(label))
        advance()
    if not quiet:
        for label, r in zip(run_labels(results), results, strict=True):
            text = bottleneck(r).sentence if r.feasible else f"does not fit: {r.metrics.infeasible_reason}"
            console.print(f"[bold]{label}[/]: {text}", highlight=False, soft_wrap=True)
        console.print(f"report written to {out}", highlight=False, soft_wrap=True)
    if not any(r.feasible for r in results):
        raise typer.Exit(1)


def _slug(label: str) -> str:
    return "".join(c if c.isalnum() or c in "-._" else "_" for c in label).strip("_") or "run"


def register(app: typer.Typer) -> None:
    """Add ``report`` to the CLI."""
    app.command()(report)
