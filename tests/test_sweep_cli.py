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
    out, figs = tmp_path / "res", tmp_path / "figs"
    args = ["sweep", str(ROOT / "sweeps" / "tiny-grid.yaml"), "--out", str(out), "--workers", "1", "--quiet",
            "--figures", str(figs)]
    first = runner.invoke(app, [*args, "--max-points", "6"])
    assert first.exit_code == 0, first.output
    assert "run the same command again to continue" in first.output
    assert not figs.exists()  # figures once every point is stored
    second = runner.invoke(app, args)
    assert second.exit_code == 0, second.output
    assert "10 points evaluated" in second.output and "6 reused" in second.output
    df = pd.read_csv(out / "results.csv")
    assert len(df) == 16
    assert (out / "results.parquet").exists() and (out / "results.sqlite").exists()
    assert (figs / "pareto.html").exists() and not (out / "figures").exists()


def test_sweep_without_out_prints_and_writes_nothing(tmp_path, monkeypatch):
    """Without ``-o`` the points live in a scratch store removed at the end; the summary and the
    fastest points are printed, and ``--json`` carries every point."""
    monkeypatch.chdir(tmp_path)
    args = ["sweep", str(ROOT / "sweeps" / "tiny-grid.yaml"), "--workers", "1"]
    text = runner.invoke(app, args)
    assert text.exit_code == 0, text.output
    assert "16 of 16" in text.stdout and "fastest 10 of 12 points that fit" in text.stdout
    assert "-o DIR keeps every point" in text.stderr
    doc = json.loads(runner.invoke(app, [*args, "--json"]).stdout)
    assert doc["out"] is None and doc["files"] == [] and len(doc["points"]) == 16
    kept = pd.read_csv(_write_reference(tmp_path))
    assert [p["iteration_time_s"] for p in doc["points"]] == [
        None if v != v else v for v in kept["iteration_time_s"]]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ref"]  # only the -o of the reference run


def _write_reference(tmp_path):
    ref = tmp_path / "ref"
    result = runner.invoke(app, ["sweep", str(ROOT / "sweeps" / "tiny-grid.yaml"), "-o", str(ref),
                                 "--workers", "1", "-q"])
    assert result.exit_code == 0, result.output
    return ref / "results.csv"


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
