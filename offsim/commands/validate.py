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
    real: Annotated[bool, typer.Option("--real", help="run the real offloaded trainer and compare")] = False,
    hardware: Annotated[str, typer.Option("--hardware", "-H", help="(--real) the calibrated profile")] = "tiny",
    workload: Annotated[str, typer.Option("--workload", "-w", help="(--real) block shape to train")] = "tiny",
    layers: Annotated[int, typer.Option(help="(--real) blocks in the real model")] = 4,
    device: Annotated[str, typer.Option(help="(--real) torch device: cuda, or cpu to check the mechanics")] = "cuda",
    iterations: Annotated[int, typer.Option(help="(--real) timed iterations")] = 5,
    out: Annotated[Path | None, typer.Option(help="(--real) write the report JSON here")] = None,
) -> None:
    """Simulate each published case and print predicted vs measured with the error; with --real,
    train for real (PyTorch) and compare per phase with the simulation of the same setup."""
    import pandas as pd

    if real:
        _validate_real(hardware, workload, layers, device, iterations, out)
        return

    from offsim.commands._common import fail
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


def _validate_real(hardware: str, workload: str, layers: int, device: str, iterations: int,
                   out: Path | None) -> None:
    import json

    from offsim.calibrate.real_trainer import RealShape, run_real_training
    from offsim.commands._common import fail
    from offsim.config.loading import load_profile, load_workload
    from offsim.errors import OffsimError
    from offsim.real_validation import TARGET_ERROR, compare, simulate_twin

    try:
        import torch  # noqa: F401 - optional dependency, needed only here
    except ImportError:
        fail("--real needs PyTorch (pip install 'offsim[calibrate]')")
        return
    try:
        profile, wl = load_profile(hardware), load_workload(workload)
        predicted = simulate_twin(profile, wl, layers)
    except OffsimError as exc:
        fail(str(exc))
        return
    if not predicted.feasible:
        fail(f"the simulated twin does not fit: {predicted.metrics.infeasible_reason}")
    import torch

    if device.startswith("cuda") and not torch.cuda.is_available():
        fail("no CUDA device: run on a GPU machine, or pass --device cpu to check the mechanics only")
    measured = run_real_training(RealShape.from_workload(wl, layers=layers), device=device, iterations=iterations)
    rows = compare(measured, predicted)
    t = Table(title=f"real vs simulated: {layers} blocks of {wl.name} on {device}, profile {profile.name}")
    for col in ("phase", "measured s", "predicted s", "error"):
        t.add_column(col)
    for r in rows:
        err = "-" if r["error"] is None else f"{100 * r['error']:+.1f}%"
        t.add_row(r["what"], f"{r['measured_s']:.4g}", f"{r['predicted_s']:.4g}", err)
    console.print(t)
    it = rows[-1]["error"]
    verdict = "within" if it is not None and abs(it) <= TARGET_ERROR else "outside"
    console.print(f"iteration time {verdict} the {TARGET_ERROR:.0%} target")
    if out is not None:
        out.write_text(json.dumps({"hardware": profile.name, "workload": wl.name, "layers": layers,
                                   "device": device, "rows": rows, "measured": measured}, indent=2, default=str))


def register(app: typer.Typer) -> None:
    """Add ``validate`` to the CLI."""
    app.command()(validate)
