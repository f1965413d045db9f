"""``offsim run --samples N``: p10/p50/p90 of one run over draws of its assumed inputs (issue 23
part 3), hand-computed on a tiny configuration; the draws that do not fit; the CLI's exit codes."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from offsim import make_run_config, simulate
from offsim.cli import app
from offsim.commands._intervals import fastest_draws
from offsim.config.hardware import HardwareProfile
from offsim.config.loading import load_profile, load_workload
from offsim.config.workload import Workload
from offsim.intervals import RunIntervals, run_intervals
from offsim.validation_intervals import Assumption, default_assumptions_path, load_assumptions

runner = CliRunner()
GIB = 2**30
RESERVED = Assumption(id="gpu-reserved", paths=["hardware.gpu.reserved_gib"], scale=(0.5, 2.0), source="test")


def _tiny_with_reserve(reserved_gib: float) -> HardwareProfile:
    data = load_profile("tiny").model_dump()
    data["gpu"]["reserved_gib"] = reserved_gib
    return HardwareProfile.model_validate(data)


def test_quantiles_of_the_gpu_reserve_by_hand() -> None:
    """One range, the GPU's reserve x0.5-x2 on tiny with 1 GiB reserved, 4 draws: the simulated GPU
    peak is the rest (2,231,753,728 B, the run at 0 GiB reserved; 232,802,304 B before 447c1e1 gave
    ZeRO-Offload DeepSpeed's ZeRO-2 IPG buffers, 2 x 5e8 x 2 B + the 8192 x 1024 x 2 B temporary =
    2,016,777,216 B from backward's start, in place of the generic path's gradient buffers) plus
    the reserve, so draw i peaks at rest + f_i GiB. Over 4 sorted values x0..x3, numpy's linear
    quantiles sit at positions 0.3, 1.5 and 2.7: p10 = x0 + 0.3 (x1 - x0), p50 = (x1 + x2) / 2,
    p90 = x2 + 0.7 (x3 - x2).
    The reserve moves no time: p10 = p50 = p90 = the run's 0.56100 s."""
    rest = simulate(make_run_config(_tiny_with_reserve(0.0), "tiny", "zero-offload")).metrics
    assert rest.peak_bytes.gpu == 2_231_753_728
    cfg = make_run_config(_tiny_with_reserve(1.0), "tiny", "zero-offload")
    iv = run_intervals(cfg, [RESERVED], samples=4, seed=7)
    f = sorted(dict(d)["gpu-reserved"] for d in iv.factors)
    # Latin hypercube: one draw in each quarter of [log 0.5, log 2]
    strata = sorted(math.floor(4 * (math.log(x) - math.log(0.5)) / math.log(4)) for x in f)
    assert strata == [0, 1, 2, 3]
    x = [2_231_753_728 + fi * GIB for fi in f]
    expected = (x[0] + 0.3 * (x[1] - x[0]), (x[1] + x[2]) / 2, x[2] + 0.7 * (x[3] - x[2]))
    assert iv.peak_bytes["gpu"] == pytest.approx(expected, abs=1.0)  # peaks are whole bytes
    assert iv.iteration_time_s is not None
    assert all(abs(t - rest.iteration_time_s) < 1e-12 for t in iv.iteration_time_s)
    assert (iv.fits, iv.samples, iv.misfits) == (4, 4, ())
    assert [r.id for r in iv.ranges] == ["gpu-reserved"]
    assert iv.ranges[0].values == (("hardware.gpu.reserved_gib", 1.0),)


def test_the_same_seed_gives_the_same_draws_and_another_seed_others() -> None:
    cfg = make_run_config(_tiny_with_reserve(1.0), "tiny", "zero-offload")
    a, b = (run_intervals(cfg, [RESERVED], 3, seed=1) for _ in range(2))
    c = run_intervals(cfg, [RESERVED], 3, seed=2)
    assert a == b and a.factors != c.factors


def test_a_draw_that_does_not_fit_is_counted_with_its_tier_and_factors() -> None:
    """tiny's GPU holds 16 GiB; gpu-only on tiny at 40 layers needs 8.44 GiB besides the reserve,
    so with 5 GiB reserved x0.5-x2 (2.5-10 GiB) the draws above ~x1.5 do not fit: they are counted,
    each with the GPU tier, and every factor that does not fit is above every factor that fits."""
    data = load_workload("tiny").model_dump()
    data["model"]["layers"] = 40
    cfg = make_run_config(_tiny_with_reserve(5.0), Workload.model_validate(data), "gpu-only")
    iv = run_intervals(cfg, [RESERVED], samples=8, seed=0)
    assert 0 < iv.fits < iv.samples == 8
    assert len(iv.misfits) == iv.samples - iv.fits
    for m in iv.misfits:
        assert m.tier == "gpu" and "gpu memory" in m.reason
        assert dict(m.factors)["gpu-reserved"] > 1.0
        assert dict(iv.factors[m.draw - 1]) == dict(m.factors)
    fitting = [dict(d)["gpu-reserved"] for i, d in enumerate(iv.factors, 1) if i not in {m.draw for m in iv.misfits}]
    assert max(fitting) < min(dict(m.factors)["gpu-reserved"] for m in iv.misfits)


@settings(max_examples=8, deadline=None)
@given(samples=st.integers(1, 5), seed=st.integers(0, 10**6))
def test_quantiles_are_ordered_and_fits_at_most_draws(samples: int, seed: int) -> None:
    """Whatever the seed and the count: p10 <= p50 <= p90 for the time and every tier, k <= N."""
    cfg = make_run_config("tiny", "tiny", "zero-infinity-nvme")
    iv = run_intervals(cfg, load_assumptions(default_assumptions_path()), samples, seed)
    assert 0 <= iv.fits <= iv.samples == samples == len(iv.factors)
    for q in [iv.iteration_time_s, *iv.peak_bytes.values()]:
        assert q is not None and q[0] <= q[1] <= q[2]


def test_cli_samples_in_the_table_and_the_json() -> None:
    result = runner.invoke(app, ["run", "-H", "tiny", "-w", "tiny", "-s", "zero-offload", "--samples", "3",
                                 "--seed", "5", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    iv = doc["intervals"]
    assert (iv["samples"], iv["seed"], iv["fits"]) == (3, 5, 3)
    assert iv["iteration_time_s"]["p10"] <= iv["iteration_time_s"]["p50"] <= iv["iteration_time_s"]["p90"]
    assert set(iv["peak_bytes"]) == {"gpu", "host_pinned", "host", "nvme", "pfs"}
    assert {r["id"] for r in iv["ranges"]} >= {"host-link-rate", "cpu-memcpy"}
    assert all(r["source"] for r in iv["ranges"])
    table = runner.invoke(app, ["run", "-H", "tiny", "-w", "tiny", "-s", "zero-offload", "--samples", "3", "-q"],
                          terminal_width=200)
    assert table.exit_code == 0
    assert "fits in 3 of 3 draws" in table.stdout and "as written" in table.stdout
    assert "cpu-memcpy x0.5-x1.5: hardware.cpu.memcpy_gb_per_s = 10" in table.stdout


def test_cli_exit_codes(tmp_path: Path) -> None:
    """An infeasible run still exits 1 with its draws; a negative count and a bad ranges file exit 2."""
    big = tmp_path / "big.yaml"
    big.write_text((Path(__file__).parent.parent / "workloads" / "tiny.yaml").read_text()
                   .replace("name: tiny", "name: big").replace("layers: 4", "layers: 400"))
    result = runner.invoke(app, ["run", "-H", "tiny", "-w", str(big), "-s", "gpu-only", "--samples", "2", "--json"])
    assert result.exit_code == 1, result.output
    iv = json.loads(result.stdout)["intervals"]
    assert iv["fits"] == 0 and [m["tier"] for m in iv["misfits"]] == ["gpu", "gpu"]
    assert iv["iteration_time_s"] is None
    assert runner.invoke(app, ["run", "-H", "tiny", "-w", "tiny", "--samples", "-1"]).exit_code == 2
    bad = tmp_path / "ranges.yaml"
    bad.write_text("schema_version: 1\nassumptions:\n  - {id: x, paths: [hardware.dram.bandwidth_gb_per_s], "
                   "scale: [1.2, 1.5], source: s}\n")
    result = runner.invoke(app, ["run", "-H", "tiny", "-w", "tiny", "--samples", "2", "--assumptions", str(bad)])
    assert result.exit_code == 2 and "must hold 1" in result.output


# ----------------------------------------------------------------------------- a file's own ranges
ASSUMED_PROFILE = Path(__file__).parent / "data" / "intervals" / "tiny-assumed.yaml"


def test_a_profile_declares_its_assumed_values_and_they_replace_the_shipped_range() -> None:
    """tiny-assumed declares memcpy 5-20 GB/s around its 10 (factors x0.5-x2) and its GEMM
    curve x0.9-x1: they are drawn in place of the shipped cpu-memcpy and gemm-efficiency ranges;
    the other shipped ranges still apply."""
    cfg = make_run_config(str(ASSUMED_PROFILE), "tiny", "zero-offload")
    iv = run_intervals(cfg, load_assumptions(default_assumptions_path()), samples=4, seed=0)
    by_id = {r.id: r for r in iv.ranges}
    memcpy = by_id["hardware:cpu.memcpy_gb_per_s"]
    assert (memcpy.scale, memcpy.origin, memcpy.values) == ((0.5, 2.0), "hardware profile",
                                                           (("hardware.cpu.memcpy_gb_per_s", 10.0),))
    assert by_id["hardware:gpu.gemm_efficiency"].scale == (0.9, 1.0)
    assert "cpu-memcpy" not in by_id and "gemm-efficiency" not in by_id and "host-link-rate" in by_id
    assert all(0.5 <= dict(f)["hardware:cpu.memcpy_gb_per_s"] <= 2.0 for f in iv.factors)


def _tiny_profile_data() -> dict:
    import yaml

    return yaml.safe_load(ASSUMED_PROFILE.read_text())


@pytest.mark.parametrize(("entry", "message"), [
    ({"cpu.memcpy_gb_per_s": {"range": [12, 20], "why": "w"}}, "does not hold the value 10.0"),
    ({"cpu.memcpy_gb_per_s": {"range": [5, 20], "scale": [0.5, 2], "why": "w"}}, "exactly one of range and scale"),
    ({"cpu.memcpy_gb_per_s": {"scale": [1.1, 2], "why": "w"}}, "must hold 1"),
    ({"cpu.no_such_field": {"scale": [0.9, 1.1], "why": "w"}}, "not a number of this file"),
    ({"gpu.gemm_efficiency": {"range": [0.5, 1.0], "why": "w"}}, "a curve takes scale"),
    ({"cpu.memcpy_gb_per_s": {"range": [5, 20]}}, "why"),
])
def test_a_bad_assumed_range_is_one_message_naming_the_field(tmp_path: Path, entry: dict, message: str) -> None:
    import yaml

    data = _tiny_profile_data()
    data["assumed"] = entry
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(data))
    result = runner.invoke(app, ["run", "-H", str(bad), "-w", "tiny", "-q"])
    assert result.exit_code == 2 and message in result.output and "assumed" in result.output, result.output


def test_a_workload_count_is_drawn_whole() -> None:
    """A workload's seq_len (512 in tiny) declared 256-1024: every draw runs a whole number of
    tokens in that range (512 x the factor, rounded), and more tokens take longer, so the time
    interval is not a point."""
    from offsim.intervals import models_of
    from offsim.validation_intervals import drawn_configs, with_declared

    data = load_workload("tiny").model_dump()
    assert data["training"]["seq_len"] == 512
    data["assumed"] = {"training.seq_len": {"range": [256, 1024], "why": "test: the source gives no length"}}
    cfg = make_run_config("tiny", Workload.model_validate(data), "gpu-only")
    models = models_of(cfg)
    chosen = with_declared(models, [])
    for factors, drawn in drawn_configs(models, chosen, 4, "3"):
        seq = drawn.workload.training.seq_len
        assert isinstance(seq, int) and 256 <= seq <= 1024 and seq == round(512 * factors[0][1])
    iv = run_intervals(cfg, [], samples=4, seed=3)
    assert iv.fits == 4 and iv.iteration_time_s is not None and iv.iteration_time_s[0] < iv.iteration_time_s[2]


# ----------------------------------------------------------------------------- compare --samples
def _iv(times: tuple[float | None, ...], factors: tuple = ((("a", 1.0),),) * 3) -> RunIntervals:
    return RunIntervals(samples=len(times), seed=0, fits=sum(t is not None for t in times), ranges=(),
                        iteration_time_s=None, peak_bytes={}, misfits=(), factors=factors, draw_times_s=times)


def test_fastest_draws_by_hand() -> None:
    """Three draws, two budgets. Budget x: A 1, 2, 3 s; B 2, 1, 3 s: A wins draw 1, B draw 2, both
    tie draw 3 (each counts it): A 2, B 2. Budget y: C 5, -, 5 s (draw 2 does not fit); D 6, 6, 4 s:
    C wins draw 1, D draws 2 (C does not fit) and 3: C 1, D 2. A variant without draws (a policy
    error) gets None, and a budget whose variants saw other draws gets None throughout."""
    found = [_iv((1.0, 2.0, 3.0)), _iv((2.0, 1.0, 3.0)), _iv((5.0, None, 5.0)), _iv((6.0, 6.0, 4.0)), None]
    assert fastest_draws(["x", "x", "y", "y", "y"], found) == [2, 2, 1, 2, None]
    other = _iv((1.0, 1.0, 1.0), factors=((("b", 1.0),),) * 3)
    assert fastest_draws(["z", "z"], [_iv((1.0, 2.0, 3.0)), other]) == [None, None]


def test_compare_samples_adds_paired_columns() -> None:
    result = runner.invoke(app, ["compare", "-H", "tiny", "-w", "tiny", "--policies", "lru,mru", "--cache-gib",
                                 "0.1", "--samples", "3", "--json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)["rows"]
    assert [r["fits_draws"] for r in rows] == ["3/3", "3/3"]
    for r in rows:
        assert r["iteration_p10_s"] <= r["iteration_p50_s"] <= r["iteration_p90_s"]
    assert sum(r["fastest_draws"] for r in rows) >= 3  # every draw has a fastest (ties count for each)
    table = runner.invoke(app, ["compare", "-H", "tiny", "-w", "tiny", "--policies", "lru,mru", "--cache-gib",
                                "0.1", "--samples", "3"], terminal_width=200)
    assert table.exit_code == 0 and "each variant at the same 3 draws" in table.stdout
    assert runner.invoke(app, ["compare", "-H", "tiny", "-w", "tiny", "--samples", "-2"]).exit_code == 2


def test_validate_draws_a_profiles_own_ranges_too() -> None:
    """validate's draws (sample_inputs) take a file's own range in place of the shipped one."""
    from offsim.validation_intervals import sample_inputs

    cfg = make_run_config(str(ASSUMED_PROFILE), "tiny", "zero-offload")
    draws = sample_inputs({"hardware": cfg.hardware, "workload": cfg.workload, "strategy": cfg.strategy},
                          load_assumptions(default_assumptions_path()), 2, "0",
                          lambda m, _cfg: {"t": m.iteration_time_s})
    assert "hardware:cpu.memcpy_gb_per_s" in draws.assumptions and "cpu-memcpy" not in draws.assumptions
    assert draws.feasible == 2 and len(draws.values["t"]) == 2


# ----------------------------------------------------------------------------- offsim --help
def test_the_help_wraps_each_description_at_the_terminal_not_at_the_source_line() -> None:
    """Typer's rich mode keeps a single line break where the source wrote one, so a description
    written over several lines ended help lines mid-sentence ('... the lower bound' / 'any policy
    must move'). Now every line of a description but its last is filled to the panel's width,
    less at most one word (20 characters here)."""
    import os
    import subprocess
    import sys

    code = "from offsim.cli import app\ntry:\n    app(['--help'])\nexcept SystemExit:\n    pass"
    for width in (80, 100, 140):
        text = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120,
                              env={**os.environ, "COLUMNS": str(width)}).stdout
        panel = text[text.index("Commands"):].splitlines()[1:-1]
        rows: list[list[str]] = []
        for line in panel:
            if line[2] != " ":  # a command's first line
                rows.append([])
            rows[-1].append(line.rstrip().removesuffix("│").rstrip())  # where the text ends
        for row in rows:
            short = [b for b in row[:-1] if len(b) < width - 2 - 22]  # a long word ('latency/bandwidth') may wrap
            assert not short, (width, row)
        exit_status = text[text.index("Exit status"):text.index("Options")].splitlines()[:-2]
        assert all(len(ln.rstrip()) >= width - 22 for ln in exit_status[:-1]), exit_status
