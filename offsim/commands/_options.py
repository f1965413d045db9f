"""The options every ``offsim`` subcommand shares, each declared once (issue 20: one CLI).

A command module imports this module, not its names, and reads as the habit it follows::

    from offsim.commands import _options as opt

    def command(hardware: opt.Hardware = opt.HARDWARE, as_json: opt.Json = False,
                out: Annotated[Path | None, opt.out("write the table as CSV here")] = None) -> None: ...

The same option has the same long name, short form, help and default in every subcommand:
``-H/--hardware``, ``-w/--workload``, ``-s/--strategy`` (defaults: the README's main example),
``--iterations``, ``--warmup``, ``--json`` (machine-readable output on stdout), ``-q/--quiet``,
``-o/--out`` (the one output file or folder; :func:`out` says what goes there), ``--html`` (one
chart) and ``--figures`` (a folder of figures). Nothing is written to disk unless an option names
where.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

#: The README's main example: every subcommand that takes one configuration defaults to it.
HARDWARE = "rtx4090-pcie4-ws"
WORKLOAD = "llama2-7b"
STRATEGY = "zero-offload"
#: Optimizer steps simulated, and the leading ones left out of the metrics, unless given.
ITERATIONS = 3
WARMUP = 1

Hardware = Annotated[str, typer.Option("--hardware", "-H", help="hardware profile name or YAML path")]
Workload = Annotated[str, typer.Option("--workload", "-w", help="workload name, YAML path or HF config.json")]
Strategy = Annotated[str, typer.Option("--strategy", "-s", help="strategy name or YAML path")]
Json = Annotated[bool, typer.Option("--json", help="machine-readable output (JSON) on stdout")]
Quiet = Annotated[bool, typer.Option("--quiet", "-q", help="no progress, no summary lines")]
Iterations = Annotated[int, typer.Option(min=1, help="optimizer steps to simulate")]
Warmup = Annotated[int, typer.Option(min=0, help="leading steps left out of the metrics")]
Samples = Annotated[int, typer.Option(
    min=0, help="draws of the assumed inputs (their ranges: --assumptions) for p10/p50/p90; 0: none")]
Seed = Annotated[int, typer.Option(help="seed of the draws of the assumed inputs")]
Assumptions = Annotated[Path | None, typer.Option(
    help="ranges of the assumed inputs (default: the shipped validation/assumptions.yaml)")]
Html = Annotated[Path | None, typer.Option(help="write the chart here (self-contained HTML)")]
Figures = Annotated[Path | None, typer.Option(
    "--figures", help="also write the figures, each a self-contained HTML file, into this folder")]


def out(what: str, *aliases: str) -> Any:
    """The ``-o/--out`` option (and ``aliases``, e.g. ``--csv``): the one file or folder the command
    writes; ``what`` is its help, saying what is written there.

    Use it as the metadata of an ``Annotated`` path: ``Annotated[Path | None, opt.out("...")]``.
    """
    return typer.Option("--out", "-o", *aliases, help=what)


def strategy(what: str, *aliases: str) -> Any:
    """``-s/--strategy`` (and ``aliases``) where a command gives the strategy a role of its own
    (``what`` is its help): the base of ``compare``, everything but activations in ``rok``."""
    return typer.Option("--strategy", *aliases, "-s", help=what)
