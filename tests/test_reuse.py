"""Runs an earlier run answers (offsim.engine.reuse): the same records, never a wrong one.

A sweep's points often compile to the same schedule, machine and policies (a DRAM size a strategy
does not use); inside ``reusing()`` such a point takes the earlier run's records instead of being
simulated (issue 16). These tests check the metrics are the simulated ones to the last bit, that a
machine the run does not fit is simulated (and fails as it would), and that inputs that differ or
cannot be compared are never matched.
"""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

import offsim.simulation as sim
from offsim import load_profile, make_run_config, simulate
from offsim.config.run import RunConfig
from offsim.engine import reuse
from offsim.errors import InfeasibleError
from offsim.plan.footprint import state_sizes
from offsim.sweep.evaluate import Payload, run_chunk
from offsim.sweep.spec import make_plan


def _with_dram(gib: float, strategy: str = "zero-offload", hardware: str = "tiny") -> RunConfig:
    hw = load_profile(hardware)
    hw = hw.model_copy(update={"dram": hw.dram.model_copy(update={"capacity_gib": gib})})
    return make_run_config(hw, "tiny", strategy)


def _metrics(cfg: RunConfig) -> str:
    result = simulate(cfg)
    return json.dumps(result.metrics.model_dump(mode="json"), sort_keys=True) + f" {result.events}"


@pytest.mark.parametrize("strategy", ["zero-offload", "zero-infinity-nvme", "gpu-only", "protrain"])
def test_a_point_that_differs_in_what_the_run_does_not_read_takes_the_earlier_run(strategy: str) -> None:
    """Two DRAM sizes (the host capacity is only checked against): one run, the same metrics."""
    small, big = _with_dram(64, strategy), _with_dram(96, strategy)
    want = [_metrics(small), _metrics(big)]
    with reuse.reusing() as memo:
        got = [_metrics(small), _metrics(big)]
    assert got == want
    assert (memo.hits, memo.misses) == (1, 1)


def test_a_reused_run_carries_each_mechanism_s_peaks() -> None:
    """The per-mechanism ledger (issue 14) of a reused run is the simulated run's."""
    small, big = _with_dram(64, "zero-infinity-nvme"), _with_dram(96, "zero-infinity-nvme")

    def peaks(cfg: RunConfig) -> dict[object, dict[str, int]]:
        sz = state_sizes(cfg)
        ex = sim.make_executor(cfg, sz)
        ex.run()
        return ex.memory.owner_peak_bytes

    want = peaks(big)
    assert want and any(p["gpu"] > 0 for p in want.values())
    with reuse.reusing() as memo:
        peaks(small)
        got = peaks(big)
    assert memo.hits == 1
    assert got == want


def test_a_machine_the_run_does_not_fit_is_simulated(monkeypatch: pytest.MonkeyPatch) -> None:
    """A kept run is handed out only where its peaks fit the host memory; below, the run is
    simulated and overflows as it would without reuse."""
    cfg = make_run_config("tiny", "tiny", "zero-infinity-cpu")
    sz = state_sizes(cfg)
    made = sim.machine

    def run(host_bytes: float) -> dict[str, float]:
        monkeypatch.setattr(sim, "machine", lambda c, s: dataclasses.replace(
            made(c, s), memory_bytes={**made(c, s).memory_bytes, "host": host_bytes}))
        return sim.run_schedule(cfg, sz)[1]

    with reuse.reusing() as memo:
        peak = run(math.inf)["host"]
        assert peak > 0
        assert run(peak)["host"] == peak
        assert (memo.hits, memo.misses) == (1, 1)
        with pytest.raises(InfeasibleError, match="host"):
            run(peak * 0.99)
    assert (memo.hits, memo.misses) == (1, 2)


def test_different_inputs_are_not_matched() -> None:
    with reuse.reusing() as memo:
        _metrics(make_run_config("tiny", "tiny", "zero-offload"))
        _metrics(make_run_config("tiny", "tiny", "zero-infinity-cpu"))
        _metrics(make_run_config("tiny", "tiny", "zero-offload", iterations=4))
    assert memo.hits == 0


def test_a_progress_callback_or_an_unknown_policy_is_never_reused() -> None:
    cfg = make_run_config("tiny", "tiny", "zero-offload")
    with reuse.reusing() as memo:
        simulate(cfg, on_iteration=lambda done, total: None)
        simulate(cfg, on_iteration=lambda done, total: None)
    assert memo.hits == memo.misses == 0
    with pytest.raises(reuse._OpaqueError):
        reuse._value(object())


def test_the_memo_keeps_within_its_budget() -> None:
    with reuse.reusing(reuse.RunMemo(budget=1)) as memo:
        for strategy in ("zero-offload", "zero-infinity-cpu", "zero-offload"):
            _metrics(make_run_config("tiny", "tiny", strategy))
    assert len(memo.runs) == 1 and memo.hits == 0


def test_a_sweep_gives_the_rows_it_gives_without_reuse() -> None:
    plan = make_plan("tiny", "tiny", "zero-offload", name="reuse",
                     grid={"strategy": ["zero-offload", "zero-infinity-nvme"], "dram_gib": [48, 64, 96],
                           "nvme_drives": [1, 2], "pcie_gen": [3, 4]})
    payload = Payload.from_plan(plan)
    items = [(p.index, p.point_id, p.overrides) for p in plan.points]
    plain = run_chunk(payload, items)
    with reuse.reusing() as memo:
        reused = run_chunk(payload, items)
    for a, b in zip(plain, reused, strict=True):
        a.pop("wall_s")
        b.pop("wall_s")
    assert json.dumps(reused, sort_keys=True, default=str) == json.dumps(plain, sort_keys=True, default=str)
    assert memo.hits > 0
