"""``offsim schedule``: the schedule a strategy builds, before any simulation.

The default view prints each block template once with how often it runs, one op per line (kind,
activity, stream, layer, bytes or seconds, tensors, dependencies), the per-unit programs of the
policy-managed caches, and one iteration's traffic per link. ``--json`` prints every op instance
with ``id``, ``kind``, ``layer``, ``micro_batch``, resources, ``bytes`` or ``flops`` and ``after``;
``-o FILE`` writes that JSON to a file (the text view is still printed unless ``-q``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from offsim.commands import _options as opt
from offsim.commands._common import check_out_file, fail, load_config, say
from offsim.core import strict_json
from offsim.errors import OffsimError


def schedule(
    hardware: opt.Hardware = opt.HARDWARE,
    workload: opt.Workload = opt.WORKLOAD,
    strategy: opt.Strategy = opt.STRATEGY,
    iterations: opt.Iterations = opt.ITERATIONS,
    out: Annotated[Path | None, opt.out("write every op instance as JSON here (what --json prints)")] = None,
    as_json: opt.Json = False,
    quiet: opt.Quiet = False,
) -> None:
    """Print the schedule (ops, streams, dependencies) a strategy builds for one configuration."""
    from offsim.api import resolve
    from offsim.schedule.show import to_json, to_text
    from offsim.systems._registry import compile_strategy

    check_out_file(out)
    cfg = load_config(hardware, workload, strategy, iterations=iterations, warmup=min(1, iterations - 1),
                      quiet=quiet or as_json)
    try:
        compiled = compile_strategy(resolve(cfg))
    except OffsimError as exc:
        fail(str(exc))
    text = strict_json.dumps(to_json(compiled)) if out is not None or as_json else ""  # no NaN/Infinity
    if out is not None:
        out.write_text(text + "\n")
    if as_json:
        typer.echo(text)
    elif not quiet:
        typer.echo(to_text(compiled))
        if out is not None:
            say(f"schedule written to {out}")


def register(app: typer.Typer) -> None:
    """Add ``schedule`` to the CLI."""
    app.command()(schedule)
