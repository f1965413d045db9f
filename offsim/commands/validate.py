"""``offsim validate``: predicted vs measured on published cases (and, with --real, on a real run)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

console = Console()


def _fmt(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:.4g}"


def validate(
    cases: Annotated[Path | None, typer.Option(help="cases YAML (default: the shipped validation/cases.yaml)")] = None,
    csv: Annotated[Path | None, typer.Option(help="write the table as CSV here")] = None,
    strict: Annotated[bool, typer.Option(help="exit 1 when a validation case misses its tolerance")] = False,
) -> None:
    """Simulate each published case and print predicted vs measured with the error."""
    import pandas as pd

    from offsim.cli import fail
    from offsim.errors import OffsimError
    from offsim.validation import default_cases_path, load_cases, run_case

    try:
        rows = [run_case(c) for c in load_cases(cases or default_cases_path())]
    except OffsimError as exc:
        fail(str(exc))
        return
    t = Table(title="offsim vs published measurements")
    for col in ("case", "role", "metric", "measured", "predicted", "error", "tolerance", "ok"):
        t.add_column(col, justify="right" if col in ("measured", "predicted", "error", "tolerance") else "left")
    for r in rows:
        err = "-" if r["error"] is None else f"{100 * r['error']:+.1f}%"
        ok = "[green]yes[/]" if r["within"] else "[red]no[/]"
        t.add_row(r["id"], r["role"], r["metric"], _fmt(r["measured"]), _fmt(r["predicted"]), err,
                  f"±{100 * r['tolerance']:.0f}%", ok)
    console.print(t)
    misses = [r for r in rows if r["role"] == "validation" and not r["within"]]
    console.print(f"{sum(r['within'] for r in rows)} of {len(rows)} cases within tolerance "
                  f"({sum(r['role'] == 'calibration' for r in rows)} are calibration checks)")
    if csv is not None:
        pd.DataFrame(rows).to_csv(csv, index=False)
    if strict and misses:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    """Add ``validate`` to the CLI."""
    app.command()(validate)
