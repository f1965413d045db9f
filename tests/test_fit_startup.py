"""``offsim fit``'s start-up peak (issue 17 item 5: "including the start-up peaks when the model is
loaded and pinned") and the engine's overflow where the planner said it fits.

Hand-checkable figures from DeepSpeed's code (``deepspeed/runtime/``):

* without ``zero.Init`` every rank materialises the model in fp32 before ``deepspeed.initialize``
  (``estimate_zero2_model_states_mem_needs``: ``4 * num_gpus_per_node`` bytes per parameter on
  the CPU), so a node holds ``4 P`` bytes per rank at once;
* ZeRO-1/2 with the optimizer on the CPU pins its fp32 master partition by copy
  (``stage_1_and_2.py`` ``DeepSpeedZeroOptimizer.__init__``): the pageable source, ``4 P / dp``
  bytes, is resident beside the pinned copy.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from offsim import load_profile, load_workload, make_run_config
from offsim.api import resolve
from offsim.cli import app
from offsim.fit_check import footprint
from offsim.plan.footprint import round_pinned, state_sizes
from offsim.plan.startup import BUILDING, LOADING, startup_peak

runner = CliRunner()
GIB = 2**30
SOURCE = "fp32 master partition: pageable source of pin_memory()"
LOADED = "whole model in fp32 on every rank (no zero.Init)"


def _peak(hw: Any, wl: Any, st: Any) -> tuple[Any, Any, Any]:
    cfg = resolve(make_run_config(hw, wl, st))
    sz = state_sizes(cfg)
    fp = footprint(cfg, sz)
    return cfg, fp, startup_peak(cfg, sz, fp)


def _data_parallel(name: str, dp: int) -> Any:
    wl = load_workload(name)
    return wl.model_copy(update={"training": wl.training.model_copy(update={"data_parallel": dp})})


def test_zero_offload_pins_its_master_copy_by_copy() -> None:
    """One rank, ZeRO-2 with the optimizer on the CPU: at start-up the fp32 master (pinned) and
    its pageable source (4 B per parameter) are resident, the Adam moments not yet."""
    cfg, fp, peak = _peak("rtx4090-pcie4-ws", "llama2-7b", "zero-offload")
    p = cfg.workload.model.total_params
    assert peak.phase == BUILDING
    assert peak.items["host"][SOURCE] == 4 * p
    assert peak.items["host_pinned"]["fp32 master params (built from the 16-bit params)"] == round_pinned(
        4 * p, cfg.strategy.host_allocator)
    assert peak.need_bytes["host"] == pytest.approx(sum(peak.items["host"].values()))
    assert peak.need_bytes["host"] - peak.need_bytes["host_pinned"] == pytest.approx(4 * p)
    assert not any(what.startswith("optimizer state") for what in peak.items["host"])
    # the moments come with the first step, pageable (ops/adam/cpu_adam.py step: torch.zeros_like):
    # training holds the pinned memory of start-up (fp32 master and gradient partitions) and 8 P
    # bytes more of pageable moments
    assert fp.need_bytes["host_pinned"] == peak.need_bytes["host_pinned"]
    assert fp.breakdown["host"]["optimizer state: Adam moments (pageable)"] == pytest.approx(8 * p)


def test_no_pageable_source_without_pinning() -> None:
    cfg = make_run_config("rtx4090-pcie4-ws", "llama2-7b", "zero-offload")
    unpinned = cfg.strategy.model_copy(update={"pin_memory": False})
    _, _, peak = _peak(cfg.hardware, cfg.workload, unpinned)
    assert SOURCE not in peak.items["host"] and peak.need_bytes["host_pinned"] == 0


def test_sixteen_ranks_load_the_model_sixteen_times() -> None:
    """ZeRO-Offload on a 16-GPU node: the model in fp32 on every rank (4 P x 16) is the start-up
    peak, above the whole steady footprint of the node."""
    cfg, fp, peak = _peak("dgx2-v100", _data_parallel("llama2-13b", 16), "zero-offload")
    p = cfg.workload.model.total_params
    assert peak.phase == LOADING
    assert peak.need_bytes["host"] == 16 * 4 * p
    assert peak.items["host"] == {LOADED: 4 * p}
    assert peak.need_bytes["host"] > fp.need_bytes["host"]


def test_zero3_builds_partitioned_so_nothing_is_loaded_whole() -> None:
    _, _, peak = _peak("dgx2-v100", _data_parallel("llama2-13b", 16), "zero-infinity-cpu")
    assert peak.phase == BUILDING and LOADED not in peak.items["host"]


def _write(tmp_path: Path, name: str, data: dict[str, Any]) -> str:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return str(path)


def test_fit_says_no_when_only_the_start_up_is_over(tmp_path: Path) -> None:
    """A node whose DRAM holds training but not 16 fp32 copies of the model: fit's verdict is
    does-not-fit, at start-up, with the loaded model as the largest item."""
    cfg, fp, peak = _peak("dgx2-v100", _data_parallel("llama2-13b", 16), "zero-offload")
    hw = load_profile("dgx2-v100").model_dump(mode="json")
    frac = hw["dram"]["usable_fraction"]
    hw["dram"]["capacity_gib"] = (fp.need_bytes["host"] + peak.need_bytes["host"]) / 2 / frac / GIB
    hw["dram"]["max_pinned_gib"] = None
    wl = cfg.workload.model_dump(mode="json")
    result = runner.invoke(app, ["fit", "-H", _write(tmp_path, "hw", hw), "-w", _write(tmp_path, "wl", wl),
                                 "-s", "zero-offload", "--json"])
    assert result.exit_code == 1, result.output
    (row,) = json.loads(result.stdout)["strategies"]
    assert all(rep["fits"] for rep in row["tiers"].values())  # training fits
    reason = row["reason"]
    assert row["status"] == "does-not-fit" and reason["when"] == LOADING and reason["tier"] == "host"
    assert reason["need_bytes"] == pytest.approx(peak.need_bytes["host"])
    assert reason["need_bytes"] > reason["capacity_bytes"] > fp.need_bytes["host"]
    assert row["startup"]["tiers"]["host"]["largest"][0]["what"] == LOADED
    assert "at start-up" in reason["text"] and row["iteration_time_s"] is None


def test_fit_reports_the_start_up_peak_of_each_fitting_row() -> None:
    result = runner.invoke(app, ["fit", "-H", "rtx4090-pcie4-ws", "-w", "llama2-7b", "-s", "zero-offload", "--json"])
    (row,) = json.loads(result.stdout)["strategies"]
    _, _, peak = _peak("rtx4090-pcie4-ws", "llama2-7b", "zero-offload")
    start = row["startup"]
    assert start["phase"] == BUILDING
    for tier in ("host_pinned", "host"):
        assert start["tiers"][tier]["peak_bytes"] == pytest.approx(peak.need_bytes[tier])
        assert start["tiers"][tier]["fits"]
    assert start["tiers"]["host"]["largest"][0]["bytes"] >= start["tiers"]["host"]["largest"][-1]["bytes"]


def test_table_has_the_start_up_columns() -> None:
    result = runner.invoke(app, ["fit", "-H", "tiny", "-w", "tiny", "-s", "zero-offload"], terminal_width=250)
    assert result.exit_code == 0, result.output
    assert "start-up pinned" in result.output and "start-up host" in result.output


def test_an_overflow_only_the_engine_finds_reports_its_level(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the planner says it fits and the engine overflows, the row carries the engine's
    level, the tier and the capacity (not a null need). The planner is made blind here (its
    first_overflow always None) so that the engine meets the overflow of gpu-only on a 24 GB GPU."""
    from offsim.plan.footprint import Footprint

    monkeypatch.setattr(Footprint, "first_overflow", lambda self: None)
    result = runner.invoke(app, ["fit", "-H", "rtx4090-pcie4-ws", "-w", "llama2-7b", "-s", "gpu-only", "--json"])
    assert result.exit_code == 1, result.output
    (row,) = json.loads(result.stdout)["strategies"]
    reason = row["reason"]
    gpu = make_run_config("rtx4090-pcie4-ws", "llama2-7b", "gpu-only").hardware.gpu.memory_bytes
    assert reason["when"] == "simulation" and reason["tier"] == "gpu"
    assert reason["capacity_bytes"] == gpu
    assert reason["need_bytes"] is not None and reason["need_bytes"] > gpu
