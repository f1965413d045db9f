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

import os
import sys
from collections.abc import Callable
from enum import IntEnum, StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from offsim.core.strict_json import dumps

if TYPE_CHECKING:
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


console = Console()
err_console = Console(stderr=True)


def fail(message: str, code: int = ExitCode.BAD_INPUT) -> NoReturn:
    """Print ``message`` as the one error line (markup in it printed as text) and exit ``code``."""
    err_console.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def say(text: str, *, stderr: bool = False) -> None:
    """Print plain ``text`` (no markup, no highlighting; ``[...]`` is kept as written)."""
    (err_console if stderr else console).print(text, markup=False, highlight=False, soft_wrap=True)


def note(text: str) -> None:
    """A yellow ``note:`` line on stderr; ``text`` is printed as written."""
    err_console.print(f"[yellow]note:[/] {escape(text)}", highlight=False, soft_wrap=True)


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
    t = Table(title=f"shipped {kind} files")
    t.add_column("name")
    t.add_column("summary")
    for name, row in rows.items():
        t.add_row(escape(name), escape(row["summary"]))
    console.print(t)


def print_metrics_table(result: Any) -> None:
    """A human summary of one run (a :class:`~offsim.results.RunResult`)."""
    m = result.metrics
    cfg = result.config
    title = escape(f"{cfg.workload.name} on {cfg.hardware.name} with {cfg.strategy.name}")
    if not m.feasible:
        console.print(f"[bold]{title}[/]\n[bold red]infeasible:[/] {escape(str(m.infeasible_reason))}",
                      highlight=False)
        return
    t = Table(title=title, show_header=False)
    t.add_column("metric")
    t.add_column("value", justify="right")
    _time_rows(t, m)
    _memory_rows(t, m, cfg)
    _cache_rows(t, result)
    console.print(t)


def _cache_rows(t: Table, result: Any) -> None:
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
        t.add_row(escape(f"cache {name} ({c.policy})"), f"hits {rate}, {moved}, {against}")


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


def _time_rows(t: Table, m: Any) -> None:
    """Rows for time, throughput and busy fractions."""
    t.add_row("iteration time", f"{m.iteration_time_s:.4g} s")
    t.add_row("throughput (whole job)", f"{m.tokens_per_s:,.0f} tokens/s")
    t.add_row("model TFLOP/s per GPU", f"{m.tflops_per_gpu:.1f}")
    t.add_row("hardware TFLOP/s per GPU (recompute incl.)", f"{m.hardware_tflops_per_gpu:.1f}")
    t.add_row("GPU busy", f"{100 * m.gpu_busy_fraction:.1f} %")
    for phase, secs in m.phases_s.model_dump().items():
        t.add_row(f"phase {phase}", f"{secs:.4g} s")
    t.add_row("optimizer step (whole)", f"{m.optimizer_step_s:.4g} s")
    t.add_row("GPU stalled on data", f"{m.stall_s:.4g} s")


#: What each peak-memory row is per, and what it is.
PEAK_LABELS = {
    "gpu": "peak GPU (per GPU)",
    "host_pinned": "peak pinned host (per node)",
    "host": "peak host, pinned incl. (per node)",
    "nvme": "peak NVMe (per node)",
    "pfs": "peak parallel FS (whole job)",
}


def _memory_rows(t: Table, m: Any, cfg: Any) -> None:
    """Rows for peak memory per tier and traffic per link; tiers the profile lacks are left out."""
    for tier, b in m.peak_bytes.model_dump().items():
        if not b and not configured(cfg, tier):
            continue
        t.add_row(PEAK_LABELS.get(tier, f"peak {tier}"), gib(b))
    for link, b in m.traffic_bytes.model_dump().items():
        if not b and not configured(cfg, link):
            continue
        t.add_row(f"{link} / iteration (per GPU)", f"{b / 1e9:.3f} GB")
    if m.activation_policy is not None:
        t.add_row("activations", escape(str(m.activation_policy)))


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
