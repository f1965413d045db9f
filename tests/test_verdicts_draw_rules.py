"""A draw of the assumed inputs whose values break a rule of the input files (issue 23): it counts as
a draw that does not fit, with the rule that failed (the file, the field, the range that drew it),
where ``offsim run --samples N`` used to stop with exit 2 on it."""

from __future__ import annotations

import json
import math
from pathlib import Path

import yaml
from typer.testing import CliRunner

from offsim import make_run_config
from offsim.cli import app
from offsim.config.hardware import HardwareProfile
from offsim.config.loading import load_profile, load_workload
from offsim.config.workload import Workload
from offsim.intervals import models_of, run_intervals
from offsim.validation_intervals import Assumption, BrokenRule, drawn_configs

runner = CliRunner()
#: tiny's GEMM efficiency is 1.0 flat; HardwareProfile's GPU refuses a fraction of peak above 1.2
#: (offsim/config/hardware.py, the gemm_efficiency check): a factor above 1.2 breaks that rule
GEMM_TOO_HIGH = Assumption(id="gemm-too-high", paths=["hardware.gpu.gemm_efficiency"], scale=(1.0, 3.0),
                           source="test: a range wider than the schema allows")
RULE_LIMIT = 1.2


def test_a_draw_that_breaks_a_files_rule_does_not_fit_with_that_rule() -> None:
    """4 Latin-hypercube draws of x1-x3: one in each quarter of [log 1, log 3], so the draws of
    the upper three quarters (x1.32 and up) all break the rule, and the first quarter's (x1-x1.32)
    breaks it when above x1.2. Each such draw is a misfit naming the file, the field and the range;
    the others are simulated."""
    cfg = make_run_config("tiny", "tiny", "zero-offload")
    iv = run_intervals(cfg, [GEMM_TOO_HIGH], samples=4, seed=5)
    factors = [dict(d)["gemm-too-high"] for d in iv.factors]
    strata = sorted(math.floor(4 * math.log(f) / math.log(3.0)) for f in factors)
    assert strata == [0, 1, 2, 3]
    broken = {i for i, f in enumerate(factors, start=1) if f > RULE_LIMIT}
    assert len(broken) >= 3
    assert {m.draw for m in iv.misfits} == broken
    assert iv.fits == 4 - len(broken)
    for m in iv.misfits:
        assert m.tier is None and m.rule is not None
        assert (m.rule.file, m.rule.field, m.rule.assumption) == ("hardware profile 'tiny'", "hardware.gpu",
                                                                   "gemm-too-high")
        assert m.rule.rule.startswith("gemm_efficiency: a fraction of peak above 1.2 is not physical")
        assert m.reason == m.rule.text()
        assert iv.draw_times_s[m.draw - 1] is None
    for i, t in enumerate(iv.draw_times_s, start=1):
        assert (t is None) == (i in broken)


def test_a_draw_that_breaks_a_rule_across_files_names_the_drawn_configuration() -> None:
    """tiny with 4 GPUs per node and a workload of 4 data-parallel ranks; the GPU count drawn
    x0.25-x1 (rounded: 1, 2, 3 or 4 GPUs): a draw of fewer than 4 GPUs breaks RunConfig's rule that
    data_parallel x tensor_parallel fits the GPUs (offsim/config/run.py RunConfig._check)."""
    hw = load_profile("tiny").model_dump()
    hw["topology"]["gpus_per_node"] = 4
    wl = load_workload("tiny").model_dump()
    wl["training"]["data_parallel"] = 4
    cfg = make_run_config(HardwareProfile.model_validate(hw), Workload.model_validate(wl), "zero-offload")
    gpus = Assumption(id="gpu-count", paths=["hardware.topology.gpus_per_node"], scale=(0.25, 1.0), source="test")
    seen = []
    for factors, drawn in drawn_configs(models_of(cfg), [gpus], 4, "1"):
        count = max(1, round(4 * factors[0][1]))
        seen.append(count)
        if count < 4:
            assert isinstance(drawn, BrokenRule)
            assert drawn.file == "the drawn configuration" and drawn.assumption is None
            assert "training.data_parallel=4" in drawn.rule and f"exceeds the {count} GPUs" in drawn.rule
        else:
            assert not isinstance(drawn, BrokenRule) and drawn.hardware.topology.gpus_per_node == 4
    assert any(c < 4 for c in seen)


def test_run_samples_counts_the_draw_as_a_misfit_instead_of_exit_2(tmp_path: Path) -> None:
    """The command line: the run as written fits (exit 0); the draws that break the rule are listed
    with it, in text and in --json. Before, the first such draw stopped the command with exit 2."""
    ranges = tmp_path / "ranges.yaml"
    ranges.write_text(yaml.safe_dump({"schema_version": 1, "assumptions": [
        GEMM_TOO_HIGH.model_dump(exclude={"clip", "when", "notes"})]}))
    args = ["run", "-H", "tiny", "-w", "tiny", "-s", "zero-offload", "--samples", "4", "--seed", "5",
            "--assumptions", str(ranges)]
    result = runner.invoke(app, [*args, "-q"], terminal_width=250)
    assert result.exit_code == 0, result.output
    assert "draw 2 does not fit: breaks a rule of hardware profile 'tiny', hardware.gpu: gemm_efficiency: a " \
           "fraction of peak above 1.2 is not physical (range 'gemm-too-high' drew it); drawn: gemm-too-high x" \
           in result.output
    doc = json.loads(runner.invoke(app, [*args, "--json"]).stdout)
    misfits = doc["intervals"]["misfits"]
    assert misfits and all(m["tier"] is None for m in misfits)
    assert misfits[0]["rule"] == {"file": "hardware profile 'tiny'", "field": "hardware.gpu",
                                  "rule": misfits[0]["rule"]["rule"], "assumption": "gemm-too-high"}
    assert doc["intervals"]["fits"] == 4 - len(misfits)


def test_validate_samples_count_such_a_draw_as_not_fitting() -> None:
    """``offsim validate --samples`` (sample_inputs): the same draws as ``run --samples`` at the same
    seed; those that break the rule are not simulated and count as not fitting."""
    from offsim.validation_intervals import sample_inputs

    cfg = make_run_config("tiny", "tiny", "zero-offload")
    draws = sample_inputs(models_of(cfg), [GEMM_TOO_HIGH], 4, "5",
                          lambda m, _cfg: {"iteration_time_s": m.iteration_time_s})
    iv = run_intervals(cfg, [GEMM_TOO_HIGH], samples=4, seed=5)
    assert (draws.samples, draws.feasible) == (4, iv.fits) and iv.fits < 4
    assert len(draws.values["iteration_time_s"]) == iv.fits
