"""The ``offsim`` command line (Typer).

Core commands live here (``run``, ``profiles``, ``workloads``, ``schema``, ``version``); every
module in :mod:`offsim.commands` adds its own with a ``register(app)`` function, and is imported
only when one of its commands runs or its help is shown (:data:`COMMAND_MODULES`), so that
``offsim run`` pays for none of them (issue 16: start-up time).
User errors (:class:`~offsim.errors.OffsimError`) print one message and exit with status 2; the
exit codes of every command are listed once, in :mod:`offsim.commands._common`.
"""

from __future__ import annotations

import atexit
import functools
import gc
import importlib
import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from typer.core import TyperCommand, TyperGroup

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

if TYPE_CHECKING:
    from pydantic import BaseModel
    from typer import _click as click  # Typer's own copy of click, which its groups hold

__all__ = ["COMMAND_MODULES", "ConsoleApp", "app", "commands"]

#: Each command defined in :mod:`offsim.commands`, with the module that defines it (a test checks
#: this against the modules' ``register``). The help lists them in this order, after the core ones.
COMMAND_MODULES: dict[str, str] = {
    "strategies": "strategies", "schedule": "schedule", "compare": "compare", "rok": "compare",
    "fit": "fit", "tune": "tune", "report": "report", "sweep": "sweep", "size": "sweep",
    "validate": "validate", "calibrate": "calibrate",
}

#: each lazily registered command's line in ``offsim --help`` (the first paragraph of its help, as
#: the help prints it), so that the help lists them without importing their modules (issue 16: it
#: imported all eleven, with the input models, the sweep and the readers they import; a test checks
#: these against the modules)
COMMAND_SUMMARIES: dict[str, str] = {
    "strategies": 'List the shipped strategies; or explain a strategy file; or write one as a ds_config.',
    "schedule": 'Print the schedule (ops, streams, dependencies) a strategy builds for one configuration.',
    "compare": (
        'Run several policies (or strategies) on one profile and workload side by side: time,\n'
        'stall, bytes per link, hit rate and peak memory per tier, and bytes against the lower bound\n'
        'any policy must move (and the best schedule found), over one or several cache sizes. The\n'
        'first line is the decision (per budget, the fastest policy and its distance to the bound);\n'
        '--quiet prints only that line. With --samples N, each variant at the same N draws of the\n'
        'assumed inputs: p10-p90 of its time, in how many it fits and is the fastest. Exit 1 when no\n'
        'variant fits.'
    ),
    "rok": (
        'The ROK curve: GPU memory saved against time cost of recomputing, offloading to DRAM or\n'
        'offloading to NVMe the activations of 0..all blocks. Exit 1 when no point fits.'
    ),
    "fit": (
        'Does it fit (GPU, pinned host, host, NVMe), with which strategy, and how fast; with\n'
        "DeepSpeed's memory estimator for the same model. Exit 1 when no strategy fits."
    ),
    "tune": (
        "Search ProTrain's knobs (persistent chunks, prefetch depth, blocks that swap or recompute\n"
        'activations, CPU step overlap) by simulation; print the choice and its time against the base.\n'
        'The base may be a DeepSpeed, Accelerate or Megatron-Core file, read with the workload as\n'
        'offsim run reads it (its batch applies to every candidate). Exits 1 when nothing fits.'
    ),
    "report": (
        'Simulate one or more configurations and print the bottleneck of each (with --policies, which\n'
        'policy to use first); -o writes the HTML report (figures, metrics, bottleneck), --figures each\n'
        "run's figures."
    ),
    "sweep": (
        'Run a grid of what-if points (hardware, workload, strategy), local or on Dask; with -o, kept\n'
        'in a resumable store with its tables; without, printed only.'
    ),
    "size": 'Find the cheapest (or smallest) machine meeting a target, by a monotone search.',
    "validate": (
        'Simulate each published case and print predicted vs measured with the error and a\n'
        'prediction interval per figure (p10-p90 from the held-out errors of other sources and, with\n'
        "--samples, from the assumed inputs' ranges), with their coverage; exit 1 when a case misses its\n"
        'tolerance. With --real, train for real (PyTorch) on -H/-w and compare per phase with the\n'
        'simulation of the same setup.'
    ),
    "calibrate": (
        'Run the microbenchmarks (GPU via PyTorch CUDA when present; CPU optimizer and memcpy;\n'
        'NVMe with O_DIRECT or fio), fit latency/bandwidth and efficiency curves, write the profile;\n'
        'exit 1 when a part could not be measured.'
    ),
}


def unwrapped(text: str) -> str:
    """``text`` with the line breaks inside each paragraph made spaces: the help reflows a paragraph
    to the terminal, but in Typer's rich mode keeps a single line break where it was written, so a
    docstring's source lines would end the help's lines mid-sentence."""
    return "\n\n".join(" ".join(p.split()) for p in text.split("\n\n"))


#: The collector's youngest-generation threshold while a command runs (CPython's default: 700
#: allocations), as the engine's own during a simulation (:func:`offsim.simulation._few_collections`).
COMMAND_GC_THRESHOLD = 100_000


@contextmanager
def few_collections() -> Iterator[None]:
    """Collect the youngest generation every :data:`COMMAND_GC_THRESHOLD` allocations, not 700,
    and restore the thresholds after.

    What a command makes first lives until it exits: modules, classes, input models and their
    validators; at the default threshold ``offsim run``'s start-up passed ~100 times over them
    (98 young and 8 middle collections, ~15-25 ms of its ~350 ms CPU before this, issue 16). Cycles
    are still collected, every 100,000 allocations.
    """
    thresholds = gc.get_threshold()
    gc.set_threshold(COMMAND_GC_THRESHOLD, *thresholds[1:])
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)


class LazyGroup(TyperGroup):
    """The ``offsim`` group: a command of :data:`COMMAND_MODULES` is built, its module imported and
    registered, when it is first asked for (to run it, or for the help that lists it); every
    command runs under :func:`few_collections`."""

    def main(self, *args: Any, **kwargs: Any) -> Any:
        with few_collections():
            return super().main(*args, **kwargs)

    def list_commands(self, ctx: Any) -> list[str]:
        return [*self.commands, *(name for name in COMMAND_MODULES if name not in self.commands)]

    _listing = False  # True while the group's own help is written

    def format_help(self, ctx: Any, formatter: Any) -> None:
        """The group's help, listing the commands not yet loaded by :data:`COMMAND_SUMMARIES`."""
        self._listing = True
        self.help = unwrapped(self.help or "")
        try:
            super().format_help(ctx, formatter)
        finally:
            self._listing = False

    def get_command(self, ctx: Any, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in COMMAND_MODULES:
            if self._listing:  # a line of the help: its summary, the module left unimported
                return TyperCommand(cmd_name, help=COMMAND_SUMMARIES[cmd_name],
                                    short_help=unwrapped(COMMAND_SUMMARIES[cmd_name]))
            self._load(COMMAND_MODULES[cmd_name])
        command = self.commands.get(cmd_name)
        if self._listing and command is not None and command.short_help is None:
            command.short_help = unwrapped((command.help or "").split("\n\n")[0])
        return command

    def resolve_command(self, ctx: Any, args: list[str]) -> tuple[str | None, click.Command | None, list[str]]:
        if args and args[0] not in self.commands and args[0] not in COMMAND_MODULES:
            for module_name in dict.fromkeys(COMMAND_MODULES.values()):  # a typo: suggest from all
                self._load(module_name)
        return super().resolve_command(ctx, args)

    def _load(self, module_name: str) -> None:
        """Import ``offsim.commands.<module_name>`` and add the commands its ``register`` makes."""
        module = importlib.import_module(f"offsim.commands.{module_name}")
        extension = typer.Typer(rich_markup_mode=self.rich_markup_mode)
        module.register(extension)
        for name, command in typer.main.get_group(extension).commands.items():
            self.commands.setdefault(name, command)


class ConsoleApp(typer.Typer):
    """The ``offsim`` app; calling it (what the ``offsim`` console script does, ``app()``) also
    freezes the collector's objects at interpreter exit (:func:`freeze_at_exit`)."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        freeze_at_exit()
        return super().__call__(*args, **kwargs)


@functools.cache  # registered once, at the first call, however often the app runs in a process
def freeze_at_exit() -> None:
    """Move every object the collector tracks to its permanent generation (:func:`gc.freeze`) when
    the interpreter exits: registered when the app is first called, so it runs after every
    ``atexit`` handler registered later (a command's, Dask's; handlers run last-in first-out).

    CPython's shutdown (``Py_FinalizeEx``: ``finalize_modules`` then ``_PyGC_CollectNoFail``)
    runs full collections over every object still alive: modules, classes, input models, a run's
    schedule and records; frozen objects are skipped by those collections (the ``gc.freeze``
    documentation), so the process exits without walking them. Modules are still cleared, the
    standard streams flushed, every ``atexit`` handler and ``weakref.finalize`` callback run; what
    the walk would have added is ``__del__`` of objects left in reference cycles, which Python
    does not promise at exit (the ``object.__del__`` documentation) and offsim does not rely on:
    its files are written and closed inside ``with`` blocks. ``offsim run``'s teardown: 56 -> 10
    ms wall, its whole process ~455 -> ~405 ms CPU (2 cores shared, load 4-6; issue 16)."""
    atexit.register(gc.freeze)


app = ConsoleApp(cls=LazyGroup, add_completion=False, no_args_is_help=True)


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
    samples: opt.Samples = 0,
    seed: opt.Seed = 0,
    assumptions: opt.Assumptions = None,
) -> None:
    """Simulate training iterations and report time, throughput, memory and traffic; with
    --samples N, also p10/p50/p90 of the iteration time and of peak memory per tier over N draws
    of the assumed inputs' ranges, and in how many draws it fits."""
    from offsim import simulate

    check_out_file(trace, "--trace")
    check_out_file(spans_csv, "--spans")
    cfg = load_config(hardware, workload, strategy, iterations=iterations, warmup=warmup, quiet=quiet)
    try:
        if quiet:  # no progress to show: neither the bar's module nor rich imported (issue 16)
            result = simulate(cfg)
        else:
            from offsim.report.progress import progress_bar

            with progress_bar(cfg.iterations, "simulating iterations") as advance:
                result = simulate(cfg, on_iteration=lambda done, total: advance())
    except OffsimError as exc:
        fail(str(exc))
    if result.feasible:
        _write_run_files(result, trace, spans_csv)
    iv = None
    if samples:
        from offsim.commands._intervals import print_intervals, sample_run

        iv = sample_run(cfg, samples, seed, assumptions, progress=not quiet)
    if as_json:
        doc = json.loads(result.to_json())  # re-encoded strictly: no NaN/Infinity
        print_json(doc if iv is None else {**doc, "intervals": iv.to_dict()})
    else:
        print_metrics_table(result)
        if not result.feasible:  # every tier's verdict with its margin (issue 23)
            from offsim.commands._verdicts import print_run_margins

            print_run_margins(result.config)
        if iv is not None:
            print_intervals(iv, result, assumptions)
        if trace is not None and result.feasible:
            say(f"trace written to {trace} (open in ui.perfetto.dev or chrome://tracing)")
    if not result.feasible:
        raise typer.Exit(ExitCode.NO)


def _write_run_files(result: Any, trace: Path | None, spans_csv: Path | None) -> None:
    """Write the trace and the spans of a feasible run where their options name."""
    if trace is not None:
        from offsim.report.chrome_trace import write_chrome_trace

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
    """Print offsim's version (the same as offsim --version)."""
    typer.echo(f"offsim {__version__}")


def commands() -> dict[str, click.Command]:
    """Every command of ``offsim`` by name, in the help's order (each command module imported)."""
    group = typer.main.get_command(app)
    assert isinstance(group, LazyGroup)
    found = {name: group.get_command(None, name) for name in group.list_commands(None)}
    return {name: command for name, command in found.items() if command is not None}
