"""``offsim sweep`` and ``offsim size`` through the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
from typer.testing import CliRunner

from offsim.cli import app

ROOT = Path(__file__).resolve().parent.parent
runner = CliRunner()


def test_sweep_writes_tables_and_figures_and_resumes(tmp_path):
    out = tmp_path / "res"
    args = ["sweep", str(ROOT / "sweeps" / "tiny-grid.yaml"), "--out", str(out), "--workers", "1", "--quiet"]
    first = runner.invoke(app, [*args, "--max-points", "6"])
    assert first.exit_code == 0, first.output
    assert "run the same command again to continue" in first.output
    assert not (out / "figures").exists()
    second = runner.invoke(app, args)
    assert second.exit_code == 0, second.output
    assert "10 points evaluated" in second.output and "6 reused" in second.output
    df = pd.read_csv(out / "results.csv")
    assert len(df) == 16
    assert (out / "results.parquet").exists() and (out / "results.sqlite").exists()
    assert (out / "figures" / "pareto.html").exists()


def test_sweep_refuses_a_bad_spec_naming_the_axis(tmp_path):
    spec = tmp_path / "bad.yaml"
    spec.write_text(
        "name: bad\nbase: {hardware: tiny, workload: tiny, strategy: zero-offload}\n"
        "grid: {hardware.dram.capacity: [1, 2]}\n"
    )
    result = runner.invoke(app, ["sweep", str(spec), "--out", str(tmp_path / "o"), "--workers", "1"])
    assert result.exit_code == 2
    assert "axis 'hardware.dram.capacity': unknown field 'capacity'" in result.output


def test_size_prints_the_answer_and_why():
    args = [
        "size",
        "-H",
        "tiny",
        "-w",
        "tiny",
        "-s",
        "zero-infinity-nvme",
        "--vary",
        "nvme_drives,pcie_gen",
        "--values",
        "nvme_drives=1,2,3,4",
        "--target-iteration-s",
        "3.0",
    ]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "answer" in result.output and "grid points evaluated" in result.output
    result = runner.invoke(app, [*args, "--json"])
    doc = json.loads(result.output)
    assert doc["answer"]["row"]["iteration_time_s"] <= 3.0
    assert set(doc["answer"]["overrides"]) == {"nvme_drives", "pcie_gen"}


def test_size_without_an_answer_exits_1_and_says_what_binds():
    result = runner.invoke(
        app,
        [
            "size",
            "-H",
            "tiny",
            "-w",
            "tiny",
            "-s",
            "zero-infinity-nvme",
            "--vary",
            "nvme_drives",
            "--target-iteration-s",
            "0.001",
        ],
    )
    assert result.exit_code == 1
    assert "no combination meets the target" in result.output


def test_size_rejects_bad_options():
    result = runner.invoke(
        app, ["size", "--vary", "dram_gib", "--target-iteration-s", "1", "--values", "dram_gib"]
    )
    assert result.exit_code == 2
    assert "--values expects KEY=VALUE" in result.output
