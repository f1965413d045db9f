"""Reverse sizing: the monotone search finds what the full grid would, with fewer simulations."""

from __future__ import annotations

import pytest

from offsim.errors import ConfigError
from offsim.sweep.evaluate import Goal
from offsim.sweep.execute import run_sweep
from offsim.sweep.sizing import size
from offsim.sweep.spec import make_plan

PRICES = {
    "hardware.gpu.price_usd": 1000,
    "hardware.cpu.price_usd": 500,
    "hardware.dram.price_usd_per_gib": 4.0,
    "hardware.nvme.price_usd": 100,
}
DIMS = {"nvme_drives": [1, 2, 3, 4], "pcie_gen": [3, 4, 5], "dram_gib": [2, 4, 64]}


@pytest.fixture(scope="module")
def grid(tmp_path_factory):
    """Every point of the grid, simulated (the brute-force answer to compare with)."""
    plan = make_plan("tiny", "tiny", "zero-infinity-nvme", grid=DIMS, fixed=PRICES)
    return run_sweep(plan, tmp_path_factory.mktemp("grid"), workers=1, prefilter=False).frame


def _brute_force(frame, target_s, objective):
    ok = frame[(frame["status"] == "ok") & (frame["iteration_time_s"] <= target_s)].copy()
    ranks = sum(ok[k].map({v: i for i, v in enumerate(vals)}) for k, vals in DIMS.items())
    ok["size"] = ranks
    ok["objective"] = ok["capex_usd"] if objective == "cost" else ranks
    return ok.sort_values(["objective", "size"]).iloc[0]


@pytest.mark.parametrize("objective", ["cost", "size"])
@pytest.mark.parametrize("quantile", [0.2, 0.6])
def test_search_matches_the_full_grid(grid, objective, quantile):
    target = float(grid.loc[grid["status"] == "ok", "iteration_time_s"].quantile(quantile))
    result = size(
        "tiny",
        "tiny",
        "zero-infinity-nvme",
        list(DIMS),
        Goal(max_iteration_s=target),
        values=DIMS,
        fixed=PRICES,
        objective=objective,
    )
    best = _brute_force(grid, target, objective)
    assert result.objective == objective
    assert result.answer is not None
    assert result.answer.row["iteration_time_s"] <= target
    assert result.answer.objective == pytest.approx(best["objective"])
    assert result.answer.size == best["size"]
    assert len(result.evaluated) < result.grid_points == 36
    for key, down in result.steps_down.items():  # one step down in any dimension misses the target
        if down is not None and key != "pcie_gen":
            assert not result.goal.met(down.row)


def test_runner_up_is_a_different_trade_off(grid):
    target = float(grid.loc[grid["status"] == "ok", "iteration_time_s"].quantile(0.6))
    result = size(
        "tiny",
        "tiny",
        "zero-infinity-nvme",
        list(DIMS),
        Goal(max_iteration_s=target),
        values=DIMS,
        fixed=PRICES,
        objective="size",
    )
    if result.runner_up is not None:
        a, r = result.answer.overrides, result.runner_up.overrides
        assert any(DIMS[k].index(r[k]) < DIMS[k].index(a[k]) for k in DIMS)
        assert result.goal.met(result.runner_up.row)


def test_an_unreachable_target_evaluates_only_the_largest_machine():
    result = size("tiny", "tiny", "zero-infinity-nvme", ["nvme_drives"], Goal(max_iteration_s=1e-3))
    assert result.answer is None
    assert len(result.evaluated) == 1
    assert result.largest.overrides == {"nvme_drives": 8}
    assert result.largest.row["status"] == "too_slow"  # settled by the bound, not simulated


def test_tokens_per_s_target_and_objective_errors(grid):
    tps = float(grid.loc[grid["status"] == "ok", "tokens_per_s"].median())
    result = size(
        "tiny",
        "tiny",
        "zero-infinity-nvme",
        ["nvme_drives", "pcie_gen"],
        Goal(min_tokens_per_s=tps),
        values={"nvme_drives": [1, 2, 3, 4]},
    )
    assert result.objective == "size"  # tiny has no prices
    assert result.answer.row["tokens_per_s"] >= tps
    with pytest.raises(ConfigError, match="needs prices"):
        size(
            "tiny",
            "tiny",
            "zero-infinity-nvme",
            ["nvme_drives"],
            Goal(max_iteration_s=10.0),
            objective="cost",
        )
    with pytest.raises(ConfigError, match="no default values"):
        size("tiny", "tiny", "zero-infinity-nvme", ["strategy.prefetch_depth"], Goal(max_iteration_s=10.0))
    with pytest.raises(ConfigError, match="give a target"):
        size("tiny", "tiny", "zero-infinity-nvme", ["nvme_drives"], Goal())
