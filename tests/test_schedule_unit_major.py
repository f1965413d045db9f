"""Unit-major ("vertical") order of work (:class:`offsim.systems._compile.WorkOrder`): each unit
of layers runs every micro-batch before the next unit (Harmony's layer packs, msr-fiddle/harmony
task_graph_composor.py; GreedySnake's snake order, arXiv 2512.17570). Checked by hand on the tiny
model with 2 micro-batches: the order of block instances, that parameters are fetched once per
unit visit whatever M is, that per-micro-batch tensors stay distinct, and that the default order
is unchanged."""

from __future__ import annotations

from dataclasses import replace

import pytest

from offsim import load_workload, make_run_config
from offsim.core.enums import OpKind
from offsim.schedule.analysis import check_acyclic, check_allocations, op_instances
from offsim.schedule.ops import Schedule
from offsim.systems._compile import OrderKind, System, WorkOrder, compile_system, mb_sequence, unit_visits
from offsim.systems._registry import compose


def _system(strategy: str, micro_batches: int) -> System:
    wl = load_workload("tiny")
    wl = wl.model_copy(update={"training": wl.training.model_copy(update={"grad_accumulation": micro_batches})})
    return compose(make_run_config("tiny", wl, strategy, iterations=2))


def _visits(sc: Schedule) -> list[tuple[str, int]]:
    """(block name, micro-batch) of every block instance of iteration 1 but its step."""
    return [(i.block.name, i.micro_batch) for i in sc.instances() if i.iteration == 1 and i.micro_batch >= 0]


def test_mb_sequence_snake_reverses_on_odd_visits() -> None:
    assert mb_sequence(3, False, 1) == [0, 1, 2]
    assert mb_sequence(3, True, 0) == [0, 1, 2]
    assert mb_sequence(3, True, 1) == [2, 1, 0]


def test_unit_major_order_by_hand_two_layers_per_unit_two_micro_batches() -> None:
    """Harmony on tiny (n layers, units of 2), M = 2: forward units in order, each for mb 0 then
    mb 1, then backward units in reverse, each for mb 0 then mb 1."""
    sysm = _system("harmony", 2)
    n = sysm.n_layers
    sysm = replace(sysm, order=WorkOrder(OrderKind.UNIT_MAJOR, 2))
    visits = unit_visits(sysm)
    assert len(visits) == 2 * ((n + 1) // 2)
    expected = []
    for v in visits:
        for mb, which in ((0, "first"), (1, "last")):
            names = ", ".join(f"{kind} {layers[0]}-{layers[-1]}" for kind, layers in v)
            expected.append((f"unit {names} ({which} micro-batch)", mb))
    assert _visits(compile_system(sysm)) == expected
    assert visits[0] == (("forward", (0, 1)),)
    assert visits[-1] == (("backward", (1, 0)),)


def test_snake_order_turns_with_the_last_unit_fused() -> None:
    """Snake: the micro-batch order reverses every unit, and the last unit's forward and backward
    are one visit per micro-batch (GreedySnake: forward, loss and backward of the last unit)."""
    sysm = _system("harmony", 2)
    n = sysm.n_layers
    sysm = replace(sysm, order=WorkOrder(OrderKind.UNIT_MAJOR, 1, snake=True))
    visits = unit_visits(sysm)
    assert len(visits) == 2 * n - 1
    assert visits[n - 1] == (("forward", (n - 1,)), ("backward", (n - 1,)))
    mbs = [mb for _, mb in _visits(compile_system(sysm))]
    assert mbs == [m for v in range(2 * n - 1) for m in mb_sequence(2, True, v)]


def _param_accesses_per_iteration(sc: Schedule) -> int:
    return sum(1 for i in op_instances(sc) if i.iteration == 1 and i.op.body.kind is OpKind.ACCESS
               and str(i.op.tag.mechanism) == "param_fetch")


def test_parameters_fetched_once_per_visit_whatever_m() -> None:
    """Unit-major Harmony demands each layer once in forward and once in backward per iteration
    for M = 1, 2, 4; micro-batch-major ZeRO-Infinity demands it M times as often."""
    for m in (1, 2, 4):
        harm = _system("harmony", m)
        assert _param_accesses_per_iteration(compile_system(harm)) == 2 * harm.n_layers
        zi = _system("zero-infinity-cpu", m)
        assert _param_accesses_per_iteration(compile_system(zi)) == 2 * zi.n_layers * m


def test_unit_major_keeps_per_micro_batch_tensors_apart() -> None:
    """With both micro-batches' checkpoints live at once, every Alloc is freed exactly once
    (check_allocations) and the graph is acyclic; the JSON instances name both micro-batches."""
    sc = compile_system(_system("harmony", 2))
    check_acyclic(sc)
    check_allocations(sc)
    assert {i.micro_batch for i in op_instances(sc) if i.iteration == 1 and i.micro_batch >= 0} == {0, 1}


def test_default_order_is_micro_batch_major() -> None:
    sysm = _system("zero-infinity-cpu", 2)
    assert sysm.order == WorkOrder()
    names = [name for name, _ in _visits(compile_system(sysm))]
    assert names == ["micro-batch (first)", "micro-batch (last)"]


def test_unit_major_timeline_by_hand_two_layers_two_micro_batches(tiny_profile, tiny_workload) -> None:
    """tiny (PCIe 1 GB/s each way), two hand-built layers of 5e8 parameters (1 GB in bf16; fwd
    0.25 s, bwd 0.5 s), M = 2, parameters on the CPU, ZeRO-3 with DeepSpeed's gradient path, in
    unit-major order with units of one layer, parameters fetched once per visit and gradients
    summed on the GPU over the visit (:func:`offsim.systems.harmony.unit_major`).

    Forward: L0 fetched [0,1] (the next layer prefetched behind it [1,2]); L0 runs mb 0 [1,1.25]
    and mb 1 [1.25,1.5] on the one fetch; L1 mb 0 [2,2.25], mb 1 [2.25,2.5]. L1 is kept for
    backward (its next use is the next op): mb 0 [2.5,3], mb 1 [3,3.5], while L0, released after
    its forward visit, is fetched again from L1's backward demand [2.5,3.5]; L0 mb 0 [3.5,4], mb 1
    [4,4.5]. So 3 parameter copies per iteration, not 2 x 3. Each layer's summed gradient
    leaves once, after its last micro-batch's backward (not from ZeRO-3's gradient hook inside
    every micro-batch's backward: harmony.unit_major unhooks it), as one micro-batch's would: the
    gradient bytes over PCIe equal those of the same run with M = 1 (the copies' timing is the
    gradient mechanism's, not the order's, and is checked in tests/test_timelines.py).

    The boundary's fp64 norms of each layer's summed gradient (6343d29; stage3.py
    ``partition_grads`` -> ``_constant_buffered_norm2``) run once per visit too, on the GPU's
    reduction stream between the 16-bit round trip's H2D and the fp32 copy down: 5e8 x (2 + 8 + 8
    + 2 + 4) B / tiny's 1000 GB/s HBM = 0.012 s (offsim/systems/_part_grads.py
    ``_boundary_gpu_work``). L1's summed gradient goes down after its last backward [3.5,4.5] and
    back up [4.5,5.5], its norms [5.5,5.512], its fp32 copy (2 GB) [5.512,7.512]; L0's down
    [7.512,8.512], up [8.512,9.512], norms [9.512,9.524]."""
    import dataclasses

    from offsim.config.run import RunConfig
    from offsim.plan.footprint import state_sizes
    from offsim.plan.model import Layer
    from offsim.simulation import run_schedule
    from offsim.systems.harmony import unit_major
    from tests.conftest import strategy
    from tests.test_timelines import PARAMS, STREAMED, _spans

    def run(m: int):  # type: ignore[no-untyped-def]
        wl = tiny_workload.model_copy(update={"training": tiny_workload.training.model_copy(
            update={"grad_accumulation": m})})
        cfg = RunConfig(hardware=tiny_profile, workload=wl, strategy=strategy(**STREAMED), iterations=1,
                        warmup_iterations=0)
        layers = tuple(Layer(i, f"block{i}", PARAMS, 0.0, 0.25, 0.5, 0.0, 0.0) for i in range(2))
        sz = dataclasses.replace(state_sizes(cfg), layers=layers, params_total=2 * PARAMS,
                                 param_bytes=2 * PARAMS * 2.0, grad_bytes=2 * PARAMS * 2.0)
        sysm = unit_major(compose(cfg, sz), 1, acc_bytes=(2 * PARAMS, 2 * PARAMS))
        return run_schedule(cfg, sz, system=sysm)[0]

    def grad_bytes(rec) -> dict[str, float]:  # type: ignore[no-untyped-def]
        out: dict[str, float] = {}
        for sp in rec.spans:
            if sp.resource in ("d2h", "h2d") and sp.name.endswith("grads"):
                out[sp.name] = out.get(sp.name, 0.0) + sp.bytes
        return out

    def compute(rec) -> list[tuple[str, float, float]]:  # type: ignore[no-untyped-def]
        return sorted(_spans(rec, "gpu", "forward") + _spans(rec, "gpu", "backward"), key=lambda sp: sp[1])

    def norms(rec) -> list[tuple[str, float, float]]:  # type: ignore[no-untyped-def]
        return [sp for sp in _spans(rec, "gpu", "grad_offload") if sp[0].endswith("gradient norms (fp64)")]

    rec = run(2)
    assert len(_spans(rec, "gpu")) == len(compute(rec)) + len(norms(rec))
    assert compute(rec) == [
        ("block0 forward", 1.0, 1.25), ("block0 forward", 1.25, 1.5),
        ("block1 forward", 2.0, 2.25), ("block1 forward", 2.25, 2.5),
        ("block1 backward", 2.5, 3.0), ("block1 backward", 3.0, 3.5),
        ("block0 backward", 3.5, 4.0), ("block0 backward", 4.0, 4.5)]
    assert _spans(rec, "h2d", "param_fetch") == [
        ("block0 params", 0.0, 1.0), ("block1 params", 1.0, 2.0), ("block0 params", 2.5, 3.5)]
    # per layer: its 16-bit sum down (1 GB), back up (1 GB), the fp32 copy down (2 GB), once a visit
    assert grad_bytes(rec) == {"block0 grads": 4e9, "block1 grads": 4e9}
    assert grad_bytes(run(1)) == grad_bytes(rec)
    norm_s = PARAMS * (2 + 8 + 8 + 2 + 4) / 1e12
    assert norm_s == pytest.approx(0.012)
    assert norms(rec) == [("block1 gradient norms (fp64)", 5.5, 5.512),
                          ("block0 gradient norms (fp64)", 9.512, 9.524)]
    assert [end - start for _, start, end in norms(run(1))] == pytest.approx([norm_s, norm_s])
