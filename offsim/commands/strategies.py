"""``offsim strategies``: list the shipped strategies, explain a user's strategy file, or write a
shipped strategy as a DeepSpeed ds_config.

``--explain FILE`` prints what offsim understood from a DeepSpeed, Accelerate or Megatron-Core
file (:func:`offsim.config.loading.read_strategy`): each input value and where it came from, the
strategy knobs it set, the keys ignored and the approximations. ``--ds-config NAME`` writes
:func:`offsim.config.ds_config.ds_config_from_strategy` as JSON, and lists on stderr the knobs a
ds_config cannot carry.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from offsim.commands import _options as opt
from offsim.commands._common import DataKind, check_out_file, console, fail, list_shipped, note, print_json, say
from offsim.config.reading import Reading
from offsim.errors import OffsimError


def explain_data(reading: Reading) -> dict[str, Any]:
    """The explanation as plain data (the ``--json`` output)."""
    from offsim.config.strategy import Strategy

    st = reading.strategy
    defaults = Strategy.model_validate({"name": "x", "provenance": st.provenance.model_dump()})
    skip = {"name", "description", "provenance"}
    knobs = {k: v for k, v in st.model_dump(exclude=skip).items()
             if v != defaults.model_dump(exclude=skip)[k] or k in ("zero_stage", "placement", "optimizer_device")}
    return {
        "source": reading.source, "format": reading.fmt, "strategy": st.name,
        "settings": [{"key": s.key, "value": s.value, "from": s.origin, "detail": s.detail}
                     for s in reading.settings],
        "strategy_knobs": knobs,
        "workload_changes": {"training": reading.training, "precision": reading.precision},
        "ignored": list(reading.ignored), "approximations": list(reading.approximations),
    }


def print_explanation(data: dict[str, Any]) -> None:
    """The explanation as tables and lists."""
    console.print(f"[bold]{escape(data['source'])}[/]: read as {data['format']}, strategy '{escape(data['strategy'])}'",
                  highlight=False)
    if data["settings"]:
        t = Table(title="values read (from: file, default, auto, derived)")
        for col in ("key", "value", "from", "detail"):
            t.add_column(col)
        for s in data["settings"]:
            t.add_row(escape(s["key"]), escape(repr(s["value"])), s["from"], escape(s["detail"]))
        console.print(t)
    t = Table(title="strategy offsim simulates (knobs set; the rest are offsim's defaults)")
    t.add_column("knob")
    t.add_column("value")
    for k, v in data["strategy_knobs"].items():
        t.add_row(escape(k), escape(json.dumps(v)))
    console.print(t)
    for part, fields in data["workload_changes"].items():
        for k, v in fields.items():
            say(f"sets the workload's {part}.{k} = {v}")
    for title, lines in (("ignored", data["ignored"]), ("approximated", data["approximations"])):
        for line in lines:
            say(f"{title}: {line}")


def explain(path: str, workload: str | None, as_json: bool) -> None:
    """``strategies --explain FILE [-w WORKLOAD]``."""
    from offsim.config.loading import load_workload, read_strategy

    try:
        wl = load_workload(workload) if workload else None
        data = explain_data(read_strategy(path, wl))
    except OffsimError as exc:
        fail(str(exc))
    if as_json:
        print_json(data)
    else:
        print_explanation(data)


def write_ds_config(name: str, out: Path | None) -> None:
    """``strategies --ds-config NAME [-o FILE]``: the ds_config on stdout or in ``out``; the knobs
    it cannot carry as notes on stderr."""
    from offsim.config.ds_config import ds_config_from_strategy, inexpressible
    from offsim.config.loading import load_strategy

    check_out_file(out)
    try:
        st = load_strategy(name)
        text = json.dumps(ds_config_from_strategy(st), indent=2) + "\n"
        missing = inexpressible(st)
    except OffsimError as exc:
        fail(str(exc))
    for line in missing:
        note(f"not expressible in a ds_config, left out: {line}")
    if out is None:
        typer.echo(text, nl=False)
    else:
        out.write_text(text)
        say(f"ds_config written to {out}", stderr=True)


def strategies(
    as_json: opt.Json = False,
    explain_file: Annotated[str | None, typer.Option(
        "--explain", help="print what offsim understood from a strategy file (DeepSpeed ds_config, "
                          "Accelerate config, Megatron-Core options)")] = None,
    ds_config: Annotated[str | None, typer.Option(
        "--ds-config", help="write this strategy (shipped name or path) as a DeepSpeed ds_config JSON")] = None,
    workload: Annotated[str | None, typer.Option(
        "--workload", "-w", help="with --explain: the workload that resolves \"auto\" and the batch keys")] = None,
    out: Annotated[Path | None, opt.out("with --ds-config: write the JSON here")] = None,
) -> None:
    """List the shipped strategies; or explain a strategy file; or write one as a ds_config."""
    if explain_file and ds_config:
        fail("give --explain or --ds-config, not both")
    if explain_file:
        explain(explain_file, workload, as_json)
    elif ds_config:
        write_ds_config(ds_config, out)
    else:
        list_shipped(DataKind.STRATEGY, lambda s: s.description, as_json)


def register(app: typer.Typer) -> None:
    """Add ``strategies`` to the CLI."""
    app.command()(strategies)
