"""Every verdict of fit stated with its margin (issue 23) where a user reads it: ``offsim fit`` (a
table of each tier's margin, and each tier's sentence in --json), ``offsim validate`` (a line per
verdict case under the cases table) and ``offsim run`` on a configuration that does not fit.

The GPU's margin is gpu_memory.md §4's: X = T - (A + 0.04 A + O) to spare, Y = 0.02 A + 0.65 GiB,
fits when X >= Y, out of memory when X <= -Y, marginal between. On the tiny profile nothing is held
outside PyTorch's pool (``reserved_gib: 0``, so O = 0 and A is the whole GPU need): X = 16 GiB -
1.04 need and Y = 0.02 need + 0.65 GiB."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from offsim.cli import app
from offsim.commands._verdicts import margin_cell
from offsim.commands.validate import verdict_lines
from offsim.core.units import GiB
from offsim.fit_check import tier_margins
from offsim.plan.footprint import OUTSIDE_POOL_ITEM, TIERS, Footprint, GpuMargin
from offsim.validation import CaseResult, MeasureResult, Outcome, ValidationCase, metric_kind

runner = CliRunner()
ROOT = Path(__file__).resolve().parent.parent
TINY_GPU_GIB = 16.0


def _footprint(gpu_allocated_gib: float) -> Footprint:
    """GPU: A allocated, O = 1.45 GiB outside the pool, T = 79.2 GiB (gpu_memory.md §4's example);
    host 120 of 100 GiB; NVMe 30 of 100 GiB; pinned and PFS hold nothing."""
    need = {t: 0.0 for t in TIERS}
    cap = {t: 100.0 * GiB for t in TIERS}
    need["gpu"], cap["gpu"] = (gpu_allocated_gib + 1.45) * GiB, 79.2 * GiB
    need["host"], need["nvme"] = 120.0 * GiB, 30.0 * GiB
    bd: dict[str, dict[str, float]] = {t: {} for t in TIERS}
    bd["gpu"] = {"params (16-bit)": gpu_allocated_gib * GiB, OUTSIDE_POOL_ITEM: 1.45 * GiB}
    return Footprint(need, cap, bd)


def test_tier_margins_by_hand() -> None:
    # A = 70: F = 2.80, X = 79.2 - 74.25 = 4.95, Y = 1.40 + 0.65 = 2.05 -> fits; host -20; NVMe +70
    gpu, host, nvme = tier_margins(_footprint(70.0))
    assert (gpu.tier, host.tier, nvme.tier) == ("gpu", "host", "nvme")
    assert gpu.spare_bytes / GiB == pytest.approx(4.95) and gpu.uncertainty_bytes / GiB == pytest.approx(2.05)
    assert gpu.verdict == "fits" and gpu.need_bytes == 71.45 * GiB and gpu.capacity_bytes == 79.2 * GiB
    assert host.spare_bytes == -20.0 * GiB and host.uncertainty_bytes == 0.0 and host.verdict == "out of memory"
    assert nvme.spare_bytes == 70.0 * GiB and nvme.verdict == "fits"
    assert host.sentence == "host memory per node: short by 20.00 GiB (120.00 of 100.00 GiB)"
    assert [margin_cell(m.to_dict()) for m in (gpu, host, nvme)] == [
        "4.95 ± 2.05 to spare: fits", "[red]short 20.00[/]", "70.00 to spare"]
    assert margin_cell(None) == "-"
    # A = 74: F = 2.96, X = 79.2 - 78.41 = 0.79, Y = 1.48 + 0.65 = 2.13 -> marginal, in red
    assert margin_cell(tier_margins(_footprint(74.0))[0].to_dict()) == "[red]0.79 ± 2.13 to spare: marginal[/]"


def _big_workload(tmp_path: Path) -> Path:
    """tiny with 400 blocks: too big for tiny's 16 GiB GPU without offload."""
    big = tmp_path / "big.yaml"
    big.write_text((ROOT / "workloads/tiny.yaml").read_text().replace("layers: 4", "layers: 400").replace(
        "name: tiny", "name: big"))
    return big


def _gpu_by_hand(need_bytes: float) -> tuple[float, float]:
    """X and Y in GiB on tiny (O = 0): 16 - 1.04 need, 0.02 need + 0.65."""
    return TINY_GPU_GIB - 1.04 * need_bytes / GiB, 0.02 * need_bytes / GiB + 0.65


def test_fit_states_every_tiers_margin(tmp_path: Path) -> None:
    args = ["fit", "-H", "tiny", "-w", str(_big_workload(tmp_path)), "-s", "gpu-only,zero-infinity-cpu"]
    doc = json.loads(runner.invoke(app, [*args, "--json"]).stdout)
    rows = {r["strategy"]: r for r in doc["strategies"]}
    gpu_only = rows["gpu-only"]
    need = gpu_only["tiers"]["gpu"]["peak_bytes"]
    x, y = _gpu_by_hand(need)
    gpu = gpu_only["margins"][0]
    assert gpu["tier"] == "gpu" and gpu["verdict"] == "out of memory" and x < -y
    assert gpu["spare_bytes"] / GiB == pytest.approx(x) and gpu["uncertainty_bytes"] / GiB == pytest.approx(y)
    assert gpu["sentence"].startswith(f"GPU (per rank): short by {-x:.2f} ± {y:.2f} GiB counting 4% allocator")
    for row in rows.values():  # every tier that holds something, need against capacity
        for m in row["margins"][1:]:
            rep = row["tiers"][m["tier"]]
            assert m["spare_bytes"] == rep["capacity_bytes"] - rep["peak_bytes"] and rep["peak_bytes"] > 0
    out = tmp_path / "fit.csv"
    assert runner.invoke(app, [*args, "-q", "-o", str(out)]).exit_code == (0 if doc["fits_any"] else 1)
    table = pd.read_csv(out).set_index("strategy")
    assert table.loc["gpu-only", "gpu_spare_bytes"] == pytest.approx(gpu["spare_bytes"], rel=1e-12)
    assert table.loc["gpu-only", "gpu_uncertainty_bytes"] == pytest.approx(gpu["uncertainty_bytes"], rel=1e-12)
    assert table.loc["gpu-only", "gpu_verdict"] == "out of memory"
    text = runner.invoke(app, args, terminal_width=250).output
    assert "verdict per tier with its margin (GiB to spare, or short" in text
    assert f"short {-x:.2f} ± {y:.2f}: out of memory" in text
    assert "GPU to spare = capacity - (allocated + 4% allocator fragmentation" in text


def test_run_that_does_not_fit_states_each_tiers_margin(tmp_path: Path) -> None:
    args = ["run", "-H", "tiny", "-w", str(_big_workload(tmp_path)), "-s", "gpu-only"]
    doc = json.loads(runner.invoke(app, [*args, "--json", "-q"]).stdout)
    x, y = _gpu_by_hand(doc["footprint_bytes"]["need"]["gpu"])
    result = runner.invoke(app, [*args, "-q"], terminal_width=250)
    assert result.exit_code == 1
    lines = result.output.splitlines()
    at = lines.index("the planner's verdict per tier, with its margin:")
    assert lines[at + 1] == (f"  GPU (per rank): short by {-x:.2f} ± {y:.2f} GiB counting 4% allocator "
                             "fragmentation and 0.00 GiB outside PyTorch's pool: out of memory")


def _case(cid: str, outcome: Outcome) -> ValidationCase:
    return ValidationCase.model_validate({"id": cid, "citation": "hand-made", "url": "https://example.org",
                                          "hardware": "tiny", "workload": "tiny", "strategy": "gpu-only",
                                          "outcome": outcome})


def _margin(allocated_gib: float) -> str:
    return GpuMargin(allocated_gib * GiB, 0.04 * allocated_gib * GiB, 1.45 * GiB, 79.2 * GiB).sentence()


def test_validate_states_each_verdict_case_with_its_margin() -> None:
    """A GPU out of memory (A = 77.5: X = 79.2 - 82.05 = -2.85, Y = 2.20), a host out of memory
    with the GPU fitting (A = 70: X = 4.95, Y = 2.05), a run that trained on a marginal GPU (A = 74:
    X = 0.79, Y = 2.13), one accepted that ran out of memory (a wrong verdict); a run with room
    to spare and a figure is no verdict case."""
    measure = (MeasureResult("iteration_time_s", metric_kind("iteration_time_s"), 1.0, 1.0, 0.1),)
    results = [
        CaseResult(_case("gpu-oom", Outcome.OOM), False, "gpu memory: needs 79.0 GiB (per GPU; ...)",
                   gpu_margin=_margin(77.5)),
        CaseResult(_case("host-oom", Outcome.OOM), False,
                   "host memory: needs 120.00 GiB but has 100.00 GiB (per node; largest: x 1.00 GiB)",
                   gpu_margin=_margin(70.0)),
        CaseResult(_case("marginal", Outcome.RAN), True, None, measure, gpu_margin=_margin(74.0)),
        CaseResult(_case("accepted-oom", Outcome.OOM), True, None, gpu_margin=_margin(70.0)),
        CaseResult(_case("roomy", Outcome.RAN), True, None, measure, gpu_margin=_margin(60.0)),
    ]
    lines = verdict_lines(results)
    assert lines[0].startswith("verdicts of fit (judged, or near the edge), with the GPU's margin per rank "
                               "(counting 4% allocator fragmentation")
    assert lines[1:] == [
        "  gpu-oom: oom, offsim rejects (right): GPU short by 2.85 ± 2.20 GiB: out of memory",
        "  host-oom: oom, offsim rejects (right): GPU fits with 4.95 ± 2.05 GiB to spare: fits; "
        "host memory: needs 120.00 GiB but has 100.00 GiB",
        "  marginal: ran, offsim accepts (right): GPU fits with 0.79 ± 2.13 GiB to spare: marginal",
        "  accepted-oom: oom, offsim accepts (WRONG): GPU fits with 4.95 ± 2.05 GiB to spare: fits",
    ]
    assert verdict_lines(results[-1:]) == []
