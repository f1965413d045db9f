"""Discrete ranges (``choices``), a case's own ``assumed`` block and what drives an uncovered
figure (issue 23 part 3, session 14)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from offsim.config.case_assumed import CaseAssumed
from offsim.config.loading import load_profile, load_strategy, load_workload
from offsim.errors import ConfigError
from offsim.validation import MetricKind, load_cases
from offsim.validation_intervals import (
    Assumption,
    Draws,
    FigureIntervals,
    Interval,
    applies,
    case_draws,
    case_ranges,
    draw_one,
    drawn_config,
    drivers,
    latin_hypercube,
    min_rho,
    position,
    spearman,
    with_declared,
)


def _models(hw: str = "tiny", wl: str = "tiny", st: str = "zero-infinity-nvme") -> dict:
    return {"hardware": load_profile(hw), "workload": load_workload(wl), "strategy": load_strategy(st)}


HOST_GRADS = Assumption(id="v", paths=["strategy.z3_host_grads"], choices=["flat_gpu_check", "flat_host_check"],
                        weights=[12, 23], source="releases per behaviour")


# ----------------------------------------------------------------------------- choices
def test_a_choice_is_drawn_by_its_cumulative_weight() -> None:
    """weights 12:23: the first choice below u = 12/35 = 0.3429, the second above."""
    assert draw_one(HOST_GRADS, 0.34) == "flat_gpu_check"
    assert draw_one(HOST_GRADS, 0.35) == "flat_host_check"
    uniform = Assumption(id="u", paths=["workload.training.micro_batch"], choices=[1, 2, 4], source="s")
    assert [draw_one(uniform, u) for u in (0.0, 0.33, 0.34, 0.66, 0.67, 0.999)] == [1, 1, 2, 2, 4, 4]


def test_sixteen_latin_hypercube_draws_follow_the_weights() -> None:
    """16 strata: strata 0-4 ([0, 0.3125)) all give the first choice, stratum 5 ([0.3125, 0.375))
    either, strata 6-15 the second: 5 or 6 of 16 (12/35 of 16 = 5.49)."""
    for seed in range(5):
        picks = [draw_one(HOST_GRADS, row[0]) for row in latin_hypercube(16, 1, random.Random(seed))]
        assert picks.count("flat_gpu_check") in (5, 6)


def test_choice_rules() -> None:
    with pytest.raises(ValueError, match="exactly one of scale and choices"):
        Assumption(id="x", paths=["strategy.z3_host_grads"], scale=(0.9, 1.1), choices=["legacy"], source="s")
    with pytest.raises(ValueError, match="one positive number per choice"):
        Assumption(id="x", paths=["strategy.z3_host_grads"], choices=["legacy", "flat_gpu_check"], weights=[1],
                   source="s")
    with pytest.raises(ValueError, match="must set exactly"):
        Assumption(id="x", paths=["strategy.z3_host_grads", "strategy.z3_grad_flush"],
                   choices=[{"strategy.z3_host_grads": "legacy"}], source="s")


def test_a_choice_sets_the_field_and_a_mapping_sets_several() -> None:
    models = _models()
    assert applies(HOST_GRADS, models)
    cfg = drawn_config(models, [(HOST_GRADS, "flat_gpu_check")])
    assert not isinstance(cfg, str) and cfg.strategy.z3_host_grads == "flat_gpu_check"
    release = Assumption(id="r", paths=["strategy.z3_host_grads", "strategy.z3_grad_flush"],
                         choices=[{"strategy.z3_host_grads": "legacy", "strategy.z3_grad_flush": "next_flush"}],
                         source="v0.3.15-v0.5.10")
    cfg = drawn_config(models, [(release, release.choices[0])])  # type: ignore[index]
    assert (cfg.strategy.z3_host_grads, cfg.strategy.z3_grad_flush) == ("legacy", "next_flush")  # type: ignore[union-attr]


def test_a_choice_the_schema_refuses_is_a_broken_rule_of_the_draw() -> None:
    bad = Assumption(id="b", paths=["strategy.z3_host_grads"], choices=["v0.4"], source="s")
    broken = drawn_config(_models(), [(bad, "v0.4")])
    assert not hasattr(broken, "strategy")
    assert broken.field == "strategy.z3_host_grads" and broken.assumption == "b"  # type: ignore[union-attr]


def test_a_choice_on_a_field_the_run_lacks_does_not_apply() -> None:
    a = Assumption(id="n", paths=["strategy.no_such_switch"], choices=["x"], source="s")
    assert not applies(a, _models())


def test_position_of_a_draw_in_its_range() -> None:
    assert position(HOST_GRADS, "flat_gpu_check") == 0.25 and position(HOST_GRADS, "flat_host_check") == 0.75
    scaled = Assumption(id="s", paths=["hardware.dram.bandwidth_gb_per_s"], scale=(0.5, 2.0), source="s")
    assert position(scaled, 1.0) == pytest.approx(0.5)  # log(2) / log(4)


# ----------------------------------------------------------------------------- a case's own ranges
CASE = """schema_version: 1
cases:
  - id: c0
    citation: hand-made
    url: https://c.org
    hardware: tiny
    workload: tiny
    strategy: zero-offload
    overrides: {{workload.training.micro_batch: 2}}
    metric: iteration_time_s
    measured: 1.0
    tolerance: 0.5
    assumed:
{}
"""


def _cases_file(tmp_path: Path, assumed: str) -> Path:
    p = tmp_path / "cases.yaml"
    p.write_text(CASE.format(assumed))
    return p


def test_a_case_range_becomes_factors_of_the_case_value(tmp_path: Path) -> None:
    """micro_batch 2 (the override) with range [1, 8]: factors 0.5 to 4."""
    path = _cases_file(tmp_path, "      workload.training.micro_batch: {range: [1, 8], why: not stated}\n"
                                 "      strategy.lp_copy: {choices: [separate_cast, fused_zero_copy], why: era}")
    (case,) = load_cases(path)
    models = dict(zip(("hardware", "workload", "strategy"),
                      (load_profile("tiny"), load_workload("tiny"), load_strategy("zero-offload")), strict=True))
    models["workload"] = models["workload"].model_copy(
        update={"training": models["workload"].training.model_copy(update={"micro_batch": 2})})
    mb, lp = case_ranges(case, models)
    assert (mb.id, mb.scale) == ("case:workload.training.micro_batch", (0.5, 4.0))
    assert (lp.choices, lp.weights, lp.source) == (["separate_cast", "fused_zero_copy"], None, "era")


def test_a_case_range_replaces_others_on_its_field_and_comes_last() -> None:
    shipped = [Assumption(id="dram", paths=["hardware.dram.bandwidth_gb_per_s"], scale=(0.9, 1.0), source="s"),
               Assumption(id="gemm", paths=["hardware.gpu.gemm_efficiency"], scale=(0.9, 1.0), source="s")]
    own = [Assumption(id="case:dram", paths=["hardware.dram.bandwidth_gb_per_s"], scale=(0.5, 1.0), source="c")]
    assert [a.id for a in with_declared(_models(), shipped, own)] == ["gemm", "case:dram"]
    assert [a.id for a in with_declared(_models(), shipped)] == ["dram", "gemm"]


@pytest.mark.parametrize(("entry", "message"), [
    ("micro_batch: {range: [1, 8], why: w}", r"cases\.0\.assumed.*must start with hardware"),
    ("workload.training.micro_batch: {range: [1, 8], choices: [1], why: w}", r"cases\.0\.assumed.*exactly one"),
    ("workload.training.micro_batch: {scale: [1, 8], weights: [1], why: w}", r"cases\.0\.assumed.*weights go"),
    ("workload.training.micro_batch: {choices: [1, 2], weights: [1], why: w}", r"cases\.0\.assumed.*per choice"),
    ("workload.training.micro_batch: {range: [1, 8]}", r"cases\.0\.assumed.*why"),
    ("workload.training.micro_batch: {range: [4, 8], why: w}",
     r"cases\.0 \(c0\)\.assumed\.workload\.training\.micro_batch: range \[4\.0, 8\.0\] does not hold "
     r"the case's value 2"),
    ("workload.training.no_such: {range: [1, 8], why: w}", r"cases\.0 \(c0\)\.assumed\..*no field"),
    ("strategy.lp_copy: {range: [1, 8], why: w}", r"cases\.0 \(c0\)\.assumed\.strategy\.lp_copy: .*not a number"),
    ("strategy.z3_host_grads: {choices: [legacy, v0.4], why: w}",
     r"cases\.0 \(c0\)\.assumed\.strategy\.z3_host_grads: choice 'v0\.4' is not allowed"),
])
def test_a_bad_case_entry_names_the_file_and_the_field(tmp_path: Path, entry: str, message: str) -> None:
    path = _cases_file(tmp_path, f"      {entry}")
    with pytest.raises(ConfigError, match=message) as err:
        load_cases(path)
    assert str(path) in str(err.value)


def test_case_assumed_alone() -> None:
    assert CaseAssumed(choices=[1, 2], why="w").paths("workload.training.micro_batch") == [
        "workload.training.micro_batch"]
    mapping = CaseAssumed(choices=[{"strategy.a": 1, "strategy.b": 2}], why="w")
    assert mapping.paths("release") == ["strategy.a", "strategy.b"]


def test_case_draws_take_the_case_choices(tmp_path: Path) -> None:
    """The tiny case at micro-batch 1 or 4 (uniform): the draws' iteration times fall in two
    groups, and the micro-batch choice is the figure's strongest driver."""
    path = _cases_file(tmp_path, "      workload.training.micro_batch: {choices: [1, 4], why: not stated}")
    (case,) = load_cases(path)
    draws = case_draws(case, [], samples=6)
    assert draws.assumptions == ("case:workload.training.micro_batch",)
    times = sorted(draws.values["iteration_time_s"])
    assert len(times) == 6 and times[0] == times[2] and times[3] == times[5] and times[2] < times[3]
    (d,) = drivers(draws, "iteration_time_s")
    assert d.id == "case:workload.training.micro_batch" and d.rho == pytest.approx(1.0)


# ----------------------------------------------------------------------------- drivers
def test_spearman_by_hand() -> None:
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    # ranks x 0 1 2 3, y 1 0 3 2: dx = -1.5 -0.5 0.5 1.5, dy = -0.5 -1.5 1.5 0.5,
    # sum dx dy = 0.75 + 0.75 + 0.75 + 0.75 = 3.0, sum dx^2 = sum dy^2 = 5: 3 / 5 = 0.6
    assert spearman([1, 2, 3, 4], [2, 1, 4, 3]) == pytest.approx(0.6)
    assert spearman([1, 2, 3], [5, 5, 5]) is None
    assert spearman([1, 2], [1, 2]) is None


def _draws() -> Draws:
    rows = tuple(({"a": a, "b": b}, {"m": v}) for a, b, v in
                 [(0.1, 0.9, 1.0), (0.3, 0.2, 2.0), (0.5, 0.6, 3.0), (0.7, 0.1, 4.0), (0.9, 0.5, 5.0)])
    return Draws(("a", "b"), 5, 5, {"m": tuple(v["m"] for _, v in rows)}, rows)


def test_drivers_name_the_ranges_that_move_a_figure_beyond_chance() -> None:
    """a follows m exactly (rho +1); b's ranks 4 1 3 0 2 against m's 0..4: dx -2 -1 0 1 2,
    dy 2 -1 1 -2 0, sum dx dy = -4 + 1 + 0 - 2 + 0 = -5, over 10: rho -0.5. Over 5 draws the
    bar is 1.96 / sqrt(4) = 0.98: a is named, b is not; over 16 it is 1.96 / sqrt(15) = 0.506."""
    (a,) = drivers(_draws(), "m")
    assert (a.id, a.rho) == ("a", pytest.approx(1.0))
    assert min_rho(5) == pytest.approx(0.98) and min_rho(16) == pytest.approx(0.5061, abs=1e-4)
    assert min_rho(2) == float("inf")


def _figure(measured: float, drivers_: tuple = ()) -> FigureIntervals:
    f = FigureIntervals("c", "validation", "iteration_time_s", MetricKind.ITERATION, measured, 2.0,
                        drivers=drivers_)
    f.intervals["inputs"] = Interval("inputs", 1.9, 2.0, 2.1, "16 of 16 input draws")
    f.intervals["model"] = Interval("model", 1.5, 2.0, 3.0, "9 held-out")
    return f


def test_uncovered_says_the_side_and_the_drivers() -> None:
    from offsim.validation_intervals import Driver

    assert _figure(2.0).uncovered() is None
    text = _figure(2.5, (Driver("gpu-reserved", 0.93),)).uncovered()
    assert text == "measured 2.5: inputs above p90 2.1; moved by gpu-reserved (rho +0.93)"
    text = _figure(1.0).uncovered()
    assert text is not None and "inputs below p10 1.9; model below p10 1.5" in text
    assert "no assumed input moves it (inputs p90/p10 1.105): the gap is the model's" in text


def test_uncovered_lines_list_validation_figures_only() -> None:
    from offsim.commands._intervals import uncovered_lines

    cal = _figure(9.0)
    cal = FigureIntervals("k", "calibration", cal.metric, cal.kind, 9.0, 2.0, cal.intervals)
    lines = uncovered_lines([_figure(2.0), _figure(1.0), cal])
    assert len(lines) == 2 and lines[1].startswith("  c iteration_time_s: measured 1")


def test_a_case_choice_keeps_the_factor_range_on_its_field_and_is_applied_first() -> None:
    """DRAM 100 GB/s chosen, then the shipped factor 0.9 on it: 90 GB/s, whatever the order drawn."""
    shipped = Assumption(id="dram", paths=["hardware.dram.bandwidth_gb_per_s"], scale=(0.9, 1.0), source="s")
    choice = Assumption(id="case:dram", paths=["hardware.dram.bandwidth_gb_per_s"], choices=[100.0, 200.0],
                        source="c")
    models = _models()
    assert [a.id for a in with_declared(models, [shipped], [choice])] == ["dram", "case:dram"]
    cfg = drawn_config(models, [(shipped, 0.9), (choice, 100.0)])
    assert cfg.hardware.dram.bandwidth_gb_per_s == pytest.approx(90.0)  # type: ignore[union-attr]


def test_run_lines_print_a_choice_as_its_values() -> None:
    """``offsim run --samples``: a choice range lists its values and weights, a draw that does not
    fit shows the value chosen (``=``), a factor range its factor (``x``)."""
    from offsim.commands._intervals import intervals_lines
    from offsim.intervals import Misfit, RangeUsed, RunIntervals

    ranges = (RangeUsed("v", None, (("strategy.z3_host_grads", "flat_host_check"),), "s",
                        choices=("flat_gpu_check", "flat_host_check"), weights=(12.0, 23.0)),
              RangeUsed("dram", (0.85, 1.05), (("hardware.dram.bandwidth_gb_per_s", 80.0),), "s"))
    miss = Misfit(2, "gpu", "gpu memory: needs more", (("v", "flat_gpu_check"), ("dram", 0.9)))
    iv = RunIntervals(4, 0, 3, ranges, (1.0, 1.0, 1.0), {}, (miss,))
    lines = intervals_lines(iv, None)
    assert "drawn: v = flat_gpu_check, dram x0.9" in lines[1]
    assert lines[-2] == ("  v one of flat_gpu_check, flat_host_check weights 12:23: "
                         "strategy.z3_host_grads = flat_host_check")
    assert lines[-1] == "  dram x0.85-x1.05: hardware.dram.bandwidth_gb_per_s = 80"


def test_run_intervals_draw_a_choice_of_the_assumptions_file() -> None:
    """offsim run --samples with a choice range: each draw records the value it chose, and the
    range is reported with its choices; 4 draws of 2 uniform choices give each twice (strata 0-1
    below 0.5, 2-3 above)."""
    from offsim.config.run import make_run_config
    from offsim.intervals import run_intervals

    m = _models(st="zero-offload")
    cfg = make_run_config(m["hardware"], m["workload"], m["strategy"])
    lp = Assumption(id="lp", paths=["strategy.lp_copy"], choices=["separate_cast", "fused_zero_copy"], source="s")
    iv = run_intervals(cfg, [lp], samples=4)
    assert sorted(dict(f)["lp"] for f in iv.factors) == ["fused_zero_copy"] * 2 + ["separate_cast"] * 2
    (used,) = iv.ranges
    assert used.choices == ("separate_cast", "fused_zero_copy") and used.scale is None
    assert used.to_dict()["values"] == {"strategy.lp_copy": "separate_cast"}
