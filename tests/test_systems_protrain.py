"""ProTrain (Yang et al., arXiv 2406.08334): its knob search (offsim.search.protrain), the
``offsim tune`` command, the ``protrain`` preset, and the headline claim against DeepSpeed
ZeRO-3 offload. Searches use the small grid so that the file runs in a few seconds, except
the headline's (the default grid, a few seconds more).
"""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from offsim import load_strategy, make_run_config, simulate
from offsim.cli import app
from offsim.config.strategy import Strategy
from offsim.plan.footprint import state_sizes
from offsim.search import Grid, Knobs, SearchResult, apply_knobs, search

runner = CliRunner()


@pytest.fixture(scope="module")
def tiny_result() -> SearchResult:
    return search("tiny", "tiny", "zero-infinity-cpu", "small")


@pytest.fixture(scope="module")
def rtx_result() -> SearchResult:
    """Llama-2 7B on a 24 GB RTX 4090 workstation, like ProTrain's RTX 3090 testbed."""
    return search("rtx4090-pcie4-ws", "llama2-7b", "zero-infinity-cpu", "small")


def _check_best(result: SearchResult) -> None:
    best = result.best
    assert best.status == "ok" and best.iteration_time_s is not None
    for c in result.candidates:
        if c.status == "ok":
            assert best.iteration_time_s <= c.iteration_time_s
        elif c.status == "pruned":  # its bound already says it cannot be faster
            assert c.lower_bound_s is not None and c.lower_bound_s >= best.iteration_time_s
    if result.base.iteration_time_s is not None:
        assert best.iteration_time_s <= result.base.iteration_time_s


def test_search_returns_the_fastest_feasible_candidate(tiny_result: SearchResult) -> None:
    _check_best(tiny_result)
    assert tiny_result.candidates[0] is tiny_result.base
    assert len(tiny_result.candidates) > 10


def test_simulated_time_is_never_below_the_bound(tiny_result: SearchResult) -> None:
    for c in tiny_result.candidates:
        if c.status == "ok" and c.lower_bound_s is not None:
            assert c.iteration_time_s >= c.lower_bound_s * (1 - 1e-9)


def test_infeasible_candidates_carry_their_reason(rtx_result: SearchResult) -> None:
    _check_best(rtx_result)
    bad = [c for c in rtx_result.candidates if c.status == "infeasible"]
    assert bad, "a 24 GB card cannot hold Llama-2 7B's activations with no recompute and no swap"
    assert all("memory" in c.reason and "GiB" in c.reason for c in bad)
    assert any("optimizer state of the GPU-updated share" in c.reason for c in bad)  # persistent chunks'


def test_a_faster_base_prunes_the_grid() -> None:
    """gpu-only on `tiny` beats every offloaded candidate: the base is kept, and candidates
    whose closed-form bound cannot beat it are pruned with the reason, not simulated."""
    result = search("tiny", "tiny", "gpu-only", Grid((0.0,), (1,), (0.0, 1.0), (False, True)))
    _check_best(result)
    assert result.best is result.base
    pruned = [c for c in result.candidates if c.status == "pruned"]
    assert pruned and all("lower bound" in c.reason for c in pruned)


def test_knobs_map_to_offsim_policies() -> None:
    base = load_strategy("zero-infinity-cpu")
    st = apply_knobs(base, Knobs(3, 2, 1, 2, True), [1.0 * 2**30] * 6)
    pol = st.policies
    assert (pol.eviction.kind, pol.eviction.keep_first) == ("static", 3)
    assert (pol.activations.kind, pol.activations.offload, pol.activations.recompute) == ("per-block", 1, 2)
    assert st.prefetch_depth == 2 and st.optimizer_schedule == "layerwise"
    assert pol.gpu_param_buffer_gib == pytest.approx(6.0)  # 3 persistent + (2 + 1) buffers, all 6 layers
    assert st.sub_group_params == base.sub_group_params


def test_tune_cli_prints_json_and_writes_a_loadable_strategy(tmp_path) -> None:
    out, csv = tmp_path / "tuned.yaml", tmp_path / "cands.csv"
    args = ["tune", "-H", "tiny", "-w", "tiny", "--grid", "small", "--json", "--out", str(out),
            "--csv", str(csv)]
    res = runner.invoke(app, args, catch_exceptions=False)
    assert res.exit_code == 0, res.output
    summary = json.loads(res.output)
    assert summary["speedup"] >= 1.0 and summary["knobs"] is not None
    tuned = load_strategy(str(out))
    m = simulate(make_run_config("tiny", "tiny", tuned)).metrics
    assert m.iteration_time_s == pytest.approx(summary["iteration_time_s"])
    assert csv.read_text().startswith("label,status,reason")
    text = runner.invoke(app, ["tune", "-H", "tiny", "-w", "tiny", "--grid", "small"], catch_exceptions=False)
    assert text.exit_code == 0 and "speedup over base" in text.output


def test_tune_cli_rejects_an_unknown_grid() -> None:
    res = runner.invoke(app, ["tune", "--grid", "huge"])
    assert res.exit_code != 0 and "small, default" in res.output


def test_protrain_preset_beats_zero3_offload_on_a_4090() -> None:
    """Direction of ProTrain's claim with the fixed preset (arXiv 2406.08334, abstract)."""
    zero3 = simulate(make_run_config("rtx4090-pcie4-ws", "llama2-7b", "zero-infinity-cpu")).metrics
    pt = simulate(make_run_config("rtx4090-pcie4-ws", "llama2-7b", "protrain")).metrics
    assert pt.feasible and zero3.feasible
    assert pt.iteration_time_s < zero3.iteration_time_s


def test_tuned_protrain_is_faster_than_zero3_offload(rtx_result: SearchResult) -> None:
    assert rtx_result.speedup is not None and rtx_result.speedup > 1.0


def _with_gpu_share(preset: str, f: float) -> Strategy:
    return Strategy.model_validate({**load_strategy(preset).model_dump(), "optimizer_gpu_fraction": f})


def test_layerwise_gpu_share_moves_the_first_layers_to_a_gpu_adam() -> None:
    """``optimizer_gpu_fraction`` f with the layer-wise CPU step: the first layers (here the
    preset's 4 persistent ones, f = their share of the parameters) keep their fp32 gradients and
    optimizer state on the GPU. Hand-checkable per iteration: D2H gradients and CPU Adam work are
    x (1 - f); H2D drops by those layers' one fetch of 16-bit params, f x P x 2 B; the GPU peak
    grows by f x P x (12 B fp32 master + moments + 4 B fp32 gradient); one GPU Adam per layer."""
    hw, wl = "rtx4090-pcie4-ws", "llama2-7b"
    layers = state_sizes(make_run_config(hw, wl, "protrain")).layers
    n_params = sum(lay.params for lay in layers)
    f = sum(lay.params for lay in layers[:4]) / n_params
    runs = {}
    for share in (0.0, f):
        res = simulate(make_run_config(hw, wl, _with_gpu_share("protrain", share)))
        spans = res.spans()
        last = spans[spans.iteration == spans.iteration.max()]
        cpu_bytes = last[(last.resource == "cpu") & (last.kind == "optimizer")].bytes.sum()
        gpu_adam = (last.resource == "gpu") & (last.kind == "optimizer") & (last.layer >= 0)
        runs[share] = (res.metrics, cpu_bytes, last[gpu_adam])
    (m0, cpu0, _), (m1, cpu1, adam) = runs[0.0], runs[f]
    assert m1.traffic_bytes.d2h == pytest.approx((1 - f) * m0.traffic_bytes.d2h, rel=1e-9)
    assert cpu1 == pytest.approx((1 - f) * cpu0, rel=1e-9)
    assert m0.traffic_bytes.h2d - m1.traffic_bytes.h2d == pytest.approx(f * n_params * 2, rel=1e-9)
    assert m1.peak_bytes.gpu - m0.peak_bytes.gpu == pytest.approx(f * n_params * 16, rel=0.01)
    assert sorted(adam.layer) == [lay.index for lay in layers[:4]]  # one GPU Adam per GPU-resident layer
    assert m1.iteration_time_s < m0.iteration_time_s


def test_layerwise_gpu_share_refuses_the_perf_model_split() -> None:
    with pytest.raises(ValueError, match="perf-model"):
        Strategy.model_validate({**_with_gpu_share("protrain", 0.1).model_dump(),
                                 "optimizer_split": "perf-model"})


def test_search_puts_the_persistent_chunks_state_on_the_gpu() -> None:
    st = apply_knobs(load_strategy("zero-infinity-cpu"), Knobs(2, 1, 0, 0, True), [1.0, 3.0, 2.0, 2.0])
    assert st.optimizer_gpu_fraction == pytest.approx(0.5)  # (1 + 3) of 8
    every = apply_knobs(load_strategy("zero-infinity-cpu"), Knobs(4, 1, 0, 0, False), [1.0, 3.0, 2.0, 2.0])
    assert every.optimizer_gpu_fraction == pytest.approx(0.75)  # all but the last layer


@pytest.fixture(scope="module")
def rtx_default_result() -> SearchResult:
    """The default grid: its 12.5% persistent layers fit their GPU-resident state in 24 GB."""
    return search("rtx4090-pcie4-ws", "llama2-7b", "zero-infinity-cpu", "default")


def test_gpu_adam_of_persistent_chunks_beats_the_cpu_only_search(rtx_result: SearchResult,
                                                                 rtx_default_result: SearchResult) -> None:
    best = rtx_default_result.best
    assert best.knobs is not None and best.knobs.persistent_layers > 0
    assert best.strategy.optimizer_gpu_fraction > 0
    assert rtx_default_result.speedup > rtx_result.speedup


def test_protrain_headline_speedup_over_zero3_offload(rtx_default_result: SearchResult) -> None:
    """ProTrain (arXiv 2406.08334, abstract): 1.43x-2.71x the throughput of DeepSpeed and other
    systems. offsim's default-grid search on a 24 GB RTX 4090, Llama-2 7B: 1.85x (6.47 s ZeRO-3
    offload -> 3.49 s, measured 2026-11-25 after DeepSpeed's ZeRO-3 path became more faithful,
    4bcfd6d-5ac1e20; 1.95x from 6.80 s when last recorded; 4 persistent layers updated by a GPU Adam (11% of
    the optimizer state), prefetch 4, 24 of 32 blocks recomputed, the CPU step overlapped with
    backward). Held to the paper's range, 1.43x-2.71x. Before DeepSpeed's unscale and cast passes
    around CPU Adam were scheduled (deepspeed_runtime.md section 11 step 4), the baseline was 4.44 s
    and the gain 1.27x, a strict expected failure. The paper's models and baselines were not read."""
    assert 1.43 <= rtx_default_result.speedup <= 2.71
