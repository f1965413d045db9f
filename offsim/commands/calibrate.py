"""``offsim calibrate``: measure this machine and write a hardware profile plus raw data."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from offsim.commands import _options as opt
from offsim.commands._common import ExitCode, check_out_dir, fail, note, print_json, say


def calibrate(
    out: Annotated[Path, opt.out("output folder for the profile YAML, raw CSVs and fits.json")],
    name: Annotated[str, typer.Option(help="profile name (file stem)")] = "measured",
    base: Annotated[str | None, typer.Option(
        "--base", "--hardware", "-H", help="profile supplying what is not measured (name or path)")] = None,
    nvme_dir: Annotated[Path | None, typer.Option(
        help="a folder on the drive to measure (skipped if absent)")] = None,
    parts: Annotated[str, typer.Option(help="comma-separated subset of gpu,cpu,nvme")] = "gpu,cpu,nvme",
    quick: Annotated[bool, typer.Option(
        help="a few sizes and short runs (minutes, not tens of minutes)")] = False,
    as_json: opt.Json = False,
    quiet: opt.Quiet = False,
) -> None:
    """Run the microbenchmarks (GPU via PyTorch CUDA when present; CPU optimizer and memcpy;
    NVMe with O_DIRECT or fio), fit latency/bandwidth and efficiency curves, write the profile;
    exit 1 when a part could not be measured."""
    from offsim.calibrate import run_calibration
    from offsim.config.loading import load_profile
    from offsim.errors import OffsimError

    check_out_dir(out)
    try:
        base_profile = load_profile(base) if base else None
        report = run_calibration(out, base_profile=base_profile, name=name, nvme_dir=nvme_dir, quick=quick,
                                 parts={p.strip() for p in parts.split(",") if p.strip()},
                                 progress=None if quiet or as_json else lambda line: say(line, stderr=True))
    except OffsimError as exc:
        fail(str(exc))
    if as_json:
        print_json({"out": str(out), "complete": report.complete, "notes": list(report.messages),
                    "summary": list(report.summary_lines())})
    else:
        for line in report.messages:
            note(line)
        for line in report.summary_lines():
            say(line)
    if not report.complete:
        raise typer.Exit(ExitCode.NO)


def register(app: typer.Typer) -> None:
    """Add ``calibrate`` to the CLI."""
    app.command()(calibrate)
