"""plotly figures built from a run's DataFrames (offsim.report.figures)."""

from __future__ import annotations

from pathlib import Path

import plotly.graph_objects as go
import pytest

from offsim import make_run_config, simulate
from offsim.report import figures
from offsim.results import RunResult


@pytest.fixture(scope="module")
def offload() -> RunResult:
    return simulate(make_run_config("tiny", "tiny", "zero-offload"))


@pytest.fixture(scope="module")
def nvme() -> RunResult:
    return simulate(make_run_config("tiny", "tiny", "zero-infinity-nvme"))


@pytest.fixture(scope="module")
def infeasible() -> RunResult:
    result = simulate(make_run_config("tiny", "llama2-70b", "gpu-only"))
    assert not result.feasible
    return result


def bars(fig: go.Figure) -> list[go.Bar]:
    return [t for t in fig.data if isinstance(t, go.Bar)]


def test_timeline_has_one_bar_per_span_on_resource_rows(nvme: RunResult) -> None:
    fig = figures.timeline_figure(nvme)
    spans = nvme.spans()
    assert sum(len(b.x) for b in bars(fig)) == len(spans)
    assert {b.name for b in bars(fig)} >= {"forward", "backward", "parameter fetches", "Adam step"}
    rows = list(fig.layout.yaxis.categoryarray)
    assert rows[-1] == "GPU compute"  # drawn top-down: GPU first
    assert {"GPU waiting", "PCIe H2D", "NVMe read", "NVMe write", "CPU optimizer"} <= set(rows)
    starts = sorted(x for b in bars(fig) for x in b.base)
    assert starts == pytest.approx(sorted(spans["start_s"]))
    phases = [s for s in fig.layout.shapes if s.type == "rect"]
    assert len(phases) == len(nvme.recorder.phases)


def test_memory_has_a_panel_per_tier_peaking_at_the_metrics_peak(nvme: RunResult) -> None:
    fig = figures.memory_figure(nvme)
    lines = [t for t in fig.data if t.x and t.x[0] is not None]
    assert [t.name for t in lines] == ["gpu", "host_pinned", "host", "nvme"]
    for trace in lines:
        peak = getattr(nvme.metrics.peak_bytes, trace.name) / 2**30
        assert max(trace.y) == pytest.approx(peak)
        assert trace.x[-1] == pytest.approx(nvme.recorder.end_s)


def test_link_throughput_integrates_to_the_bytes_moved(nvme: RunResult) -> None:
    fig = figures.link_figure(nvme)
    lines = {t.name: t for t in fig.data if t.x and t.x[0] is not None}
    spans = nvme.spans()
    for link, label in (("h2d", "PCIe H2D"), ("d2h", "PCIe D2H"), ("nvme_read", "NVMe read"),
                        ("nvme_write", "NVMe write")):
        t, rate = lines[label].x, lines[label].y
        moved_gb = sum((t[i + 1] - t[i]) * rate[i] for i in range(len(t) - 1))
        assert moved_gb == pytest.approx(spans.loc[spans["resource"] == link, "bytes"].sum() / 1e9)
    assert "GPU-GPU link" not in lines  # nothing moved on it


def _step_stall_s(result: RunResult) -> float:
    """Seconds per steady iteration the GPU waits outside any layer (for the optimizer step)."""
    spans = result.spans()
    steady = [k for k, _, _ in figures.steady_windows(result)]
    step = spans[(spans.resource == "gpu_stall") & (spans.layer < 0) & spans.iteration.isin(steady)]
    assert set(step.phase) <= {"optimizer"}
    return float((step.end_s - step.start_s).sum()) / len(steady)


def test_stall_table_adds_up_to_the_metrics(nvme: RunResult, offload: RunResult) -> None:
    table = figures.stall_table(nvme)
    m = nvme.metrics
    assert table["layer"].tolist() == list(range(len(table)))
    # the table is per layer; the GPU waiting for the optimizer step belongs to no layer
    step_stall_s = _step_stall_s(nvme)
    assert step_stall_s > 0
    layers_stall_s = m.stall_s - step_stall_s
    assert table["stall_s"].sum() == pytest.approx(layers_stall_s)
    assert table["stall_share"].sum() == pytest.approx(layers_stall_s / m.iteration_time_s)
    compute_s = (table["forward_s"] + table["backward_s"]).sum()
    assert compute_s == pytest.approx(m.gpu_busy_fraction * m.iteration_time_s)
    causes = [c for c in table.columns if c.startswith("stall_") and c not in ("stall_s", "stall_share")]
    assert table[causes].to_numpy().sum() == pytest.approx(layers_stall_s)  # every stall has its cause
    assert table["stall_params_s"].sum() > 0
    assert table["name"].iloc[1] == "block0"
    expected_s = offload.metrics.stall_s - _step_stall_s(offload)
    assert figures.stall_table(offload)["stall_s"].sum() == pytest.approx(expected_s)
    fig = figures.stall_table_figure(table)
    assert isinstance(fig.data[0], go.Table)
    assert "waiting for params (ms)" in fig.data[0].header.values


def test_comparison_figures(nvme: RunResult, offload: RunResult, infeasible: RunResult) -> None:
    runs = [offload, nvme, infeasible]
    labels = ["zero-offload / tiny", "zero-infinity-nvme / tiny", "gpu-only / llama2-70b"]
    assert figures.run_labels(runs) == labels
    breakdown = figures.breakdown_figure(runs)
    totals = [sum(b.x[k] for b in bars(breakdown)) for k in range(2)]
    assert totals == pytest.approx([offload.metrics.iteration_time_s, nvme.metrics.iteration_time_s])
    assert list(bars(breakdown)[0].y) == ["zero-offload / tiny", "zero-infinity-nvme / tiny"]
    memory = figures.memory_compare_figure(runs)
    assert [t.name for t in memory.data] == ["zero-offload / tiny", "zero-infinity-nvme / tiny"]
    assert memory.data[1].x[-1] == pytest.approx(nvme.metrics.iteration_time_s)
    links = figures.link_compare_figure(runs)
    assert len(links.data) == 4  # H2D and D2H for each feasible run


def test_an_infeasible_run_gives_empty_figures(infeasible: RunResult) -> None:
    for fig in figures.run_figures(infeasible).values():
        assert isinstance(fig, go.Figure)
    assert "gpu memory" in figures.timeline_figure(infeasible).layout.annotations[0].text


def test_figures_export_as_standalone_html(offload: RunResult, tmp_path: Path) -> None:
    paths = figures.write_figures(offload, tmp_path / "figs")
    assert [p.name for p in paths] == ["timeline.html", "memory.html", "links.html", "stalls.html"]
    text = paths[0].read_text()
    assert text.lower().startswith("<!doctype html>") and "plotly-graph-div" in text
    assert 'src="https://cdn' not in text  # plotly.js is inlined, no network needed
    assert len(text) > 1_000_000
