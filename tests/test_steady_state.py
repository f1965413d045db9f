"""The steady-state shortcut (issue 16) gives the metrics of the full simulation.

Each case runs twice, with the shortcut and without it (``run_schedule(..., steady_shortcut=False)``),
and compares the metrics as :func:`offsim.simulate` builds them (the run metrics and the per-cache
statistics): times and other floats to 1e-9 relative, peaks, cache counts and everything else
exactly. The records behind them are compared too, since the trace, the report and ``offsim
compare`` read them: cache events record by record; memory levels at each instant; spans as the
work they record (what, where, how long, how many bytes), since two ops ready on one stream at one
instant may run in either order to rounding (:func:`_spans_as_work`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs

from offsim import load_profile, load_strategy, load_workload, make_run_config
from offsim.api import resolve, simulate
from offsim.cache_stats import cache_stats
from offsim.config.run import RunConfig
from offsim.engine.steady import TIME_TOLERANCE
from offsim.errors import InfeasibleError
from offsim.fit_check import check_fit
from offsim.metrics import steady_iterations, summarize
from offsim.plan.footprint import state_sizes
from offsim.simulation import run_schedule
from offsim.trace import SPAN_COLUMNS as SPAN_FIELDS
from offsim.trace import Recorder
from tests.conftest import small_tiny_workloads

STRATEGIES = sorted(p.stem for p in (Path(__file__).resolve().parent.parent / "strategies").glob("*.yaml"))
REL = 1e-9


def _run(cfg: RunConfig, shortcut: bool) -> tuple[dict[str, Any], Recorder, int] | None:
    """Metrics (run and caches), the recorder and the events of ``cfg``; None if it does not fit."""
    try:
        cfg = resolve(cfg)
        sz = state_sizes(cfg)
        check_fit(cfg, sz)
        rec, peaks, events = run_schedule(cfg, sz, steady_shortcut=shortcut)
    except InfeasibleError:
        return None
    metrics = summarize(cfg, rec, peaks).model_dump()
    metrics["cache"] = {k: v.model_dump() for k, v in cache_stats(rec, steady_iterations(cfg, rec)[0]).items()}
    return metrics, rec, events


def _differences(expected: Any, actual: Any, path: str = "") -> list[str]:
    """Floats to :data:`REL` (exact zeros stay exact), everything else exactly."""
    if isinstance(expected, dict):
        if set(expected) != set(actual):
            return [f"{path}: keys {sorted(expected)} != {sorted(actual)}"]
        return [d for k in expected for d in _differences(expected[k], actual[k], f"{path}/{k}")]
    if isinstance(expected, list | tuple):
        if len(expected) != len(actual):
            return [f"{path}: length {len(expected)} != {len(actual)}"]
        return [d for i, (e, a) in enumerate(zip(expected, actual, strict=True))
                for d in _differences(e, a, f"{path}[{i}]")]
    if isinstance(expected, float) and isinstance(actual, float) and math.isclose(expected, actual, rel_tol=REL):
        return []
    return [] if expected == actual else [f"{path}: {expected!r} != {actual!r}"]


def _records(rec: Recorder) -> list[Any]:
    return [_spans_as_work(list(map(_fields, rec.spans))),
            list(map(_fields, rec.cache_events)), _levels_at_each_instant(list(map(_fields, rec.levels)), rec.end_s),
            sorted(rec.phases), rec.iteration_starts_s, rec.end_s]


def _levels_at_each_instant(levels: list[tuple[Any, ...]], scale_s: float) -> list[tuple[Any, ...]]:
    """Level samples (time, tier, bytes) as recorded, each run of neighbours at the same instant to
    rounding reduced to the last level of each tier there, in tier order: the level from an instant
    on is the last one recorded at it, while the ones before it depend on which simultaneous
    allocation or free SimPy ran first (see :func:`_spans_as_work`)."""
    out: list[tuple[Any, ...]] = []
    group: dict[str, tuple[Any, ...]] = {}
    start = None
    for t, tier, nbytes in levels:
        if start is not None and abs(t - start) > TIME_TOLERANCE * scale_s:
            out += [group[k] for k in sorted(group)]
            group = {}
        if not group:
            start = t
        group[tier] = (start, tier, nbytes)
    return out + [group[k] for k in sorted(group)]


def _spans_as_work(spans: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """Each span as the work it records: its fields with its duration for its start and end,
    sorted. When two ops become ready on one stream at the same instant (to rounding), which runs
    first depends on the last bit of the two times, and a skipped period shifted by whole
    periods may round the other way: the same work in the other order (a Hypothesis-found
    MemAscend case: a head-gradient NVMe read and an embedding-gradient write, both ready at
    4.54596 s). The metrics, the iteration boundaries and the memory levels are compared exactly."""
    start, end = SPAN_FIELDS.index("start_s"), SPAN_FIELDS.index("end_s")
    scale_s = max((s[end] for s in spans), default=0.0)
    work = sorted((*s[:start], s[end] - s[start], *s[end + 1:]) for s in spans)
    return [(*w[:start], _Duration(w[start], scale_s), *w[start + 1:]) for w in work]


@dataclass(frozen=True)
class _Duration:
    """A span's end minus its start: equal when they differ by at most the rounding of times of
    the run's length (the difference of two times of that size carries their rounding)."""

    seconds: float
    scale_s: float

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Duration) and abs(self.seconds - other.seconds) <= 1e-12 * max(self.scale_s, 1.0)

def _fields(record: Any) -> tuple[Any, ...]:
    return tuple(getattr(record, f) for f in record.__slots__)


def assert_same(cfg: RunConfig, *, records: bool = True) -> bool:
    """Shortcut and full simulation agree on ``cfg``; returns whether the shortcut skipped anything."""
    full, fast = _run(cfg, False), _run(cfg, True)
    assert (full is None) == (fast is None)
    if full is None or fast is None:
        return False
    diffs = _differences(full[0], fast[0])
    assert not diffs, "\n".join(diffs[:20])
    # The SimPy event count is no metric, and not exact: it includes the flow network's
    # superseded wake-ups, which do nothing and are no state (offsim.engine.steady), so a skipped
    # period counts those of the period simulated, not its own
    assert abs(full[2] - fast[2]) <= 0.01 * full[2], ("events", full[2], fast[2])
    if records:
        diffs = _differences(_records(full[1]), _records(fast[1]))
        assert not diffs, "\n".join(diffs[:20])
    return len(fast[1].spans.window()) < len(full[1].spans.window())


def _with(workload: str, **training: int) -> Any:
    wl = load_workload(workload)
    return wl.model_copy(update={"training": wl.training.model_copy(update=training)})


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_every_strategy_on_tiny(strategy: str) -> None:
    assert_same(make_run_config("tiny", _with("tiny", grad_accumulation=6), strategy, iterations=7))


@pytest.mark.slow
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_every_strategy_on_a_7b_model(strategy: str) -> None:
    assert_same(make_run_config("rtx4090-pcie4-ws", _with("llama2-7b", grad_accumulation=5), strategy, iterations=6),
                records=False)


def test_the_shortcut_is_taken_where_it_pays() -> None:
    """Iterations of the 175B NVMe case, and the middle micro-batches of gradient accumulation."""
    assert assert_same(make_run_config("dgx2-v100", "gpt3-175b", "zero-infinity-nvme", iterations=8), records=False)
    assert assert_same(make_run_config("rtx4090-pcie4-ws", _with("llama2-7b", grad_accumulation=40), "zero-offload",
                                       iterations=4))


@hs.composite
def configs(draw: Any) -> RunConfig:
    """A random small model, accumulation steps and iterations, on tiny, with a shipped strategy."""
    workload = draw(small_tiny_workloads(9))
    strategy = load_strategy(draw(hs.sampled_from(STRATEGIES)))
    iterations = draw(hs.integers(3, 9))  # a steady iteration even with a delayed update and a warm-up
    return RunConfig(hardware=load_profile("tiny"), workload=workload, strategy=strategy, iterations=iterations,
                     warmup_iterations=draw(hs.integers(0, 1)))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(configs())
def test_random_models_iterations_and_accumulation(cfg: RunConfig) -> None:
    assert_same(cfg)


def test_nested_repeats_with_a_persistent_cache() -> None:
    """Micro-batches skipped inside iterations that are skipped in turn, with the DRAM cache over
    the optimizer state (persistent: its positions run on across iterations)."""
    cfg = make_run_config("tiny", _with("tiny", grad_accumulation=8), "mlp-offload", iterations=9)
    assert assert_same(cfg)


def test_progress_counts_skipped_iterations() -> None:
    """``on_iteration`` reaches the total even where iterations were skipped."""
    cfg = resolve(make_run_config("rtx4090-pcie4-ws", "llama2-7b", "zero-offload", iterations=12))
    calls: list[tuple[int, int]] = []
    rec, _, _ = run_schedule(cfg, state_sizes(cfg), lambda done, total: calls.append((done, total)))
    assert len(rec.spans.window()) < len(rec.spans)  # iterations were skipped
    assert [done for done, _ in calls] == list(range(1, 13))
    assert {total for _, total in calls} == {12}


def test_the_window_holds_what_was_simulated() -> None:
    """A trace of a long run is the size of what was simulated; levels in it stay in time order."""
    cfg = resolve(make_run_config("rtx4090-pcie4-ws", _with("llama2-7b", grad_accumulation=200), "zero-offload"))
    rec, _, _ = run_schedule(cfg, state_sizes(cfg))
    window, every = rec.spans_frame(window=True), rec.spans_frame()
    assert 0 < len(window) < len(every) / 10
    t_s = list(rec.levels_frame(window=True)["t_s"])
    assert t_s == sorted(t_s)
    assert list(rec.levels_frame()["t_s"]) == sorted(rec.levels_frame()["t_s"])


def test_record_log_copies_in_order() -> None:
    """A repeat stands for shifted copies of its template, nested ones inside outer ones, in the
    order a full run records them; ``weighted`` counts the same copies without building them."""
    from offsim.trace import RecordLog, copy_offsets

    log: RecordLog[tuple[int, float]] = RecordLog(lambda x, dt, di: (x[0] + di, x[1] + dt))
    log.append((0, 0.0))
    outer = log.mark()
    log.append((0, 1.0))
    inner = log.mark()
    log.append((0, 2.0))
    log.repeat(inner, 2, 1.0, 0)  # (0, 3.0), (0, 4.0)
    log.append((0, 5.0))
    log.repeat(outer, 1, 10.0, 1)
    log.append((2, 30.0))
    expected = [(0, 0.0), (0, 1.0), (0, 2.0), (0, 3.0), (0, 4.0), (0, 5.0),
                (1, 11.0), (1, 12.0), (1, 13.0), (1, 14.0), (1, 15.0), (2, 30.0)]
    assert list(log) == expected
    assert len(log) == len(expected)
    assert log.window() == [(0, 0.0), (0, 1.0), (0, 2.0), (0, 5.0), (2, 30.0)]
    per_iteration: dict[int, list[float]] = {}
    for item, chain in log.weighted():
        for d, (count, low_s, high_s) in copy_offsets(chain).items():
            got = per_iteration.setdefault(item[0] + d, [0, math.inf, -math.inf])
            got[0] += count
            got[1], got[2] = min(got[1], item[1] + low_s), max(got[2], item[1] + high_s)
    assert per_iteration == {0: [6, 0.0, 5.0], 1: [5, 11.0, 15.0], 2: [1, 30.0, 30.0]}


def test_record_log_runs_cover_every_copy() -> None:
    """``runs`` gives every record as stretches of held items and their shifts, in order."""
    from offsim.trace import RecordLog

    log: RecordLog[tuple[int, float]] = RecordLog(lambda x, dt, di: (x[0] + di, x[1] + dt))
    log.append((0, 0.0))
    outer = log.mark()
    log.append((0, 1.0))
    inner = log.mark()
    log.append((0, 2.0))
    log.repeat(inner, 2, 1.0, 0)
    log.append((0, 5.0))
    log.repeat(outer, 1, 10.0, 1)
    log.append((2, 30.0))
    held = log.window()
    rebuilt = [(x[0] + di, x[1] + dt) for first, last, dt, di in log.runs() for x in held[first:last]]
    assert rebuilt == list(log)


def test_cache_statistics_do_not_depend_on_the_iteration_count() -> None:
    """Past the steady state every cache figure, the offline plan of a persistent cache included
    (planned over the start and the first two steady iterations), is the same for a longer run."""
    from offsim.cache_stats import PERSISTENT_PLAN_ITERATIONS

    short = simulate(make_run_config("tiny", "tiny", "zero-infinity-nvme", iterations=4))
    long = simulate(make_run_config("tiny", "tiny", "zero-infinity-nvme", iterations=12))
    assert PERSISTENT_PLAN_ITERATIONS <= 3
    assert set(short.metrics.cache) == {"gpu_params", "dram_optimizer"}
    for name, c in short.metrics.cache.items():
        assert _differences(c.model_dump(), long.metrics.cache[name].model_dump()) == [], name
