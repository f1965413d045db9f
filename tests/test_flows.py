"""Hand-computed timelines of the flow network (SimPy + max-min fair sharing).

The `tiny` profile has 1 GB/s pinned PCIe per direction with zero latency, so a 1 GB (1e9 B)
copy alone takes exactly 1 s.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import simpy
from hypothesis import given, settings
from hypothesis import strategies as hs

from offsim.config.run import make_run_config
from offsim.core.enums import Activity, MechanismId, Phase
from offsim.engine.execute import Executor
from offsim.engine.flows import Flow, fair_rates, max_min_rates
from offsim.plan.footprint import state_sizes
from offsim.plan.paths import Paths, resource_capacities
from offsim.schedule.ops import Block, Delay, Op, Repeat, Schedule, Tag
from offsim.schedule.ops import Flow as FlowOp
from offsim.simulation import machine
from offsim.trace import Recorder

GB = 1e9


def _paths(profile: str = "tiny", strategy: str = "zero-infinity-cpu") -> Paths:
    """The flows of ``profile`` (NVMe writes at 0.5 GB/s)."""
    cfg = make_run_config(profile, "tiny", strategy)
    sz = state_sizes(cfg)
    return Paths(cfg, resource_capacities(cfg, sz.ranks_per_node, sz.dp), 0.5 * GB)


def _run(paths: Paths, *flows: tuple[str, FlowOp, float], copy_engines: int | None = None) -> list:
    """Run named flows, each after its delay (seconds), on the executor; returns
    (name, start, end) of each flow's span."""
    ops: list[Op] = []
    for name, flow, delay in flows:
        after: tuple[int, ...] = ()
        if delay > 0:
            ops.append(Op(len(ops), Delay(delay), Tag(Activity.FORWARD, MechanismId.COMPUTE, Phase.FORWARD)))
            after = (len(ops) - 1,)
        ops.append(Op(len(ops), flow, Tag(Activity.PARAM_FETCH, MechanismId.PARAM_FETCH, Phase.FORWARD,
                                          label=name), after=after))
    schedule = Schedule((Repeat("iteration", 1, (Block("flows", tuple(ops)),)),))
    m = machine(paths.cfg, state_sizes(paths.cfg))
    if copy_engines is not None:
        m = dataclasses.replace(m, copy_engines=copy_engines)
    rec = Recorder()
    Executor(schedule, m, {}, rec).run()
    return [(s.name, s.start_s, s.end_s) for s in rec.spans if s.kind == str(Activity.PARAM_FETCH)]


def test_one_transfer_takes_bytes_over_bandwidth() -> None:
    p = _paths()
    assert _run(p, ("a", p.dma(True, int(GB)), 0.0)) == [("a", 0.0, pytest.approx(1.0))]


def test_two_flows_on_one_link_each_get_half() -> None:
    """Two 1 GB H2D copies started together share 1 GB/s: both end at 2 s."""
    p = _paths()
    done = _run(p, ("a", p.dma(True, int(GB)), 0.0), ("b", p.dma(True, int(GB)), 0.0))
    assert sorted(done) == [("a", 0.0, pytest.approx(2.0)), ("b", 0.0, pytest.approx(2.0))]


def test_late_flow_shares_then_runs_alone() -> None:
    """a starts at 0, b at 0.5 s. a has 0.5 GB left at 0.5 s and gets half the link, so it ends
    at 1.5 s; b then has 0.5 GB left, alone at 1 GB/s, and ends at 2.0 s."""
    p = _paths()
    done = _run(p, ("a", p.dma(True, int(GB)), 0.0), ("b", p.dma(True, int(GB)), 0.5))
    assert dict((n, e) for n, _, e in done) == {"a": pytest.approx(1.5), "b": pytest.approx(2.0)}


def test_h2d_and_d2h_run_at_full_rate_together() -> None:
    p = _paths()
    done = _run(p, ("up", p.dma(True, int(GB)), 0.0), ("down", p.dma(False, int(GB)), 0.0))
    assert sorted(done) == [("down", 0.0, pytest.approx(1.0)), ("up", 0.0, pytest.approx(1.0))]


def test_pageable_copy_is_capped_by_its_curve() -> None:
    """tiny's pageable rate is 0.5 GB/s: 1 GB takes 2 s, and it stages through host memcpy."""
    p = _paths()
    assert _run(p, ("p", p.dma(True, int(GB), pinned=False), 0.0)) == [("p", 0.0, pytest.approx(2.0))]


def test_nvme_reads_and_writes_share_the_drive() -> None:
    """tiny's drive reads at 1 GB/s and writes at 0.5 GB/s, so a byte read costs 1 ns of the
    drive's time and a byte written 2 ns. Together, max-min fairness gives both the same byte rate
    r with r*1 + r*2 = 1 GB/s of drive time: r = 1/3 GB/s, and both 0.5 GB flows end at 1.5 s
    (alone they would take 0.5 s and 1 s)."""
    p = _paths("tiny", "zero-infinity-nvme")
    done = _run(p, ("r", p.nvme(True, int(0.5 * GB)), 0.0), ("w", p.nvme(False, int(0.5 * GB)), 0.0))
    assert dict((n, e) for n, _, e in done) == {"r": pytest.approx(1.5), "w": pytest.approx(1.5)}


def test_copy_engines_bound_concurrent_dma() -> None:
    """With one copy engine, a second copy waits for the first instead of sharing the link."""
    p = _paths()
    done = _run(p, ("a", p.dma(True, int(GB)), 0.0), ("b", p.dma(True, int(GB)), 0.0), copy_engines=1)
    assert dict((n, (s, e)) for n, s, e in done) == {
        "a": (0.0, pytest.approx(1.0)), "b": (pytest.approx(1.0), pytest.approx(2.0))}


def test_max_min_fairness_gives_leftover_to_uncapped_flows() -> None:
    """Link of 10: a flow capped at 2 gets 2, the two others split the remaining 8."""
    env = simpy.Environment()
    flows = [Flow(n, 1.0, {"link": 1.0}, cap, env.event(), 0.0) for n, cap in
             (("small", 2.0), ("x", 100.0), ("y", 100.0))]
    rates = max_min_rates(flows, {"link": 10.0})
    assert [rates[f] for f in flows] == [pytest.approx(2.0), pytest.approx(4.0), pytest.approx(4.0)]


def test_max_min_with_two_bottlenecks() -> None:
    """a uses links A (cap 1) and B (cap 10); b uses B only. a is held to 1 by A, b gets 9."""
    env = simpy.Environment()
    a = Flow("a", 1.0, {"A": 1.0, "B": 1.0}, 1e9, env.event(), 0.0)
    b = Flow("b", 1.0, {"B": 1.0}, 1e9, env.event(), 0.0)
    rates = max_min_rates([a, b], {"A": 1.0, "B": 10.0})
    assert (rates[a], rates[b]) == (pytest.approx(1.0), pytest.approx(9.0))


_RESOURCES = ("h2d", "d2h", "dram", "nvme", "cpu", "gpu_link")
#: a usage coefficient: 0 (listed but unused), 1 (a link), or a drive's time per byte, DRAM's
#: bytes touched per byte, a CPU update per byte
_COEFS = hs.sampled_from([0.0, 1.0, 1.0, 2.0, 0.5, 1 / 3, 1e-9, 3.7e-10])
_RATES = hs.one_of(hs.sampled_from([0.0, 1.0, 1e9, 2.5e10, math.inf]),
                   hs.floats(min_value=1e-3, max_value=1e12, allow_nan=False))


@hs.composite
def _flow_sets(draw: hs.DrawFn) -> tuple[list[Flow], dict[str, float]]:
    """1 to 7 flows over a subset of six resources, with ties, zero and infinite caps drawn often."""
    capacity = {r: draw(_RATES.filter(lambda v: v < math.inf)) for r in _RESOURCES}
    env = simpy.Environment()
    flows = []
    for i in range(draw(hs.integers(min_value=1, max_value=7))):
        used = draw(hs.lists(hs.sampled_from(_RESOURCES), max_size=3, unique=True))
        usage = {r: draw(_COEFS) for r in used}
        flows.append(Flow(f"f{i}", 1.0, usage, draw(_RATES.filter(lambda v: v > 0)), env.event(), 0.0))
    return flows, capacity


@settings(max_examples=400, deadline=None)
@given(_flow_sets())
def test_fast_path_gives_the_general_rates(case: tuple[list[Flow], dict[str, float]]) -> None:
    """fair_rates (the network's fast path: one flow in one step, several over the resources they
    use) gives max_min_rates' rates to 1e-12 relative, for every flow."""
    flows, capacity = case
    fast, general = fair_rates(flows, capacity), max_min_rates(flows, capacity)
    assert set(fast) == set(general) == set(flows)
    for f in flows:
        assert fast[f] == pytest.approx(general[f], rel=1e-12, abs=0.0) or fast[f] == general[f]
