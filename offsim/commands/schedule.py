"""``offsim schedule``: the schedule a strategy builds, before any simulation.

The default view prints each block template once with how often it runs, one op per line (kind,
activity, stream, layer, bytes or seconds, tensors, dependencies), the per-unit programs of the
policy-managed caches, and one iteration's traffic per link. ``--json`` prints every op instance
with ``id``, ``kind``, ``layer``, ``micro_batch``, resources, ``bytes`` or ``flops`` and ``after``.
"""

from __future__ import annotations

import typer

from offsim.commands._common import (
    DEFAULT_HARDWARE,
    DEFAULT_STRATEGY,
    DEFAULT_WORKLOAD,
    HardwareOpt,
    IterationsOpt,
    JsonOpt,
    StrategyOpt,
    WorkloadOpt,
    fail,
)
from offsim.core import strict_json
from offsim.errors import OffsimError


def schedule(
    hardware: HardwareOpt = DEFAULT_HARDWARE,
    workload: WorkloadOpt = DEFAULT_WORKLOAD,
    strategy: StrategyOpt = DEFAULT_STRATEGY,
    iterations: IterationsOpt = 3,
    as_json: JsonOpt = False,
) -> None:
    """Print the schedule (ops, streams, dependencies) a strategy builds for one configuration."""
    from offsim import make_run_config
    from offsim.api import resolve
    from offsim.schedule.show import to_json, to_text
    from offsim.systems._registry import compile_strategy

    try:
        cfg = make_run_config(hardware, workload, strategy, iterations=iterations,
                              warmup_iterations=min(1, iterations - 1))
        compiled = compile_strategy(resolve(cfg))
    except OffsimError as exc:
        fail(str(exc))
    if as_json:
        typer.echo(strict_json.dumps(to_json(compiled)))  # no NaN/Infinity
    else:
        typer.echo(to_text(compiled))


def register(app: typer.Typer) -> None:
    """Add ``schedule`` to the CLI."""
    app.command()(schedule)
