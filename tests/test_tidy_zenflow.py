"""ZenFlow's gradient path without a host accumulation pass (:class:`offsim.systems.zenflow.WindowGrads`):
the copy down ends in a Join that writes the layer's optimizer gradient, with no zero-byte
``grad_host`` flow (DeepSpeed ``stage_1_and_2.py:async_accumulate_grad_in_cpu_via_gpu``: the sum
is made on the GPU and lands in the pinned buffer as it is)."""

from __future__ import annotations

from offsim import make_run_config
from offsim.core.enums import TensorKind
from offsim.schedule.ops import Flow, Join
from offsim.systems._compile import compile_system
from offsim.systems._registry import compose


def test_each_layer_gradient_arrives_by_a_join_after_its_copy() -> None:
    """tiny (6 units: embedding, 4 blocks, head), one micro-batch: six D2H copies, six Joins, each
    writing its unit's optimizer gradient and reached from that unit's copy; nothing on grad_host."""
    sc = compile_system(compose(make_run_config("tiny", "tiny", "zenflow")))
    mb = next(b for b in sc.blocks() if b.name.startswith("micro-batch"))
    assert not [op for op in mb.ops if op.stream == "grad_host"]
    copies = [op for op in mb.ops if op.stream == "grad_d2h" and isinstance(op.body, Flow)]
    arrivals = [op for op in mb.ops if isinstance(op.body, Join)
                and any(w.kind is TensorKind.GRAD_OPT for w in op.writes)]
    assert len(copies) == len(arrivals) == 6
    assert sorted(w.unit for op in arrivals for w in op.writes) == list(range(6))
    for copy, arrival in zip(copies, arrivals, strict=True):
        chain, op_id = [], arrival.id  # walk back along the first dependency to the copy
        while op_id != copy.id and mb.ops[op_id].after:
            op_id = mb.ops[op_id].after[0]
            chain.append(op_id)
        assert op_id == copy.id, (arrival.writes, chain)
