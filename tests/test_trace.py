"""The Chrome / Perfetto trace: structure, lanes, counters, and spans inside their iteration."""

from __future__ import annotations

import itertools
import json
from collections import defaultdict
from pathlib import Path

import pytest

from offsim import make_run_config, simulate
from offsim.report.chrome_trace import PHASE_TID, write_chrome_trace
from offsim.report.tracks import LINKS, RESOURCE_LABELS, assign_lanes, link_rate_steps
from offsim.results import RunResult
from offsim.trace import Span

ROUNDING_US = 0.002  # the trace rounds times to the nanosecond


@pytest.fixture(scope="module", params=["zero-offload", "zero-offload-dpu", "zero-infinity-nvme"])
def run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[RunResult, dict]:
    """A tiny run and its trace, read back from the file."""
    result = simulate(make_run_config("tiny", "tiny", request.param))
    path = write_chrome_trace(result, tmp_path_factory.mktemp("trace") / "trace.json")
    return result, json.loads(Path(path).read_text())


def slices(trace: dict) -> list[dict]:
    return [e for e in trace["traceEvents"] if e["ph"] == "X"]


def thread_names(trace: dict) -> dict[int, str]:
    return {e["tid"]: e["args"]["name"] for e in trace["traceEvents"] if e.get("name") == "thread_name"}


def test_trace_has_the_trace_event_format(run: tuple[RunResult, dict]) -> None:
    result, trace = run
    assert trace["displayTimeUnit"] == "ms"
    assert {"hardware", "workload", "strategy", "iteration_time_s", "bottleneck"} <= trace["otherData"].keys()
    assert {e["ph"] for e in trace["traceEvents"]} == {"M", "X", "C"}
    for e in trace["traceEvents"]:
        assert isinstance(e["pid"], int) and isinstance(e["name"], str)
        if e["ph"] == "X":
            assert isinstance(e["tid"], int) and e["ts"] >= 0 and e["dur"] >= 0
        if e["ph"] == "C":
            assert e["ts"] >= 0 and len(e["args"]) == 1
            assert all(isinstance(v, float | int) and v >= 0 for v in e["args"].values())
    on_resources = [e for e in slices(trace) if e["tid"] != PHASE_TID]
    assert len(on_resources) == len(result.recorder.spans.window())


def test_every_track_is_named_and_resources_have_their_own(run: tuple[RunResult, dict]) -> None:
    result, trace = run
    names = thread_names(trace)
    assert {e["tid"] for e in slices(trace)} <= names.keys()
    assert names[PHASE_TID] == "Iterations / phases"
    assert {"GPU compute", "PCIe H2D", "PCIe D2H", "CPU optimizer"} <= set(names.values())
    if result.config.strategy.uses_nvme():
        assert {"NVMe read", "NVMe write"} <= set(names.values())


def test_slices_on_one_track_never_overlap(run: tuple[RunResult, dict]) -> None:
    """Resource lanes hold disjoint slices; on the phase track, phases nest inside iterations."""
    _, trace = run
    by_tid: dict[int, list[dict]] = defaultdict(list)
    for e in slices(trace):
        by_tid[e["tid"]].append(e)
    for tid, events in by_tid.items():
        if tid == PHASE_TID:
            continue
        events.sort(key=lambda e: e["ts"])
        for a, b in itertools.pairwise(events):
            assert b["ts"] >= a["ts"] + a["dur"] - ROUNDING_US, (tid, a["name"], b["name"])
    iterations = {e["args"]["iteration"]: e for e in by_tid[PHASE_TID] if e["cat"] == "iteration"}
    for phase in (e for e in by_tid[PHASE_TID] if e["cat"] == "phase"):
        it = iterations[phase["args"]["iteration"]]
        assert it["ts"] - ROUNDING_US <= phase["ts"]
        assert phase["ts"] + phase["dur"] <= it["ts"] + it["dur"] + ROUNDING_US


def test_every_span_lies_inside_its_iteration(run: tuple[RunResult, dict]) -> None:
    """With the delayed parameter update, iteration i's optimizer step and the gradient copies it
    waits for overlap iteration i+1 (ZeRO-Offload DPU), so they lie inside i and i+1."""
    result, trace = run
    iterations = sorted((e for e in slices(trace) if e["cat"] == "iteration"), key=lambda e: e["ts"])
    assert [e["args"]["iteration"] for e in iterations] == list(range(result.config.iterations))
    bounds = [(e["ts"], e["ts"] + e["dur"]) for e in iterations]
    overlap = 1 if result.config.strategy.delayed_param_update else 0
    for e in slices(trace):
        if e["tid"] == PHASE_TID:
            continue
        k = e["args"]["iteration"]
        start, end = bounds[k][0], bounds[min(k + overlap, len(bounds) - 1)][1]
        assert start - ROUNDING_US <= e["ts"], e["name"]
        assert e["ts"] + e["dur"] <= end + ROUNDING_US, e["name"]


def test_counters_track_memory_per_tier_and_throughput_per_link(run: tuple[RunResult, dict]) -> None:
    result, trace = run
    series: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for e in trace["traceEvents"]:
        if e["ph"] == "C":
            series[e["name"]].append((e["ts"], next(iter(e["args"].values()))))
    gpu = series["GPU memory (per GPU), GiB"]
    assert max(v for _, v in gpu) == pytest.approx(result.metrics.peak_bytes.gpu / 2**30, abs=1e-5)
    assert "Host DRAM, pinned included (per node), GiB" in series
    for link, label in (("h2d", "PCIe H2D"), ("d2h", "PCIe D2H"), ("nvme_read", "NVMe read")):
        moved = getattr(result.metrics.traffic_bytes, link) > 0
        assert (f"{label}, GB/s" in series) == moved
        if moved:
            points = series[f"{label}, GB/s"]
            assert points[-1][1] == 0.0  # every transfer ends
            assert [t for t, _ in points] == sorted({t for t, _ in points})


def test_span_names_carry_layer_tensor_and_phase(run: tuple[RunResult, dict]) -> None:
    """A gradient offload's copies, on the link tracks, are named by layer, tensor and phase and
    carry their bytes and rate; its GPU kernels are DeepSpeed ZeRO-3's boundary fp64 norms
    (6343d29; stage3.py ``partition_grads`` -> ``_constant_buffered_norm2``), on the GPU compute
    track, named by layer, tensor and phase, moving nothing over a link: one per reduce bucket per
    iteration (tiny: one bucket, flushed at the embedding), none on the ZeRO-2 paths."""
    result, trace = run
    names = thread_names(trace)
    grads = [e for e in slices(trace) if e["cat"] == "grad_offload"]
    links = {RESOURCE_LABELS[r] for r in LINKS}
    moves = [e for e in grads if names[e["tid"]].split(" #")[0] in links]
    kernels = [e for e in grads if e not in moves]
    assert moves and all(e["name"].endswith("grads (backward)") for e in moves)
    assert all("MB" in e["args"] and "GB/s" in e["args"] for e in moves)
    assert all(names[e["tid"]].startswith("GPU compute") for e in kernels)
    assert all(e["name"] == "embed gradient norms (fp64) (backward)" and e["args"]["phase"] == "backward"
               and e["args"]["layer"] == 0 and "MB" not in e["args"] for e in kernels)
    zero3 = result.config.strategy.zero_stage == 3
    assert len(kernels) == (result.config.iterations if zero3 else 0)


def test_lanes_are_assigned_greedily_per_resource() -> None:
    spans = [Span(0, "forward", "h2d", "param_fetch", "a", 0, 0.0, 2.0),
             Span(0, "forward", "h2d", "param_fetch", "b", 1, 1.0, 3.0),
             Span(0, "forward", "h2d", "param_fetch", "c", 2, 2.0, 4.0),
             Span(0, "forward", "d2h", "grad_offload", "d", 0, 1.5, 2.5),
             Span(0, "forward", "h2d", "param_fetch", "e", 3, 2.5, 3.5)]
    assert assign_lanes(spans) == [0, 1, 0, 0, 2]


def test_link_throughput_adds_concurrent_spans() -> None:
    spans = [Span(0, "forward", "h2d", "param_fetch", "a", 0, 0.0, 2.0, 2e9),
             Span(0, "forward", "h2d", "param_fetch", "b", 1, 1.0, 3.0, 4e9),
             Span(0, "forward", "d2h", "grad_offload", "c", 0, 0.0, 1.0, 9e9)]
    assert link_rate_steps(spans, "h2d") == [(0.0, 1e9), (1.0, 3e9), (2.0, 2e9), (3.0, 0.0)]


def test_a_long_run_traces_what_was_simulated(tmp_path: Path) -> None:
    """The steady-state shortcut skipped iterations: the trace holds the spans simulated, says
    how many it left out, and still shows every iteration."""
    result = simulate(make_run_config("tiny", "tiny", "zero-infinity-nvme", iterations=20))
    held = result.recorder.spans.window()
    assert len(held) < len(result.recorder.spans) / 4
    trace = json.loads(Path(write_chrome_trace(result, tmp_path / "trace.json")).read_text())
    assert len([e for e in slices(trace) if e["tid"] != PHASE_TID]) == len(held)
    assert f"{len(held):,} of {len(result.recorder.spans):,} spans shown" in trace["otherData"]["window"]
    assert len([e for e in slices(trace) if e["cat"] == "iteration"]) == 20
