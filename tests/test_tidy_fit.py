"""``offsim fit`` shows DeepSpeed's estimator only for strategies on DeepSpeed's own system
(:data:`offsim.commands.fit.DEEPSPEED_SYSTEMS`): FSDP2, Megatron-Core and Gemini resemble
estimator lines by their placement, but DeepSpeed's estimator does not speak for their memory."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from typer.testing import CliRunner

from offsim import make_run_config
from offsim.cli import app
from offsim.commands.fit import DEEPSPEED_SYSTEMS
from offsim.config.strategy import known_systems
from offsim.plan.ds_estimator import estimator_table, matching_row

runner = CliRunner()
DATA = Path(__file__).parent / "data" / "user_configs"


def _fit_json(strategies: str) -> dict[str, Any]:
    result = runner.invoke(app, ["fit", "-H", "tiny", "-w", "tiny", "-s", strategies, "--json", "-q"])
    assert result.exit_code == 0, result.output
    doc: dict[str, Any] = json.loads(result.stdout)
    return doc


def test_deepspeed_systems_are_known_systems() -> None:
    assert set(known_systems()) >= DEEPSPEED_SYSTEMS
    assert not {"fsdp2-cpu-offload", "megatron-offload", "gemini"} & DEEPSPEED_SYSTEMS


def test_only_deepspeed_strategies_carry_an_estimator_line() -> None:
    """FSDP2 (ZeRO-3, everything on the CPU) and Gemini (optimizer on the CPU) match a ZeRO-3 line
    by placement, so the filter is what keeps them off it; Megatron (ZeRO-1) matches none."""
    table = estimator_table(1e9, 1e8, 1, 1)
    assert matching_row(make_run_config("tiny", "tiny", "fsdp2-cpu-offload"), table) is not None
    assert matching_row(make_run_config("tiny", "tiny", "gemini"), table) is not None
    rows = {r["strategy"]: r for r in _fit_json("fsdp2-cpu-offload,megatron-offload,gemini,zero-offload")["strategies"]}
    assert all(r["status"] == "fits" for r in rows.values())
    assert rows["fsdp2-cpu-offload"]["deepspeed"] is None
    assert rows["megatron-offload"]["deepspeed"] is None
    assert rows["gemini"]["deepspeed"] is None
    assert rows["zero-offload"]["deepspeed"]["options"] == "ZeRO-2 offload_optimizer=cpu"


def test_no_estimator_table_without_a_deepspeed_strategy() -> None:
    assert _fit_json("fsdp2-cpu-offload,gemini")["deepspeed_estimator"] is None
    human = runner.invoke(app, ["fit", "-H", "tiny", "-w", "tiny", "-s", "fsdp2-cpu-offload,gemini"],
                          terminal_width=200)
    assert human.exit_code == 0, human.output
    assert "DeepSpeed's estimator" not in human.output
    with_ds = runner.invoke(app, ["fit", "-H", "tiny", "-w", "tiny", "-s", "gemini,zero-infinity-cpu"],
                            terminal_width=200)
    assert "DeepSpeed's estimator" in with_ds.output
    lines = [ln for ln in with_ds.output.splitlines() if "GPU offsim" in ln]
    assert len(lines) == 1 and lines[0].startswith("zero-infinity-cpu")


def test_a_file_naming_no_system_is_deepspeeds_only_when_it_is_a_ds_config(tmp_path: Path) -> None:
    """A ZeRO-3 ds_config without offload and an Accelerate FSDP config without offload both map
    to ``custom`` at stage 3 with everything on the GPU, matching the estimator's ZeRO-3 line
    without offload; only the ds_config is DeepSpeed's."""
    ds = tmp_path / "ds_zero3.json"
    ds.write_text(json.dumps({"train_micro_batch_size_per_gpu": "auto", "bf16": {"enabled": "auto"},
                              "zero_optimization": {"stage": 3}}))
    fsdp = yaml.safe_load((DATA / "accelerate_fsdp2_offload.yaml").read_text())
    fsdp["fsdp_config"]["fsdp_offload_params"] = False
    acc = tmp_path / "accelerate_fsdp.yaml"
    acc.write_text(yaml.safe_dump(fsdp))
    assert make_run_config("tiny", "tiny", str(ds)).strategy.system == "custom"
    assert make_run_config("tiny", "tiny", str(acc)).strategy.system == "custom"
    assert matching_row(make_run_config("tiny", "tiny", str(acc)), estimator_table(1e9, 1e8, 1, 1)) is not None
    rows = {r["strategy"]: r for r in _fit_json(f"{ds},{acc}")["strategies"]}
    assert rows[str(ds)]["deepspeed"]["options"].startswith("ZeRO-3 offload_param=none, offload_optimizer=none")
    assert rows[str(acc)]["deepspeed"] is None
