"""The ``offsim`` command line (Typer).

Core commands live here (``run``, ``profiles``, ``workloads``, ``schema``; ``strategies`` is in
:mod:`offsim.commands.strategies`);
every module in :mod:`offsim.commands` adds its own with a ``register(app)`` function.
User errors (:class:`~offsim.errors.OffsimError`) print one message and exit with status 2; the
exit codes of every command are listed once, in :mod:`offsim.commands._common`.
"""

from __future__ import annotations

import importlib
import json
import pkgutil
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import BaseModel

from offsim import __version__
from offsim.commands import _options as opt
from offsim.commands._common import (
    DataKind,
    ExitCode,
    check_out_file,
    fail,
    list_shipped,
    load_config,
    print_json,
    print_metrics_table,
    say,
)
from offsim.errors import OffsimError

__all__ = ["app"]

app = typer.Typer(add_completion=False, no_args_is_help=True)


def _version_callback(value: bool) -> None:
    if value:
        typer.echo(f"offsim {__version__}")
        raise typer.Exit(ExitCode.OK)


@app.callback()
def main(
    version: Annotated[bool, typer.Option(
        "--version", callback=_version_callback, is_eager=True, help="print offsim's version and exit",
    )] = False,
) -> None:
    """offsim: simulate offloaded LLM training (GPU HBM, host DRAM, NVMe over PCIe).

    Exit status, the same for every command: 0 done; 1 the answer is no (a configuration does
    not fit, a validation case misses its tolerance, no machine meets a sizing target); 2 bad
    input (a file, a field or an option; one message, no traceback); 130 interrupted (Ctrl-C);
    143 stopped by SIGTERM.
    """


@app.command()
def run(
    hardware: opt.Hardware = opt.HARDWARE,
    workload: opt.Workload = opt.WORKLOAD,
    strategy: opt.Strategy = opt.STRATEGY,
    iterations: opt.Iterations = opt.ITERATIONS,
    warmup: opt.Warmup = opt.WARMUP,
    as_json: opt.Json = False,
    trace: Annotated[Path | None, typer.Option(help="write a Chrome/Perfetto trace JSON here")] = None,
    spans_csv: Annotated[Path | None, typer.Option("--spans", help="write per-op spans as CSV here")] = None,
    quiet: opt.Quiet = False,
) -> None:
    """Simulate training iterations and report time, throughput, memory and traffic."""
    from offsim import simulate
    from offsim.report.progress import progress_bar

    check_out_file(trace, "--trace")
    check_out_file(spans_csv, "--spans")
    cfg = load_config(hardware, workload, strategy, iterations=iterations, warmup=warmup, quiet=quiet)
    try:
        with progress_bar(cfg.iterations, "simulating iterations", enabled=not quiet) as advance:
            result = simulate(cfg, on_iteration=lambda done, total: advance())
    except OffsimError as exc:
        fail(str(exc))
    if result.feasible:
        _write_run_files(result, trace, spans_csv)
    if as_json:
        print_json(json.loads(result.to_json()))  # re-encoded strictly: no NaN/Infinity
    else:
        print_metrics_table(result)
        if trace is not None and result.feasible:
            say(f"trace written to {trace} (open in ui.perfetto.dev or chrome://tracing)")
    if not result.feasible:
        raise typer.Exit(ExitCode.NO)


def _write_run_files(result: Any, trace: Path | None, spans_csv: Path | None) -> None:
    """Write the trace and the spans of a feasible run where their options name."""
    from offsim.report.chrome_trace import write_chrome_trace

    if trace is not None:
        write_chrome_trace(result, trace)
    if spans_csv is not None:
        result.spans().to_csv(spans_csv, index=False)


def _describe_profile(p: Any) -> str:
    gen = f" Gen{p.host_link.generation}" if p.host_link.generation else ""
    nvme = f"{p.nvme.drives}x {p.nvme.model}" if p.nvme else "no NVMe"
    return (f"{p.topology.gpus_per_node}x {p.gpu.model}, {p.host_link.kind}{gen}, "
            f"{p.dram.capacity_gib:g} GiB DRAM, {nvme} [{p.provenance.kind}]")


def _describe_workload(w: Any) -> str:
    m = w.model
    moe = (f" ({m.active_params / 1e9:.2f}B active, {m.moe.experts} experts, top-{m.moe.experts_per_token})"
           if m.moe is not None else "")
    return (f"{m.total_params / 1e9:.2f}B params{moe}, {m.layers} layers, seq {w.training.seq_len}, "
            f"micro-batch {w.training.micro_batch}, dp {w.training.data_parallel}")


@app.command()
def profiles(as_json: opt.Json = False) -> None:
    """List the shipped hardware profiles."""
    list_shipped(DataKind.HARDWARE, _describe_profile, as_json)


@app.command()
def workloads(as_json: opt.Json = False) -> None:
    """List the shipped workloads."""
    list_shipped(DataKind.WORKLOAD, _describe_workload, as_json)


@app.command()
def schema(kind: Annotated[DataKind, typer.Argument(help="the kind of data file")]) -> None:
    """Print the JSON Schema of a data file kind (for editors)."""
    from offsim.config.hardware import HardwareProfile
    from offsim.config.strategy import Strategy
    from offsim.config.workload import Workload

    models: dict[DataKind, type[BaseModel]] = {
        DataKind.HARDWARE: HardwareProfile, DataKind.WORKLOAD: Workload, DataKind.STRATEGY: Strategy}
    print_json(models[kind].model_json_schema())


@app.command()
def version() -> None:
    """Print offsim's version (the same as ``offsim --version``)."""
    typer.echo(f"offsim {__version__}")


def _register_extensions() -> None:
    """Let every module in offsim.commands add its commands."""
    import offsim.commands as commands

    for info in pkgutil.iter_modules(commands.__path__):
        if info.name.startswith("_"):  # shared helpers, no commands
            continue
        module = importlib.import_module(f"offsim.commands.{info.name}")
        module.register(app)


_register_extensions()
