"""Running sweeps: the result table, resuming after an interruption, backends, failing points."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

import offsim.sweep.execute as execute
from offsim.errors import ConfigError
from offsim.sweep.execute import run_sweep, write_tables
from offsim.sweep.figures import pareto_front, write_figures
from offsim.sweep.spec import CostAssumptions, load_spec, make_plan
from offsim.sweep.store import ResultStore

ROOT = Path(__file__).resolve().parent.parent
TINY_GRID = ROOT / "sweeps" / "tiny-grid.yaml"


@pytest.fixture(scope="module")
def plan():
    return load_spec(TINY_GRID)


@pytest.fixture(scope="module")
def reference(plan, tmp_path_factory):
    """The uninterrupted table, computed in this process."""
    return run_sweep(plan, tmp_path_factory.mktemp("ref"), workers=1).frame


def test_one_row_per_point_with_axes_metrics_and_costs(plan, reference):
    df = reference
    assert len(df) == 16
    assert list(df["point_index"]) == list(range(16))
    assert list(df.columns[:6]) == [
        "point_index",
        "point_id",
        "dram_gib",
        "nvme_drives",
        "pcie_gen",
        "strategy",
    ]
    for col in (
        "status",
        "feasible",
        "iteration_time_s",
        "tokens_per_s",
        "peak_bytes.gpu",
        "traffic_bytes.h2d",
        "phases_s.forward",
        "time_lower_bound_s",
        "capex_usd",
        "cost_per_million_tokens_usd",
        "energy_per_iteration_j",
    ):
        assert col in df.columns
    ok = df[df["status"] == "ok"]
    bad = df[df["status"] == "infeasible"]
    assert len(ok) == 12
    assert len(bad) == 4  # the NVMe strategy's pinned swap buffers do not fit in 2 GiB
    assert set(bad["strategy"]) == {"zero-infinity-nvme"} and set(bad["dram_gib"]) == {2}
    assert bad["infeasible_reason"].str.startswith("host_pinned memory").all()
    assert (bad["prefilter"] == "infeasible").all()
    # the bound is tight where the compute stream is the critical path (zero-offload on tiny, its
    # gradient copies on that stream): equal up to the order of a float sum, as test_golden allows
    assert (ok["time_lower_bound_s"] <= ok["iteration_time_s"] * (1 + 1e-12)).all()
    assert (ok["cost_per_million_tokens_usd"] > 0).all()


def test_interrupted_and_resumed_sweep_equals_uninterrupted(plan, reference, tmp_path):
    first = run_sweep(plan, tmp_path, workers=1, max_points=5)
    assert (first.new, first.complete) == (5, False)
    assert len(first.frame) == 5
    second = run_sweep(plan, tmp_path, workers=1)
    assert (second.new, second.reused, second.complete) == (11, 5, True)
    pd.testing.assert_frame_equal(second.frame, reference)
    again = run_sweep(plan, tmp_path, workers=2)  # nothing left: no pool is started
    assert again.new == 0
    pd.testing.assert_frame_equal(again.frame, reference)


def test_dominance_waves_make_the_same_decisions_when_resumed(plan, tmp_path, monkeypatch):
    monkeypatch.setattr(execute, "WAVE_POINTS", 4)  # four waves, so earlier waves can prune later ones
    whole = run_sweep(plan, tmp_path / "whole", workers=1).frame
    assert (whole["status"] == "dominated").any()
    dominated = whole[whole["status"] == "dominated"]
    assert dominated["dominated_by"].isin(whole.loc[whole["status"] == "ok", "point_id"]).all()
    assert dominated["iteration_time_s"].isna().all()
    for stop in (3, 6):
        run_sweep(plan, tmp_path / f"cut{stop}", workers=1, max_points=stop)
        resumed = run_sweep(plan, tmp_path / f"cut{stop}", workers=1).frame
        pd.testing.assert_frame_equal(resumed, whole)
    off = run_sweep(plan, tmp_path / "off", workers=1, prefilter=False).frame
    assert not (off["status"] == "dominated").any()
    assert off["prefilter"].isna().all()
    assert (off["status"] == "ok").sum() == 12


def test_process_pool_gives_the_same_table(plan, reference, tmp_path):
    out = run_sweep(plan, tmp_path, workers=2)
    pd.testing.assert_frame_equal(out.frame, reference)


def test_dask_cluster_gives_the_same_table(plan, reference, tmp_path):
    distributed = pytest.importorskip("distributed")
    with (
        distributed.LocalCluster(
            n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None
        ) as cluster,
        distributed.Client(cluster) as client,
    ):
        out = run_sweep(plan, tmp_path, scheduler=client)
    assert out.failed_chunks == 0
    pd.testing.assert_frame_equal(out.frame, reference)


def test_a_failing_point_is_recorded_and_the_sweep_goes_on(tmp_path):
    plan = make_plan(
        "tiny", "tiny", "zero-offload", grid={"strategy.placement.params": ["gpu", "cpu"], "dram_gib": [64]}
    )
    df = run_sweep(plan, tmp_path, workers=1).frame
    assert list(df["status"]) == ["ok", "error"]
    assert "axis 'strategy.placement.params' = 'cpu'" in df.loc[1, "error"]
    assert "needs zero_stage 3" in df.loc[1, "error"]


def test_store_refuses_results_of_another_base(plan, tmp_path):
    run_sweep(plan, tmp_path, workers=1, max_points=2)
    other = make_plan(
        "tiny", "tiny", "zero-offload", grid={"dram_gib": [8]}, cost=CostAssumptions(usd_per_kwh=0.3)
    )
    with pytest.raises(ConfigError, match="different base configuration"):
        run_sweep(other, tmp_path, workers=1)
    with pytest.raises(ConfigError, match="prefilter"):
        run_sweep(plan, tmp_path, workers=1, prefilter=False)
    assert run_sweep(other, tmp_path, workers=1, fresh=True).complete
    with ResultStore(tmp_path) as store:
        assert store.count() == 1


def test_tables_and_figures_are_written(plan, reference, tmp_path):
    files = write_tables(reference, tmp_path)
    assert [f.name for f in files] == ["results.csv", "results.parquet"]
    back = pd.read_parquet(tmp_path / "results.parquet")
    assert len(back) == 16 and list(back.columns) == list(reference.columns)
    figs = write_figures(reference, plan.axis_keys, tmp_path / "figures")
    names = {f.name for f in figs}
    assert "iteration-time-vs-dram-gib.html" in names
    assert "heatmap-dram-gib-nvme-drives.html" in names
    assert "pareto.html" in names
    assert not (tmp_path / "figures" / "plotly.min.js").exists()  # every figure is self-contained
    assert all("<script src=" not in f.read_text() and len(f.read_text()) > 1_000_000 for f in figs)


def test_pareto_front_keeps_points_not_beaten_on_both():
    df = pd.DataFrame({"t": [1.0, 2.0, 3.0, 2.5, 4.0], "c": [5.0, 3.0, 1.0, 4.0, 1.0]})
    assert list(pareto_front(df, "t", "c").index) == [0, 1, 2]


def test_a_lost_chunk_is_not_stored_and_a_rerun_completes_it(plan, reference, tmp_path, monkeypatch):
    real = execute.InlineBackend.run
    calls = {"n": 0}

    def flaky(self, chunks, frontier):
        for items, rows in real(self, chunks, frontier):
            calls["n"] += 1
            yield items, (RuntimeError("worker lost") if calls["n"] == 2 else rows)

    monkeypatch.setattr(execute.InlineBackend, "run", flaky)
    first = run_sweep(plan, tmp_path, workers=1)
    assert first.failed_chunks == 1 and not first.complete
    monkeypatch.setattr(execute.InlineBackend, "run", real)
    second = run_sweep(plan, tmp_path, workers=1)
    assert second.complete and second.new == 16 - len(first.frame)
    pd.testing.assert_frame_equal(second.frame, reference)
