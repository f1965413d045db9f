"""A DeepSpeed ds_config works wherever a strategy is accepted (issue 17, item 1): ``compare``,
``rok``, ``tune``, ``report``, ``fit`` and ``sweep`` read it with the workload as ``offsim run``
does, so its ``"auto"`` values resolve from the model and its batch keys set the batch.

Each test checks the command's figure against ``offsim.simulate`` of the same file read by
:func:`offsim.make_run_config`: a command that dropped the file's batch keys (gradient accumulation
8 in ``ds_zero3_cpu_offload.json``) or failed on its ``"auto"`` values would differ or exit 2.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from offsim import make_run_config, simulate
from offsim.cli import app

ROOT = Path(__file__).resolve().parent.parent
USER = ROOT / "tests" / "data" / "user_configs"
#: The Hugging Face guide's ZeRO-3 CPU-offload config: "auto" buckets (from the hidden size) and batch.
HF_AUTO = str(USER / "hf_zero3_cpu_offload.json")
#: DeepSpeed's ZeRO-3 CPU-offload example: explicit batch (micro 1, accumulation 8), fp16.
DS_BATCH = str(USER / "ds_zero3_cpu_offload.json")
HW, WL = "tiny", "tiny"
RUN = ["--iterations", "2", "--warmup", "1"]

runner = CliRunner()


def _json(*args: str) -> dict:
    result = runner.invoke(app, [*args, "--json"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def _time(strategy: str) -> float:
    """The iteration time ``offsim run`` gives for ``strategy`` on tiny/tiny, 2 iterations."""
    return simulate(make_run_config(HW, WL, strategy, iterations=2, warmup_iterations=1)).metrics.iteration_time_s


@pytest.fixture(scope="module")
def times() -> dict[str, float]:
    return {path: _time(path) for path in (HF_AUTO, DS_BATCH)}


def test_the_batch_keys_matter(times: dict[str, float]) -> None:
    """The yardstick: the file's accumulation of 8 makes its iteration slower than the workload's own
    batch would; so a command that ignored the batch keys would not match it."""
    assert make_run_config(HW, WL, DS_BATCH).workload.training.grad_accumulation == 8
    assert times[DS_BATCH] > 2 * times[HF_AUTO]


def test_compare_with_a_ds_config_as_base_and_as_a_strategy(times: dict[str, float]) -> None:
    doc = _json("compare", "-H", HW, "-w", WL, "-s", DS_BATCH, "--policies", "lru",
                "--strategies", f"{HF_AUTO},zero-offload", *RUN)
    rows = {r["variant"]: r for r in doc["rows"]}
    assert rows[HF_AUTO]["iteration_time_s"] == pytest.approx(times[HF_AUTO], rel=1e-9)
    assert all(r["feasible"] for r in doc["rows"])


def test_compare_base_file_sets_the_batch_of_its_policy_variants() -> None:
    """Policy variants of a ds_config base run with the file's batch: LRU over the base's own
    buffer is the base itself, so its time is the file's time under ``offsim run``."""
    from offsim.compare import apply_policies

    cfg = make_run_config(HW, WL, DS_BATCH, iterations=2, warmup_iterations=1)
    expected = simulate(make_run_config(cfg.hardware, cfg.workload, apply_policies(cfg.strategy, "lru"),
                                        iterations=2, warmup_iterations=1))
    doc = _json("compare", "-H", HW, "-w", WL, "-s", DS_BATCH, "--policies", "lru", "--param-buffer-gib", "none",
                *RUN)
    (row,) = doc["rows"]
    assert row["iteration_time_s"] == pytest.approx(expected.metrics.iteration_time_s, rel=1e-9)


def test_compare_strategy_file_with_auto_needs_no_extra_option(times: dict[str, float]) -> None:
    doc = _json("compare", "-H", HW, "-w", WL, "--strategies", HF_AUTO, *RUN)
    (row,) = doc["rows"]
    assert row["iteration_time_s"] == pytest.approx(times[HF_AUTO], rel=1e-9)


def test_compare_prints_the_files_notes() -> None:
    result = runner.invoke(app, ["compare", "-H", HW, "-w", WL, "--strategies", DS_BATCH, *RUN],
                           catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "sets workload tiny's training.grad_accumulation = 8" in result.stderr


def test_rok_with_a_ds_config() -> None:
    doc = _json("rok", "-H", HW, "-w", WL, "-s", HF_AUTO, "--points", "2", *RUN)
    assert doc["rows"] and all(r["feasible"] for r in doc["rows"])


def test_tune_with_a_ds_config_as_base(times: dict[str, float]) -> None:
    doc = _json("tune", "-H", HW, "-w", WL, "-s", DS_BATCH, "--grid", "small", *RUN)
    assert doc["base_iteration_time_s"] == pytest.approx(times[DS_BATCH], rel=1e-9)


def test_report_with_a_ds_config(tmp_path: Path, times: dict[str, float]) -> None:
    doc = _json("report", "-H", HW, "-w", WL, "-s", DS_BATCH, "-s", HF_AUTO, "-o", str(tmp_path / "r.html"), *RUN)
    got = [r["iteration_time_s"] for r in doc["runs"]]
    assert got == pytest.approx([times[DS_BATCH], times[HF_AUTO]], rel=1e-9)


def test_fit_with_a_ds_config(times: dict[str, float]) -> None:
    doc = _json("fit", "-H", HW, "-w", WL, "-s", DS_BATCH, *RUN)
    (row,) = doc["strategies"]
    assert row["fits"] and row["iteration_time_s"] == pytest.approx(times[DS_BATCH], rel=1e-9)


# ----------------------------------------------------------------------------- sweep
def _sweep(tmp_path: Path, spec: dict, *extra: str):
    import yaml

    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    return runner.invoke(app, ["sweep", str(path), "--out", str(tmp_path / "out"), "--workers", "1", "--quiet",
                               *extra])


def test_sweep_strategy_axis_and_base_with_ds_configs(tmp_path: Path, times: dict[str, float]) -> None:
    """The base strategy a ds_config (accumulation 8) and the strategy axis over files and a
    shipped name: each point is ``offsim run`` of its own strategy; a point that swaps the base
    file for another gets the workload's own batch back."""
    import pandas as pd

    spec = {"name": "files", "base": {"hardware": HW, "workload": WL, "strategy": DS_BATCH, "iterations": 2,
                                      "warmup_iterations": 1},
            "grid": {"strategy": [DS_BATCH, HF_AUTO, "zero-offload"]}}
    result = _sweep(tmp_path, spec)
    assert result.exit_code == 0, result.output
    rows = pd.read_csv(tmp_path / "out" / "results.csv").set_index("strategy")["iteration_time_s"]
    assert rows[DS_BATCH] == pytest.approx(times[DS_BATCH], rel=1e-9)
    assert rows[HF_AUTO] == pytest.approx(times[HF_AUTO], rel=1e-9)
    assert rows["zero-offload"] == pytest.approx(_time("zero-offload"), rel=1e-9)


def test_sweep_field_axis_over_a_ds_config_base(tmp_path: Path, times: dict[str, float]) -> None:
    import pandas as pd

    spec = {"name": "base-file", "base": {"hardware": HW, "workload": WL, "strategy": DS_BATCH, "iterations": 2,
                                          "warmup_iterations": 1},
            "grid": {"strategy.pin_memory": [True]}}
    result = _sweep(tmp_path, spec)
    assert result.exit_code == 0, result.output
    (time,) = pd.read_csv(tmp_path / "out" / "results.csv")["iteration_time_s"]
    assert time == pytest.approx(times[DS_BATCH], rel=1e-9)


def test_sweep_refuses_a_workload_axis_that_reads_the_file_differently(tmp_path: Path) -> None:
    spec = {"name": "auto", "base": {"hardware": HW, "workload": WL, "strategy": HF_AUTO},
            "grid": {"workload": [WL, "llama2-7b"]}}
    result = _sweep(tmp_path, spec)
    assert result.exit_code == 2
    assert "read differently with workload 'llama2-7b'" in result.output
