"""The bottleneck sentence: a critical-path walk over hand-built spans (offsim.report.bottleneck)."""

from __future__ import annotations

from typing import Any

import pytest

import offsim.report.bottleneck as bn
from offsim import load_workload, make_run_config, simulate
from offsim.report.bottleneck import bottleneck, find_bottleneck
from offsim.report.tracks import steady_windows
from offsim.trace import Span


def span(resource: str, kind: str, start: float, end: float, layer: int = -1, iteration: int = 0,
         name: str = "") -> Span:
    phase = "optimizer" if kind in ("optimizer", "param_update") else "forward"
    return Span(iteration, phase, resource, kind, name or f"{resource} {kind}", layer, start, end)


def iteration(offset: float = 0.0, iteration: int = 0) -> list[Span]:
    """One 10 s iteration, worked by hand:

    ====  =========================================  ==========================================
    t     GPU                                        links
    ====  =========================================  ==========================================
    0-2   forward layer 0                            NVMe reads layer 1's params from t=1
    2-4   stalls: "block0 waits for params"          NVMe read of layer 1 still running -> NVMe
    4-6   stalls                                     H2D copies layer 1 (ends at 6) -> PCIe H2D;
                                                     a D2H gradient copy also ends at 6 (not the
                                                     layer waited for); an H2D copy of layer 2
                                                     (4.5-5) ends before the GPU resumes
    6-8   backward layer 1
    8-9.5 idle                                       CPU Adam -> CPU optimizer
    9.5-10 idle                                      H2D of updated params -> PCIe H2D
    ====  =========================================  ==========================================
    """
    o, k = offset, iteration
    return [
        span("gpu", "forward", o + 0, o + 2, layer=0, iteration=k),
        span("nvme_read", "param_fetch", o + 1, o + 4, layer=1, iteration=k),
        span("gpu_stall", "stall", o + 2, o + 6, layer=1, iteration=k, name="block0 waits for params"),
        span("h2d", "param_fetch", o + 4, o + 6, layer=1, iteration=k),
        span("d2h", "grad_offload", o + 3, o + 6, layer=0, iteration=k),
        span("h2d", "param_fetch", o + 4.5, o + 5, layer=2, iteration=k),
        span("gpu", "backward", o + 6, o + 8, layer=1, iteration=k),
        span("cpu", "optimizer", o + 8, o + 9.5, iteration=k),
        span("h2d", "param_update", o + 9.5, o + 10, iteration=k),
    ]


def test_waits_are_charged_along_the_critical_path() -> None:
    """Each stretch of GPU idleness goes to the span that released it, then to its predecessor."""
    b = find_bottleneck(iteration(), [(0.0, 10.0)])
    assert b.iteration_s == 10.0
    assert b.gpu_busy_s == 4.0
    assert b.waits_s == {("nvme_read", "param_fetch"): 2.0, ("h2d", "param_fetch"): 2.0,
                         ("cpu", "optimizer"): 1.5, ("h2d", "param_update"): 0.5}
    assert b.unattributed_s == 0.0
    assert b.busy_s == {"gpu": 4.0, "gpu_stall": 4.0, "h2d": 2.5, "d2h": 3.0, "nvme_read": 3.0, "cpu": 1.5}
    assert b.waits_by_resource() == {"h2d": 2.5, "nvme_read": 2.0, "cpu": 1.5}
    assert b.resource == "h2d"
    assert b.sentence == ("The GPU waited on PCIe H2D (parameter fetches) for 25% of the iteration "
                          "(2.5 s of 10 s); on NVMe read (parameter fetches) for 20%; "
                          "GPU compute was busy 40%.")


def test_several_iterations_are_averaged_and_spans_outside_windows_ignored() -> None:
    warmup = [span("cpu", "optimizer", -5.0, -1.0, iteration=-1)]
    spans = warmup + iteration(0.0, 0) + iteration(10.0, 1)
    one = find_bottleneck(iteration(), [(0.0, 10.0)])
    two = find_bottleneck(spans, [(0.0, 10.0), (10.0, 20.0)])
    assert two.waits_s == pytest.approx(one.waits_s)
    assert two.gpu_busy_s == one.gpu_busy_s
    assert two.sentence == one.sentence


def test_idle_with_nothing_moving_is_unattributed() -> None:
    spans = [span("gpu", "forward", 0, 1, layer=0), span("gpu", "forward", 2, 3, layer=1)]
    b = find_bottleneck(spans, [(0.0, 3.0)])
    assert b.unattributed_s == 1.0
    assert b.waits_s == {}
    assert b.resource == "gpu"
    assert b.sentence == "GPU compute is the bottleneck: it was busy 67% of the iteration (2 s of 3 s)."


def test_without_a_span_ending_at_the_resume_the_longest_moving_span_is_charged() -> None:
    spans = [span("gpu", "forward", 0, 2, layer=0), span("gpu", "forward", 3, 4, layer=1),
             span("cpu", "optimizer", 1, 5), span("d2h", "grad_offload", 2.5, 3.5, layer=0)]
    b = find_bottleneck(spans, [(0.0, 4.0)])
    assert b.waits_s == {("cpu", "optimizer"): 1.0}
    assert b.sentence == ("GPU compute is the bottleneck: it was busy 75% of the iteration (3 s of 4 s); "
                          "the longest wait was on CPU optimizer (Adam step), 25%.")


@pytest.mark.parametrize("strategy", ["gpu-only", "zero-offload", "zero-offload-dpu", "zero-infinity-nvme"])
def test_a_simulated_run_is_fully_accounted_for(strategy: str) -> None:
    r = simulate(make_run_config("tiny", "tiny", strategy))
    b = bottleneck(r)
    assert b.iteration_s == pytest.approx(r.metrics.iteration_time_s)
    assert b.gpu_busy_s / b.iteration_s == pytest.approx(r.metrics.gpu_busy_fraction)
    assert b.gpu_busy_s + sum(b.waits_s.values()) + b.unattributed_s == pytest.approx(b.iteration_s)
    assert b.sentence.endswith(".")
    if strategy == "gpu-only":
        assert b.resource == "gpu" and not b.waits_s
    if strategy == "zero-infinity-nvme":  # 0.5 GB/s NVMe writes against 1 GB/s PCIe: storage-bound
        assert b.resource.startswith("nvme")


def _assert_same(fast: Any, full: Any) -> None:
    """The same bottleneck: the sentence and the resource exactly, the seconds to 1e-9."""
    assert fast.sentence == full.sentence
    assert fast.resource == full.resource
    for name in ("iteration_s", "gpu_busy_s", "unattributed_s"):
        assert getattr(fast, name) == pytest.approx(getattr(full, name), rel=1e-9, abs=1e-12), name
    for name in ("waits_s", "busy_s"):
        got, want = getattr(fast, name), getattr(full, name)
        assert got.keys() == want.keys(), name
        assert got == pytest.approx(want, rel=1e-9, abs=1e-12), name


@pytest.mark.parametrize(("strategy", "accumulation"), [("zero-infinity-nvme", 1), ("zero-offload", 1),
                                                         ("zero-infinity-cpu", 20), ("fuyou", 1)])
def test_the_skipped_iterations_are_walked_once(strategy: str, accumulation: int,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """With the steady-state shortcut the spans of the skipped iterations are copies: a window
    that is a copy of one walked takes its terms (issue 16), and the bottleneck is the one a walk
    over every span gives."""
    wl = load_workload("tiny")
    wl = wl.model_copy(update={"training": wl.training.model_copy(update={"grad_accumulation": accumulation})})
    r = simulate(make_run_config("tiny", wl, strategy, iterations=12))
    assert r.recorder.spans.repeats, "the shortcut skipped nothing"
    windows = [(start, end) for _, start, end in steady_windows(r)]
    walked: list[tuple[float, float]] = []
    walk = bn._window_terms

    def counting(spans: Any, window: tuple[float, float], cuts: Any) -> Any:
        walked.append(window)
        return walk(spans, window, cuts)

    monkeypatch.setattr(bn, "_window_terms", counting)
    fast = bottleneck(r)
    assert len(walked) <= 5 < len(windows)  # those before the jump, its first copy, the last
    walked.clear()
    full = find_bottleneck(list(r.recorder.spans), windows)
    assert len(walked) == len(windows)
    _assert_same(fast, full)


def test_windows_that_overlap_are_each_cut_by_the_others() -> None:
    """The windows are walked one by one; a window boundary inside another still cuts it."""
    spans = iteration(0.0, 0) + iteration(10.0, 1)
    b = find_bottleneck(spans, [(0.0, 10.0), (5.0, 15.0), (10.0, 20.0)])
    assert b.iteration_s == 10.0
    assert b.gpu_busy_s + sum(b.waits_s.values()) + b.unattributed_s == pytest.approx(b.iteration_s)
