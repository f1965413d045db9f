"""Prediction intervals of the validation cases (issue 23 part 3): the ranges of the assumed
inputs, the held-out residuals (a case never sees its own, nor its source's), coverage and
sharpness, and ``offsim validate``'s report of them."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from typer.testing import CliRunner

from offsim.cli import app
from offsim.config.loading import load_profile, load_strategy, load_workload
from offsim.errors import ConfigError
from offsim.validation import CaseResult, MeasureResult, ValidationCase, case_models, load_cases, metric_kind
from offsim.validation_intervals import (
    Assumption,
    applies,
    coverage,
    default_assumptions_path,
    figure_intervals,
    input_quantiles,
    latin_hypercube,
    load_assumptions,
    perturb,
    quantile,
    time_ratio,
)

ASSUMPTIONS = load_assumptions(default_assumptions_path())


# ----------------------------------------------------------------------------- the ranges
def test_shipped_ranges_hold_one_and_cite_a_source() -> None:
    for a in ASSUMPTIONS:
        assert a.scale[0] <= 1.0 <= a.scale[1], a.id
        assert len(a.source) > 40, a.id


def test_every_shipped_range_applies_to_some_case() -> None:
    from offsim.validation import default_cases_path

    used = set()
    for case in load_cases(default_cases_path()):
        models = dict(zip(("hardware", "workload", "strategy"), case_models(case), strict=True))
        used |= {a.id for a in ASSUMPTIONS if applies(a, models)}
    assert used == {a.id for a in ASSUMPTIONS}


def test_a_range_must_hold_one() -> None:
    with pytest.raises(ValueError, match="must hold 1"):
        Assumption(id="x", paths=["hardware.dram.bandwidth_gb_per_s"], scale=(1.1, 1.2), source="s")
    with pytest.raises(ValueError, match="must start with"):
        Assumption(id="x", paths=["dram.bandwidth_gb_per_s"], scale=(0.9, 1.2), source="s")


def test_bad_assumptions_file_names_the_field(tmp_path: Path) -> None:
    bad = tmp_path / "a.yaml"
    bad.write_text("schema_version: 1\nassumptions:\n  - {id: x, paths: [hardware.dram.bandwidth_gb_per_s], "
                   "scale: [0.9], source: s}\n")
    with pytest.raises(ConfigError, match=r"assumptions\.0\.scale"):
        load_assumptions(bad)


def _models(hw: str = "a100-80gb-pcie4", wl: str = "llama2-7b", st: str = "zero-offload") -> dict:
    return {"hardware": load_profile(hw), "workload": load_workload(wl), "strategy": load_strategy(st)}


def test_perturb_scales_every_path_and_curve() -> None:
    models = _models()
    by_id = {a.id: a for a in ASSUMPTIONS}
    out = perturb(models, [(by_id["host-link-rate"], 0.5), (by_id["gemm-efficiency"], 0.9)])
    link = out["hardware"].host_link
    assert link.h2d.pinned.bandwidth_gb_per_s == pytest.approx(12.5)
    assert link.d2h.pageable.bandwidth_gb_per_s == pytest.approx(6.25)
    before = models["hardware"].gpu.gemm_efficiency
    assert [p[1] for p in out["hardware"].gpu.gemm_efficiency] == pytest.approx([0.9 * p[1] for p in before])
    assert out["workload"] is models["workload"]


def test_clip_bounds_the_scaled_value() -> None:
    a = Assumption(id="d", paths=["hardware.host_link.duplex_efficiency"], scale=(0.5, 2.0), clip=(0.3, 1.0),
                   source="s")
    assert perturb(_models(), [(a, 2.0)])["hardware"].host_link.duplex_efficiency == 1.0


def test_derived_cpu_rate_scaled_as_the_rate_it_runs_at() -> None:
    """a100-80gb-pcie4 derives its CPU Adam rate: factor 1 keeps the run, factor 0.5 halves the step."""
    from offsim import simulate
    from offsim.config.run import make_run_config

    models = _models()
    (rate,) = [a for a in ASSUMPTIONS if a.id == "cpu-adam-rate-derived"]
    assert applies(rate, models)
    assert not applies(next(a for a in ASSUMPTIONS if a.id == "cpu-adam-rate-measured"), models)

    def busy(m: dict) -> float:
        return simulate(make_run_config(m["hardware"], m["workload"], m["strategy"])).metrics.cpu_optimizer_busy_s

    base = busy(models)
    assert busy(perturb(models, [(rate, 1.0)])) == pytest.approx(base, rel=1e-9)
    assert busy(perturb(models, [(rate, 0.5)])) == pytest.approx(2 * base, rel=0.02)


def test_a_range_on_a_missing_tier_does_not_apply() -> None:
    (pfs,) = [a for a in ASSUMPTIONS if a.id == "pfs-rates"]
    assert not applies(pfs, _models())  # the A100 PCIe box has no parallel file system


def test_latin_hypercube_one_point_per_stratum() -> None:
    pts = latin_hypercube(10, 3, random.Random(1))
    for axis in range(3):
        assert sorted(int(p[axis] * 10) for p in pts) == list(range(10))


def test_input_quantiles_of_a_run_are_ordered() -> None:
    q = input_quantiles(load_profile("tiny"), load_workload("tiny"), load_strategy("zero-offload"), ASSUMPTIONS,
                        samples=6)
    p10, p50, p90 = q["iteration_time_s"]
    assert 0 < p10 <= p50 <= p90
    assert p10 < p90  # the tiny run moves with its link and CPU rates


# ----------------------------------------------------------------------------- held-out residuals
def test_quantile_is_linear_between_order_statistics() -> None:
    assert quantile([1.0, 2.0, 3.0, 4.0, 5.0], 0.1) == pytest.approx(1.4)
    assert quantile([3.0, 1.0, 2.0], 0.5) == 2.0
    assert quantile([7.0], 0.9) == 7.0


def test_time_ratio_of_a_throughput_is_inverted() -> None:
    assert time_ratio("iteration_time_s", 10.0, 5.0) == 2.0  # measured twice the predicted time
    assert time_ratio("tflops_per_gpu", 40.0, 80.0) == 2.0   # half the predicted speed: the same


def _case(cid: str, source: str, role: str = "validation") -> ValidationCase:
    return ValidationCase.model_validate({"id": cid, "citation": "hand-made", "url": f"https://{source}.org",
                                          "hardware": "tiny", "workload": "tiny", "strategy": "gpu-only",
                                          "role": role})


def _result(cid: str, source: str, measured: float, predicted: float, role: str = "validation") -> CaseResult:
    m = MeasureResult("iteration_time_s", metric_kind("iteration_time_s"), measured, predicted, 0.1)
    return CaseResult(_case(cid, source, role), True, None, (m,))


def _hand_made() -> list[CaseResult]:
    """Six sources, one case each at ratios 1..6 (measured / predicted time), plus a sibling of
    source a at ratio 100 and a calibration case at ratio 1000 (never a residual)."""
    rs = [_result(c, c, float(i), 1.0) for i, c in enumerate("abcdef", start=1)]
    return [*rs, _result("a2", "a", 100.0, 1.0), _result("cal", "g", 1000.0, 1.0, role="calibration")]


def test_held_out_by_source_never_uses_the_case_or_its_siblings() -> None:
    figs = {f.case_id: f for f in figure_intervals(_hand_made())}
    model = figs["a"].intervals["model"]
    assert model.basis.startswith("5 held-out")  # b..f: not a, not its sibling a2, not the calibration case
    assert (model.low, model.high) == (pytest.approx(quantile([2, 3, 4, 5, 6], 0.1)),
                                       pytest.approx(quantile([2, 3, 4, 5, 6], 0.9)))
    assert not model.covers(1.0)  # a's own ratio 1 lies below every other source's
    b = figs["b"].intervals["model"]
    assert b.high == pytest.approx(quantile([1, 3, 4, 5, 6, 100], 0.9))  # a and a2 are another source for b


def test_held_out_by_case_keeps_the_siblings() -> None:
    figs = {f.case_id: f for f in figure_intervals(_hand_made(), holdout="case")}
    assert figs["a"].intervals["model"].basis.startswith("6 held-out")  # b..f and a2


def test_too_few_residuals_give_no_interval() -> None:
    figs = figure_intervals(_hand_made()[:3])
    assert all("model" not in f.intervals and "fewer than" in f.missing["model"] for f in figs)


def test_coverage_and_sharpness() -> None:
    """Each of a..f gets the p10-p90 of the other five ratios: a (1) and f (6) fall outside,
    b..e inside; sharpness is the median p90/p10."""
    figs = figure_intervals(_hand_made()[:6])
    (overall,) = [c for c in coverage(figs) if c.source == "model" and c.kind == "all"]
    assert (overall.figures, overall.covered, overall.coverage) == (6, 4, pytest.approx(4 / 6))
    ratios = sorted(f.intervals["model"].high / f.intervals["model"].low for f in figs)
    assert overall.sharpness == pytest.approx((ratios[2] + ratios[3]) / 2)
    (inputs,) = [c for c in coverage(figs) if c.source == "inputs" and c.kind == "all"]
    assert (inputs.figures, inputs.without) == (0, 6)  # no draws were made


# ----------------------------------------------------------------------------- the command
CASES = """schema_version: 1
cases:
{}
"""


def _tiny_cases(tmp_path: Path, n: int = 6) -> Path:
    lines = []
    for i in range(n):
        lines.append(f"  - {{id: t{i}, citation: hand-made, url: 'https://s{i}.org', hardware: tiny, "
                     f"workload: tiny, strategy: zero-offload, metric: iteration_time_s, "
                     f"measured: {0.001 * (i + 1)}, tolerance: 0.1}}")
    path = tmp_path / "cases.yaml"
    path.write_text(CASES.format("\n".join(lines)))
    return path


def test_validate_reports_intervals_and_coverage(tmp_path: Path) -> None:
    out = tmp_path / "v.csv"
    result = CliRunner().invoke(app, ["validate", "--cases", str(_tiny_cases(tmp_path)), "--samples", "3",
                                      "--json", "-o", str(out)])
    assert result.exit_code in (0, 1), result.output
    doc = json.loads(result.stdout)
    assert result.exit_code == (0 if doc["summary"]["ok"] else 1)
    cov = {(c["source"], c["kind"]): c for c in doc["intervals"]["coverage"]}
    assert cov[("model", "all")]["figures"] == 6 and cov[("inputs", "all")]["figures"] == 6
    row = doc["cases"][0]
    assert row["model_p10"] <= row["model_p50"] <= row["model_p90"]
    assert row["inputs_basis"] == "3 of 3 input draws"
    assert "model_covers" in out.read_text().splitlines()[0]


def test_validate_text_names_the_coverage(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["validate", "--cases", str(_tiny_cases(tmp_path)), "-q"])
    assert "interval coverage (model: held-out errors of other sources)" in result.output
    assert "give --samples N" in result.output


def test_validate_bad_holdout_and_bad_samples_exit_2(tmp_path: Path) -> None:
    cases = str(_tiny_cases(tmp_path))
    result = CliRunner().invoke(app, ["validate", "--cases", cases, "--holdout", "nope"])
    assert result.exit_code == 2 and "--holdout nope" in result.output
    assert CliRunner().invoke(app, ["validate", "--cases", cases, "--samples", "-1"]).exit_code == 2


def test_validate_bad_assumptions_file_exits_2(tmp_path: Path) -> None:
    bad = tmp_path / "a.yaml"
    bad.write_text("schema_version: 1\nassumptions: [{id: x}]\n")
    result = CliRunner().invoke(app, ["validate", "--cases", str(_tiny_cases(tmp_path)), "--samples", "1",
                                      "--assumptions", str(bad)])
    assert result.exit_code == 2 and "a.yaml" in result.output and "Traceback" not in result.output
