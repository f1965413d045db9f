"""A sweep composes once per distinct composition input (:mod:`offsim.sweep.compose_memo`) and
deals the points that differ only in hardware axes to one worker together
(:func:`offsim.sweep.execute._chunks`): every row is the same as without either (issue 16)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs

from offsim import make_run_config
from offsim.engine import reuse
from offsim.engine.reuse import _value
from offsim.simulation import Composed, compose_run
from offsim.sweep import compose_memo
from offsim.sweep.compose_memo import ComposeMemo
from offsim.sweep.evaluate import Payload, run_chunk
from offsim.sweep.execute import GROUP_CHUNK, MAX_CHUNK, _chunks, hardware_axis_keys
from offsim.sweep.spec import make_plan

#: every strategy kind of the benchmark's grid, on axes some compositions read and some do not
GRID = {
    "strategy": ["zero-offload", "zero-infinity-cpu", "zero-infinity-nvme"],
    "dram_gib": [64, 128, 512],
    "nvme_drives": [1, 2],
    "pcie_gen": [3, 4],
    "micro_batch": [1, 2],
}
PLAN = make_plan("rtx4090-pcie4-ws", "tiny", "zero-offload", grid=GRID, name="reuse")
PAYLOAD = Payload.from_plan(PLAN, prefilter=True)


def _rows(items: list[tuple[int, str, dict[str, Any]]], memo: ComposeMemo | None) -> list[dict[str, Any]]:
    if memo is None:  # no run memo active: every point composed, compiled and run
        rows = run_chunk(PAYLOAD, items)
    else:
        runs = reuse.RunMemo()
        compose_memo._BY_RUNS[runs] = memo
        with reuse.reusing(runs):
            rows = run_chunk(PAYLOAD, items)
    for r in rows:
        r.pop("wall_s")
    return rows


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(hs.lists(hs.integers(0, len(PLAN.points) - 1), min_size=2, max_size=24))
def test_every_row_is_the_same_with_and_without_composing_once(picks: list[int]) -> None:
    items = [(PLAN.points[i].index, PLAN.points[i].point_id, PLAN.points[i].overrides) for i in picks]
    memo = ComposeMemo()
    assert _rows(items, memo) == _rows(items, None)
    assert memo.hits + memo.misses == len(items) and memo.unkept == 0


def test_a_point_that_differs_in_what_its_composition_never_read_is_not_composed_again() -> None:
    base = make_run_config("rtx4090-pcie4-ws", "tiny", "zero-offload")
    hw = base.hardware
    more_dram = base.model_copy(update={"hardware": hw.model_copy(update={"dram": hw.dram.model_copy(
        update={"capacity_gib": 2 * hw.dram.capacity_gib})})})
    faster = base.model_copy(update={"hardware": hw.model_copy(update={"gpu": hw.gpu.model_copy(
        update={"hbm_bandwidth_gb_per_s": 2 * hw.gpu.hbm_bandwidth_gb_per_s})})})
    memo = ComposeMemo()
    first = memo.compose(base)
    (shape,) = memo.shapes[next(iter(memo.shapes))]
    assert "gpu.hbm_bandwidth_gb_per_s" in shape.leaves and "dram.capacity_gib" not in shape.leaves
    again = memo.compose(more_dram)
    assert (memo.hits, memo.misses) == (1, 1)
    assert again.system is first.system and again.cfg.hardware is more_dram.hardware
    assert again.cfg == compose_run(more_dram).cfg
    other = memo.compose(faster)  # the composition read the HBM bandwidth: composed anew
    assert (memo.hits, memo.misses) == (1, 2) and other.system is not first.system
    assert _value(other.system) == _value(compose_run(faster).system)


def _fake_compose(read: Any) -> Any:
    """:func:`compose_run` that also keeps what ``read`` gives of the hardware in the composition."""
    def compose(cfg: Any) -> Composed:
        point = compose_run(cfg)
        notes = (*point.system.notes, read(cfg.hardware))
        return dataclasses.replace(point, system=dataclasses.replace(point.system, notes=notes))
    return compose


def test_a_composition_that_keeps_a_hardware_model_is_never_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compose_memo, "compose_run", _fake_compose(lambda hw: hw.gpu))
    cfg = make_run_config("rtx4090-pcie4-ws", "tiny", "zero-offload")
    memo = ComposeMemo()
    memo.compose(cfg), memo.compose(cfg)
    assert (memo.hits, memo.misses, memo.unkept) == (0, 2, 2)


def test_a_model_read_whole_is_compared_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compose_memo, "compose_run", _fake_compose(lambda hw: hw.cpu.model_dump_json()))
    cfg = make_run_config("rtx4090-pcie4-ws", "tiny", "zero-offload")
    hw = cfg.hardware
    other_cpu = cfg.model_copy(update={"hardware": hw.model_copy(update={"cpu": hw.cpu.model_copy(
        update={"sockets": hw.cpu.sockets + 1})})})
    memo = ComposeMemo()
    memo.compose(cfg)
    (shape,) = memo.shapes[next(iter(memo.shapes))]
    assert "cpu" in shape.whole
    memo.compose(cfg), memo.compose(other_cpu)
    assert (memo.hits, memo.misses) == (1, 2)


def test_points_that_differ_only_in_hardware_axes_go_to_one_worker_together() -> None:
    chunks = _chunks(PLAN.points, 1, hardware_axis_keys(PLAN))
    assert sorted(i for c in chunks for i, _, _ in c) == list(range(len(PLAN.points)))
    for c in chunks:  # 3 x 2 x 2 hardware points per strategy and micro-batch, all in one chunk
        assert len(c) == 12 and len({(o["strategy"], o["micro_batch"]) for _, _, o in c}) == 1
    plain = _chunks(PLAN.points, 1)  # no hardware axes named: 16 points at a time, in grid order
    assert [len(c) for c in plain] == [MAX_CHUNK] * 4 + [len(PLAN.points) - 4 * MAX_CHUNK]
    # two workers: a quarter of a worker's share (72 / 8 = 9 points) at once, groups split too
    assert [len(c) for c in _chunks(PLAN.points, 2)] == [9] * 8
    assert [len(c) for c in _chunks(PLAN.points, 2, hardware_axis_keys(PLAN))] == [9, 3] * 6
    assert [i for c in plain for i, _, _ in c] == list(range(len(PLAN.points)))
    big = make_plan("rtx4090-pcie4-ws", "tiny", "zero-offload", grid={"dram_gib": list(range(64, 64 + 1200))})
    assert [len(c) for c in _chunks(big.points, 1, hardware_axis_keys(big))] == [GROUP_CHUNK] * 4 + [176]


def test_the_whole_grid_is_the_same_with_and_without_composing_once() -> None:
    items = [(p.index, p.point_id, p.overrides) for p in PLAN.points]
    memo = ComposeMemo()
    assert _rows(items, memo) == _rows(items, None)
    assert memo.hits >= 24 and memo.unkept == 0  # at least the DRAM sizes share their compositions
