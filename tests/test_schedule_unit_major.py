"""Unit-major ("vertical") order of work (:class:`offsim.systems._compile.WorkOrder`): each unit
of layers runs every micro-batch before the next unit (Harmony's layer packs, msr-fiddle/harmony
task_graph_composor.py; GreedySnake's snake order, arXiv 2512.17570). Checked by hand on the tiny
model with 2 micro-batches: the order of block instances, that parameters are fetched once per
unit visit whatever M is, that per-micro-batch tensors stay distinct, and that the default order
is unchanged."""

from __future__ import annotations

from dataclasses import replace

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
