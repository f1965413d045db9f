"""The CLI: every core command runs; errors are one line without a traceback."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from offsim.cli import app

runner = CliRunner()
JSON_KEYS = {"feasible", "infeasible_reason", "iteration_time_s", "tokens_per_s", "tflops_per_gpu", "phases_s",
             "gpu_busy_fraction", "peak_bytes", "traffic_bytes"}


def test_help_of_every_command() -> None:
    assert runner.invoke(app, ["--help"]).exit_code == 0
    for cmd in app.registered_commands:
        name = cmd.name or cmd.callback.__name__
        result = runner.invoke(app, [name, "--help"])
        assert result.exit_code == 0, name


def test_run_json_has_the_documented_keys() -> None:
    result = runner.invoke(app, ["run", "-H", "tiny", "-w", "tiny", "-s", "zero-infinity-nvme", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert JSON_KEYS <= set(data)
    assert set(data["phases_s"]) == {"forward", "backward", "optimizer"}
    assert set(data["peak_bytes"]) == {"gpu", "host_pinned", "host", "nvme", "pfs"}
    assert {"h2d", "d2h", "nvme_read", "nvme_write"} <= set(data["traffic_bytes"])
    assert data["feasible"] is True and data["iteration_time_s"] > 0


def test_run_table_and_trace(tmp_path: Path) -> None:
    trace = tmp_path / "run.json"
    result = runner.invoke(app, ["run", "-H", "tiny", "-w", "tiny", "-s", "zero-offload", "--trace", str(trace)])
    assert result.exit_code == 0, result.output
    assert "iteration time" in result.output
    events = json.loads(trace.read_text())["traceEvents"]
    assert any(e["ph"] == "X" for e in events) and any(e["ph"] == "C" for e in events)


def test_run_accepts_paths(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parent.parent
    result = runner.invoke(app, ["run", "-H", str(root / "hardware_profiles/tiny.yaml"), "-w",
                                 str(root / "workloads/tiny.yaml"), "-s", str(root / "strategies/gpu-only.yaml"), "--json"])
    assert result.exit_code == 0, result.output


def test_bad_input_is_one_message(tmp_path: Path) -> None:
    result = runner.invoke(app, ["run", "-H", "nonexistent-box", "-w", "tiny", "-s", "gpu-only"])
    assert result.exit_code == 2
    assert "unknown hardware 'nonexistent-box'" in result.output
    assert "Traceback" not in result.output


def test_infeasible_run_says_why_and_exits_1(tmp_path: Path) -> None:
    big = tmp_path / "big.yaml"
    root = Path(__file__).resolve().parent.parent
    big.write_text((root / "workloads/tiny.yaml").read_text().replace("layers: 4", "layers: 400").replace(
        "name: tiny", "name: big"))
    result = runner.invoke(app, ["run", "-H", "tiny", "-w", str(big), "-s", "gpu-only", "--json"])
    assert result.exit_code == 1
    data = json.loads(result.stdout)
    assert data["feasible"] is False and data["infeasible_reason"].startswith("gpu memory: needs")


def test_listings() -> None:
    for cmd, expect in (("profiles", "tiny"), ("workloads", "llama2-7b"), ("strategies", "zero-infinity-nvme")):
        result = runner.invoke(app, [cmd])
        assert result.exit_code == 0 and expect in result.output, cmd


def test_schema() -> None:
    result = runner.invoke(app, ["schema", "hardware"])
    assert result.exit_code == 0 and "host_link" in json.loads(result.stdout)["properties"]


def test_run_table_shows_cache_stats_for_streamed_params() -> None:
    """A strategy that streams parameters shows the GPU parameter cache's hit rate and its bytes
    beside the lower bound any policy must move (never a heuristic labelled OPT) in the human table."""
    result = runner.invoke(app, ["run", "-H", "tiny", "-w", "tiny", "-s", "zero-infinity-cpu", "--quiet"])
    assert result.exit_code == 0, result.output
    assert "cache gpu_params" in result.output
    assert "lower" in result.output and "bound" in result.output  # the cell may wrap between them
    assert "OPT" not in result.output
    assert "hardware TFLOP/s" in result.output


def test_run_table_names_the_plan_a_heuristic_without_a_bound() -> None:
    """Without cache events (no bound can be computed) the run's offline plan is shown, named
    a heuristic."""
    from offsim import make_run_config, simulate
    from offsim.commands._common import console, print_metrics_table
    from offsim.results import RunResult
    from offsim.trace import Recorder

    r = simulate(make_run_config("tiny", "tiny", "zero-infinity-cpu"))
    bare = RunResult(r.config, r.metrics, Recorder())
    with console.capture() as captured:
        print_metrics_table(bare)
    text = captured.get()
    assert "belady" in text and "(heuristic)" in text
    assert "OPT" not in text and "lower bound" not in text
