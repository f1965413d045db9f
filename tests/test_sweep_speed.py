"""The sweep's shortcuts (issue 16) change no result: a sweep's rows are the same to the last bit
with every shortcut on and with every one off.

The shortcuts: runs handed out again (:mod:`offsim.engine.reuse`), compiles shared by equal
compositions (:meth:`offsim.engine.reuse.RunMemo.compiled`), the schedule's fingerprint hashed
once (:attr:`offsim.schedule.ops.Schedule.fingerprint`), time bounds kept per schedule and
machine (:func:`offsim.schedule.bound.iteration_work`), span sums kept with the spans
(:func:`offsim.metrics._span_sums`) and one composition per point where the strategy's
measurement window is known (:func:`offsim.systems._registry.compose_measured`); one composition per
distinct composition input (:mod:`offsim.sweep.compose_memo`).
"""

from __future__ import annotations

import pickle
from typing import Any

import pytest

import offsim.systems._registry as registry
from offsim import make_run_config
from offsim.engine import reuse
from offsim.metrics import _span_sums, summarize
from offsim.plan.footprint import state_sizes
from offsim.schedule import bound
from offsim.simulation import compose_run, run_schedule
from offsim.sweep import compose_memo
from offsim.sweep.evaluate import Payload, run_chunk
from offsim.sweep.spec import make_plan
from offsim.systems._compile import compile_system

#: a few hundred points of the 7B grid of benchmarks/sweep_throughput.py (every strategy, and
#: axes some strategies never read, so that runs, compiles and bounds are shared)
GRID = {
    "strategy": ["zero-offload", "zero-offload-dpu", "zero-infinity-cpu", "zero-infinity-nvme"],
    "dram_gib": [128, 384, 768],
    "nvme_drives": [1, 4],
    "pcie_gen": [3, 5],
    "prefetch_depth": [1, 4],
    "micro_batch": [1, 2],
    "seq_len": [1024, 4096],
}


class _Forgets(dict):  # type: ignore[type-arg]
    """A memo that never holds anything (the shortcut off)."""

    def get(self, key: Any, default: Any = None) -> Any:
        return default


def _rows(plan: Any, shortcuts: bool, monkeypatch: pytest.MonkeyPatch) -> tuple[list[dict[str, Any]], Any, Any]:
    payload = Payload.from_plan(plan, prefilter=True)
    items = [(p.index, p.point_id, p.overrides) for p in plan.points]
    with monkeypatch.context() as m:
        m.setattr(bound, "_MEMO", bound._MEMO.__class__() if shortcuts else _Forgets())
        m.setattr(registry, "_WINDOWS", {} if shortcuts else _Forgets())
        m.setattr(reuse, "_PROCESS", None)
        if not shortcuts:
            return run_chunk(payload, items), None, None
        with reuse.reusing(reuse.RunMemo()) as memo:
            return run_chunk(payload, items), memo, compose_memo.memo_for(memo)


@pytest.mark.slow
def test_a_sweep_gives_the_same_rows_with_its_shortcuts_on_and_off(monkeypatch: pytest.MonkeyPatch) -> None:
    plan = make_plan("rtx4090-pcie4-ws", "llama2-7b", "zero-offload", grid=GRID, name="speed")
    assert len(plan.points) == 384
    slow, _, _ = _rows(plan, False, monkeypatch)
    fast, memo, composed = _rows(plan, True, monkeypatch)
    # the shortcuts were taken (a composition handed out again brings its compile with it)
    assert memo.hits > 100 and memo.compiles_saved + composed.hits > 100 and composed.hits > 100
    statuses = {r["status"] for r in slow}
    assert statuses == {"ok", "infeasible"}, statuses
    for a, b in zip(slow, fast, strict=True):
        a.pop("wall_s"), b.pop("wall_s")
        assert a == b, a["point_id"]


def test_a_schedule_is_fingerprinted_once_and_equal_schedules_have_equal_fingerprints() -> None:
    point = compose_run(make_run_config("tiny", "tiny", "zero-infinity-nvme"))
    a, b = compile_system(point.system), compile_system(point.system)
    assert a is not b and a.fingerprint == b.fingerprint and hash(a.fingerprint) == hash(b.fingerprint)
    assert a.fingerprint is a.fingerprint  # worked out once, then kept
    copy = pickle.loads(pickle.dumps(a.fingerprint))  # hashed again where unpickled
    assert copy == a.fingerprint and hash(copy) == hash(a.fingerprint)
    other = compose_run(make_run_config("tiny", "tiny", "zero-offload"))
    assert compile_system(other.system).fingerprint != a.fingerprint


def test_equal_compositions_share_one_compile_and_different_ones_do_not() -> None:
    memo = reuse.RunMemo()
    small = compose_run(make_run_config("tiny", "tiny", "zero-infinity-nvme")).system
    again = compose_run(make_run_config("tiny", "tiny", "zero-infinity-nvme")).system
    other = compose_run(make_run_config("tiny", "tiny", "zero-offload")).system
    assert small is not again
    first = memo.compiled(small, compile_system)
    assert memo.compiled(again, compile_system) is first and memo.compiles_saved == 1
    assert memo.compiled(other, compile_system) is not first and memo.compiles_saved == 1
    assert first == compile_system(small)  # what compiling gives


def test_a_strategy_with_a_measurement_window_is_composed_once_when_its_window_is_known(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry, "_WINDOWS", {})
    calls: list[int] = []
    compose = registry.compose

    def counted(cfg: Any, sz: Any = None) -> Any:
        calls.append(cfg.iterations)
        return compose(cfg, sz)

    monkeypatch.setattr(registry, "compose", counted)
    cfg = make_run_config("tiny", "tiny", "zero-offload-dpu", iterations=3, warmup_iterations=1)
    first = registry.compose_measured(cfg)
    assert calls == [3, 4]  # composed, fitted (DPU: one trailing iteration more), composed again
    second = registry.compose_measured(cfg)
    assert calls == [3, 4, 4]  # fitted to the known window, composed once
    assert second[0] == first[0] and second[1] == first[1]


def test_the_span_sums_of_a_run_are_summed_once_until_more_is_recorded() -> None:
    cfg = make_run_config("tiny", "tiny", "zero-offload")
    rec, peaks, _ = run_schedule(cfg, state_sizes(cfg))
    steady = set(cfg.measured_range)
    sums = _span_sums(rec, steady, len(steady))
    assert _span_sums(rec, steady, len(steady)) is sums
    assert summarize(cfg, rec, peaks) == summarize(cfg, rec, peaks)
    rec.spans.append(rec.spans.items[-1])  # more recorded: summed again
    assert _span_sums(rec, steady, len(steady)) is not sums


def _count_bound_work(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """An empty bound memo, and the schedules :func:`bound._iteration_work` is called on."""
    monkeypatch.setattr(bound, "_MEMO", bound._MEMO.__class__())
    calls: list[object] = []
    work = bound._iteration_work

    def counted(*args: Any) -> dict[str, float]:
        calls.append(args[0])
        return work(*args)

    monkeypatch.setattr(bound, "_iteration_work", counted)
    return calls


def test_a_schedule_is_bounded_once_per_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _count_bound_work(monkeypatch)
    point = compose_run(make_run_config("tiny", "tiny", "zero-infinity-nvme")).compiled()
    schedule = point.schedule
    assert schedule is not None
    capacity = {"h2d": 1e10, "d2h": 1e10, "nvme": 1.0, "cpu": 1e9, "dram": 5e10}
    terms = bound.iteration_work(schedule, capacity, 2)
    assert bound.iteration_work(compile_system(point.system), dict(reversed(capacity.items())), 2) == terms
    assert len(calls) == 1  # an equal schedule on the same machine: kept
    slower = bound.iteration_work(schedule, {**capacity, "h2d": 5e9}, 2)
    assert len(calls) == 2 and slower != terms


def test_a_schedule_with_run_time_choices_is_bounded_every_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fingerprint leaves the choices' programs out, so such a schedule is never looked up."""
    calls = _count_bound_work(monkeypatch)
    schedule = compose_run(make_run_config("tiny", "tiny", "deep-optimizer-states")).compiled().schedule
    assert schedule is not None and schedule.choices
    capacity = {"h2d": 1e10, "d2h": 1e10, "cpu": 1e9, "dram": 5e10}
    assert bound.iteration_work(schedule, capacity, 2) == bound.iteration_work(schedule, capacity, 2)
    assert len(calls) == 2 and not bound._MEMO
