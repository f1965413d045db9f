"""What every ``offsim`` subcommand shares: consoles, the error exit, exit codes, output checks,
the listings of shipped files. The shared options themselves are declared in
:mod:`offsim.commands._options`, which commands import as ``opt``.

Lives apart from :mod:`offsim.cli` so that the command modules never import the app that
imports them (no ``cli <-> commands`` cycle).

Exit codes (:class:`ExitCode`), used by every subcommand:

* ``0``: done;
* ``1``: the answer is "no": a configuration does not fit (infeasible; for ``fit``, no strategy
  fits), a validation case misses its tolerance, no machine meets a sizing target;
* ``2``: bad input (a file, a field or an option), reported as one message, never a traceback;
* ``130`` / ``143``: interrupted by Ctrl-C / stopped by SIGTERM (a sweep says how to resume).
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable, Iterator, Mapping
from enum import IntEnum, StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import typer

from offsim.core.strict_json import dumps

if TYPE_CHECKING:
    from rich.console import Console

    from offsim.config.hardware import HardwareProfile
    from offsim.config.run import RunConfig
    from offsim.config.workload import Workload


class ExitCode(IntEnum):
    """The exit status of every subcommand (listed in the module's docstring and ``offsim --help``)."""

    OK = 0
    NO = 1
    BAD_INPUT = 2
    INTERRUPTED = 130
    TERMINATED = 143


if TYPE_CHECKING:  # made on first use by __getattr__ (rich imported then)
    console: Console
    err_console: Console


class _EnvironSince(Mapping[str, str]):
    """``os.environ`` as a rich ``Console`` reads it: as it was when this module was imported while
    the console is made (its ``__init__`` reads ``COLUMNS``, ``LINES``, ``NO_COLOR``, the terminal
    variables), live after (``Console.size`` and ``is_terminal`` read it at each print): the
    consoles, made on first use, read what they read when they were made at import."""

    def __init__(self) -> None:
        self.frozen: dict[str, str] | None = dict(os.environ)

    def __getitem__(self, key: str) -> str:
        return (os.environ if self.frozen is None else self.frozen)[key]

    def __iter__(self) -> Iterator[str]:
        return iter(os.environ if self.frozen is None else self.frozen)

    def __len__(self) -> int:
        return len(os.environ if self.frozen is None else self.frozen)


_ENVIRON = _EnvironSince()


@functools.cache
def consoles() -> tuple[Console, Console]:
    """The rich consoles of stdout and stderr, made on first use as they were made when this
    module was imported (:class:`_EnvironSince`): ``offsim run`` writes its table without rich
    where rich would write the same (:mod:`offsim.commands._plain_table`; issue 16)."""
    from rich.console import Console

    made = Console(_environ=_ENVIRON), Console(stderr=True, _environ=_ENVIRON)
    _ENVIRON.frozen = None
    return made


def __getattr__(name: str) -> Console:
    """``console`` (stdout) and ``err_console`` (stderr), the consoles of :func:`consoles`."""
    if name in ("console", "err_console"):
        return consoles()[name == "err_console"]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def escape(text: str) -> str:
    """``text`` with rich markup escaped (``rich.markup.escape``, imported on first use)."""
    from rich.markup import escape as rich_escape

    return rich_escape(text)


def fail(message: str, code: int = ExitCode.BAD_INPUT) -> NoReturn:
    """Print ``message`` as the one error line (markup in it printed as text) and exit ``code``."""
    consoles()[1].print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def say(text: str, *, stderr: bool = False) -> None:
    """Print plain ``text`` (no markup, no highlighting; ``[...]`` is kept as written)."""
    consoles()[stderr].print(text, markup=False, highlight=False, soft_wrap=True)


def note(text: str) -> None:
    """A yellow ``note:`` line on stderr; ``text`` is printed as written."""
    consoles()[1].print(f"[yellow]note:[/] {escape(text)}", highlight=False, soft_wrap=True)


def strict_json(obj: Any, *, indent: int | None = 2) -> str:
    """Strict JSON text (RFC 8259: no ``NaN`` or ``Infinity``); non-finite numbers become ``null``."""
    return dumps(obj, indent=indent)


def print_json(obj: Any) -> None:
    """Write ``obj`` as strict JSON on stdout (the ``--json`` output of every command)."""
    sys.stdout.write(strict_json(obj) + "\n")


def load_config(hardware: str | HardwareProfile, workload: str | Workload, strategy: str, *,
                iterations: int = 3, warmup: int = 1, quiet: bool = False) -> RunConfig:
    """The run configuration of one (hardware, workload, strategy), read as ``offsim run`` reads it.

    A strategy file of DeepSpeed, Accelerate or Megatron-Core is read with the workload: its
    ``"auto"`` values are resolved from the model and the batch and precision it sets are applied
    to the workload (:func:`offsim.config.run.make_run_config`). What offsim ignored or
    approximated in such a file is printed as notes on stderr unless ``quiet``. Bad input exits 2.
    """
    from offsim.config.run import make_run_config
    from offsim.errors import OffsimError

    try:
        cfg = make_run_config(hardware, workload, strategy, iterations=iterations, warmup_iterations=warmup)
    except OffsimError as exc:
        fail(str(exc))
    for line in () if quiet else cfg.notes:
        note(line)
    return cfg


def gib(nbytes: float | None) -> str:
    """Bytes as GiB text."""
    return "-" if nbytes is None else f"{nbytes / 2**30:.2f} GiB"


def _writable_dir(folder: Path, option: str, given: Path) -> None:
    """Fail unless ``folder`` (existing, or the nearest existing parent) is a writable folder."""
    probe = folder
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    if probe.exists() and not probe.is_dir():
        fail(f"{option} {given}: {probe} is a file, not a folder")
    if probe.exists() and not os.access(probe, os.W_OK | os.X_OK):
        fail(f"{option} {given}: no permission to write in {probe}")


def check_out_file(path: Path | None, option: str = "--out") -> None:
    """Fail before any work when ``path`` cannot be written as a file.

    Refused: an existing folder, a path under a regular file, a folder without write permission.
    """
    if path is None:
        return
    if path.is_dir():
        fail(f"{option} {path}: is a folder; give a file name")
    if path.exists() and not os.access(path, os.W_OK):
        fail(f"{option} {path}: no permission to overwrite it")
    _writable_dir(path.parent, option, path)


def check_out_dir(path: Path | None, option: str = "--out") -> None:
    """Fail before any work when ``path`` cannot be used (or made) as an output folder."""
    if path is None:
        return
    if path.exists() and not path.is_dir():
        fail(f"{option} {path}: is a file; give a folder")
    _writable_dir(path, option, path)


def check_positive(value: int | None, option: str) -> None:
    """Fail when a count option is given as zero or negative."""
    if value is not None and value < 1:
        fail(f"{option} must be at least 1, got {value}")


class DataKind(StrEnum):
    """The kinds of data file offsim reads (each a folder of shipped files and a schema)."""

    HARDWARE = "hardware"
    WORKLOAD = "workload"
    STRATEGY = "strategy"


def list_shipped(kind: DataKind, describe: Callable[[Any], str], as_json: bool) -> None:
    """Print the shipped files of ``kind`` with a one-line summary each."""
    from offsim.config import loading
    from offsim.errors import OffsimError

    loader = {DataKind.HARDWARE: loading.load_profile, DataKind.WORKLOAD: loading.load_workload,
              DataKind.STRATEGY: loading.load_strategy}[kind]
    rows: dict[str, dict[str, str]] = {}
    for name, path in loading.shipped_files(kind).items():
        try:
            rows[name] = {"summary": describe(loader(str(path))), "path": str(path)}
        except OffsimError as exc:
            rows[name] = {"summary": f"invalid: {exc}", "path": str(path)}
    if as_json:
        print_json(rows)
        return
    from rich.table import Table

    t = Table(title=f"shipped {kind} files")
    t.add_column("name")
    t.add_column("summary")
    for name, row in rows.items():
        t.add_row(escape(name), escape(row["summary"]))
    consoles()[0].print(t)


def print_metrics_table(result: Any) -> None:
    """A human summary of one run (a :class:`~offsim.results.RunResult`): rich's table, written
    without rich where that gives the same text (:func:`~offsim.commands._plain_table.two_column_table`)."""
    m = result.metrics
    cfg = result.config
    title = f"{cfg.workload.name} on {cfg.hardware.name} with {cfg.strategy.name}"
    if not m.feasible:
        consoles()[0].print(f"[bold]{escape(title)}[/]\n[bold red]infeasible:[/] {escape(str(m.infeasible_reason))}",
                            highlight=False)
        return
    from offsim.commands._plain_table import console_width, two_column_table, writes_plain

    rows = metrics_rows(result)
    plain = two_column_table(title, rows, console_width(os.environ)) if writes_plain(sys.stdout, os.environ) else None
    if plain is not None:
        sys.stdout.write(plain)
        sys.stdout.flush()  # as rich's Console.print does: stderr written after comes after it
        return
    consoles()[0].print(metrics_table(title, rows))


def metrics_rows(result: Any) -> list[tuple[str, str]]:
    """The (metric, value) rows of :func:`print_metrics_table`, as text (no markup)."""
    rows: list[tuple[str, str]] = []
    _time_rows(rows, result.metrics)
    _memory_rows(rows, result.metrics, result.config)
    _cache_rows(rows, result)
    return rows


def metrics_table(title: str, rows: list[tuple[str, str]]) -> Any:
    """The rich ``Table`` of :func:`print_metrics_table` (every text escaped: printed as written)."""
    from rich.table import Table

    t = Table(title=escape(title), show_header=False)
    t.add_column("metric")
    t.add_column("value", justify="right")
    for label, value in rows:
        t.add_row(escape(label), escape(value))
    return t


def _cache_rows(t: list[tuple[str, str]], result: Any) -> None:
    """A row per cache: hit rate, bytes it moved, and the lower bound any policy must move.

    The bound is :func:`offsim.cache_stats.cache_bound` (min-cost flow, a bound whatever the
    tensor sizes). Where it cannot be computed (no cache events recorded), the run's offline
    plan (``offline_plan_bytes_fetched``: Belady's rule with a search over the odd-sized tensors) is
    shown, and named a heuristic: it is neither OPT nor a bound.
    """
    bounds = _cache_lower_bounds(result)
    for name, c in result.metrics.cache.items():
        rate = "-" if c.hit_rate is None else f"{100 * c.hit_rate:.0f} %"
        if c.writeback_links:
            moved = f"moved {(c.bytes_fetched + c.bytes_written_back) / 1e9:.3f} GB (fetched + written back)"
        else:
            moved = f"fetched {c.bytes_fetched / 1e9:.3f} GB"
        lower = bounds.get(name)
        against = (f"lower bound {lower / 1e9:.3f} GB" if lower is not None
                   else f"belady (heuristic) {c.offline_plan_bytes_fetched / 1e9:.3f} GB")
        t.append((f"cache {name} ({c.policy})", f"hits {rate}, {moved}, {against}"))


def _cache_lower_bounds(result: Any) -> dict[str, float]:
    """Per cache, the lower bound on the bytes any policy moves per steady iteration (its own
    bytes: fetched, plus written back for a write-back cache); caches without events are left out."""
    from offsim.cache_stats import cache_bound
    from offsim.metrics import steady_iterations

    rec = result.recorder
    with_events = {e.cache for e in rec.cache_events} & set(rec.cache_info)
    if not with_events:
        return {}
    steady = steady_iterations(result.config, rec)[0]
    return {name: cache_bound(rec, name, steady).lower_bytes for name in result.metrics.cache
            if name in with_events and steady}


def _time_rows(t: list[tuple[str, str]], m: Any) -> None:
    """Rows for time, throughput and busy fractions."""
    t.append(("iteration time", f"{m.iteration_time_s:.4g} s"))
    t.append(("throughput (whole job)", f"{m.tokens_per_s:,.0f} tokens/s"))
    t.append(("model TFLOP/s per GPU", f"{m.tflops_per_gpu:.1f}"))
    t.append(("hardware TFLOP/s per GPU (recompute incl.)", f"{m.hardware_tflops_per_gpu:.1f}"))
    t.append(("GPU busy", f"{100 * m.gpu_busy_fraction:.1f} %"))
    for phase, secs in m.phases_s.model_dump().items():
        t.append((f"phase {phase}", f"{secs:.4g} s"))
    t.append(("optimizer step (whole)", f"{m.optimizer_step_s:.4g} s"))
    t.append(("GPU stalled on data", f"{m.stall_s:.4g} s"))


#: What each peak-memory row is per, and what it is.
PEAK_LABELS = {
    "gpu": "peak GPU (per GPU)",
    "host_pinned": "peak pinned host (per node)",
    "host": "peak host, pinned incl. (per node)",
    "nvme": "peak NVMe (per node)",
    "pfs": "peak parallel FS (whole job)",
}


def _memory_rows(t: list[tuple[str, str]], m: Any, cfg: Any) -> None:
    """Rows for peak memory per tier and traffic per link; tiers the profile lacks are left out."""
    for tier, b in m.peak_bytes.model_dump().items():
        if not b and not configured(cfg, tier):
            continue
        t.append((PEAK_LABELS.get(tier, f"peak {tier}"), gib(b)))
    for link, b in m.traffic_bytes.model_dump().items():
        if not b and not configured(cfg, link):
            continue
        t.append((f"{link} / iteration (per GPU)", f"{b / 1e9:.3f} GB"))
    if m.activation_policy is not None:
        t.append(("activations", str(m.activation_policy)))


def configured(cfg: Any, what: str) -> bool:
    """Whether the run has the tier or link ``what`` (NVMe, a parallel FS, a GPU-GPU link)."""
    hw = cfg.hardware
    if what == "gpu_link":
        return bool(hw.topology.gpus_per_node > 1)
    if what.startswith("nvme"):
        return getattr(hw, "nvme", None) is not None
    if what.startswith("pfs"):
        return getattr(hw, "pfs", None) is not None
    return True
