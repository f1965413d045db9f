"""``offsim fit`` shows DeepSpeed's estimator only for strategies on DeepSpeed's own system
(:data:`offsim.commands.fit.DEEPSPEED_SYSTEMS`): FSDP2, Megatron-Core and Gemini resemble
estimator lines by their placement, but DeepSpeed's estimator does not speak for their memory."""

from __future__ import annotations

import json
from typing import Any

from typer.testing import CliRunner

from offsim import make_run_config
from offsim.cli import app
from offsim.commands.fit import DEEPSPEED_SYSTEMS
from offsim.config.strategy import known_systems
from offsim.plan.ds_estimator import estimator_table, matching_row

runner = CliRunner()


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
