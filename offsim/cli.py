"""The ``offsim`` command line (Typer).

Core commands live here (``run``, ``profiles``, ``workloads``, ``strategies``, ``schema``);
every module in :mod:`offsim.commands` adds its own with a ``register(app)`` function.
User errors (:class:`~offsim.errors.OffsimError`) print one message and exit with status 2.
"""

from __future__ import annotations

import importlib
import json
import pkgutil
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from offsim import __version__
from offsim.commands._common import (
    HardwareOpt,
    StrategyOpt,
    WorkloadOpt,
    console,
    err_console,
    fail,
    gib,
    print_metrics_table,
)
from offsim.config.loading import shipped_files
from offsim.errors import OffsimError

# Re-exported for modules that still import them from here (offsim.commands.compare).
__all__ = ["app", "console", "err_console", "fail", "gib", "print_metrics_table"]

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="offsim: simulate offloaded LLM training (GPU HBM, host DRAM, NVMe over PCIe).")

@app.command()
def run(
    hardware: HardwareOpt = "rtx4090-pcie4-ws",
    workload: WorkloadOpt = "llama2-7b",
    strategy: StrategyOpt = "zero-offload",
    iterations: Annotated[int, typer.Option(help="optimizer steps to simulate")] = 3,
    warmup: Annotated[int, typer.Option(help="leading steps left out of the metrics")] = 1,
    as_json: Annotated[bool, typer.Option("--json", help="print the metrics as JSON")] = False,
    trace: Annotated[Path | None, typer.Option(help="write a Chrome/Perfetto trace JSON here")] = None,
    spans_csv: Annotated[Path | None, typer.Option("--spans", help="write per-op spans as CSV here")] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="no progress bar")] = False,
) -> None:
    """Simulate training iterations and report time, throughput, memory and traffic."""
    from offsim import make_run_config, simulate
    from offsim.report.chrome_trace import write_chrome_trace
    from offsim.report.progress import progress_bar

    try:
        cfg = make_run_config(hardware, workload, strategy, iterations=iterations, warmup_iterations=warmup)
        with progress_bar(cfg.iterations, "simulating iterations", enabled=not (quiet or as_json)) as advance:
            result = simulate(cfg, on_iteration=lambda done, total: advance())
    except OffsimError as exc:
        fail(str(exc))
        return
    if trace is not None and result.feasible:
        write_chrome_trace(result, trace)
    if spans_csv is not None and result.feasible:
        result.spans().to_csv(spans_csv, index=False)
    if as_json:
        sys.stdout.write(result.to_json() + "\n")
    else:
        print_metrics_table(result)
        if trace is not None and result.feasible:
            console.print(f"trace written to {trace} (open in ui.perfetto.dev or chrome://tracing)")
    if not result.feasible:
        raise typer.Exit(1)


def _list(kind: str, describe) -> None:
    from offsim.config import loading

    loader = {"hardware": loading.load_profile, "workload": loading.load_workload,
              "strategy": loading.load_strategy}[kind]
    t = Table(title=f"shipped {kind} files")
    t.add_column("name")
    t.add_column("summary")
    for name, path in shipped_files(kind).items():
        try:
            t.add_row(name, describe(loader(str(path))))
        except OffsimError as exc:
            t.add_row(name, f"[red]invalid: {exc}[/]")
    console.print(t)


@app.command()
def profiles() -> None:
    """List the shipped hardware profiles."""
    _list("hardware", lambda p: f"{p.topology.gpus_per_node}x {p.gpu.model}, {p.host_link.kind}"
          f"{' Gen' + str(p.host_link.generation) if p.host_link.generation else ''}, "
          f"{p.dram.capacity_gib:g} GiB DRAM, "
          f"{(str(p.nvme.drives) + 'x ' + p.nvme.model) if p.nvme else 'no NVMe'} [{p.provenance.kind}]")


@app.command()
def workloads() -> None:
    """List the shipped workloads."""
    _list("workload", lambda w: f"{w.model.total_params / 1e9:.2f}B params, {w.model.layers} layers, "
          f"seq {w.training.seq_len}, micro-batch {w.training.micro_batch}, dp {w.training.data_parallel}")


@app.command()
def strategies() -> None:
    """List the shipped strategies."""
    _list("strategy", lambda s: s.description)


@app.command()
def schema(kind: Annotated[str, typer.Argument(help="hardware, workload or strategy")]) -> None:
    """Print the JSON Schema of a data file kind (for editors)."""
    from offsim.config.hardware import HardwareProfile
    from offsim.config.strategy import Strategy
    from offsim.config.workload import Workload

    models = {"hardware": HardwareProfile, "workload": Workload, "strategy": Strategy}
    if kind not in models:
        fail(f"unknown kind '{kind}'; choose one of {', '.join(models)}")
    sys.stdout.write(json.dumps(models[kind].model_json_schema(), indent=2) + "\n")


@app.command()
def version() -> None:
    """Print offsim's version."""
    console.print(__version__)


def _register_extensions() -> None:
    """Let every module in offsim.commands add its commands."""
    import offsim.commands as commands

    for info in pkgutil.iter_modules(commands.__path__):
        if info.name.startswith("_"):  # shared helpers, no commands
            continue
        module = importlib.import_module(f"offsim.commands.{info.name}")
        module.register(app)


_register_extensions()
