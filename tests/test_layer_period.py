"""The layer-period measure of ``benchmarks/engine_layer_period.py`` (issue 16), on hand-built
blocks and spans: a run of ops equal to the one before up to the layer number counts as equal,
one that names a different neighbour or a different number of bytes does not; span patterns
match to the steady-state shortcut's tolerance and no further."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

from offsim.core.enums import Activity, CacheId, MechanismId, Phase, TensorKind, Tier
from offsim.schedule.ops import CUR_MB, Access, Alloc, Block, Op, Tag, TensorRef

_PATH = Path(__file__).resolve().parent.parent / "benchmarks" / "engine_layer_period.py"


def _probe() -> ModuleType:
    spec = importlib.util.spec_from_file_location("engine_layer_period", _PATH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _layer_ops(layer: int, first_id: int, reads_back: int = 1, nbytes: int = 100) -> list[Op]:
    """Three ops of one forward layer: an access of its params, an activation held, a kernel that
    reads the activation of the layer ``reads_back`` before and waits for the access."""
    tag = Tag(Activity.FORWARD, MechanismId.COMPUTE, Phase.FORWARD, layer=layer)
    act = TensorRef(TensorKind.ACTIVATION, unit=layer, mb=CUR_MB)
    prev = TensorRef(TensorKind.ACTIVATION, unit=layer - reads_back, mb=CUR_MB)
    return [Op(first_id, Access(CacheId.GPU_PARAMS, layer), tag, "gpu"),
            Op(first_id + 1, Alloc(Tier.GPU, nbytes, act), tag, "gpu", after=(first_id,)),
            Op(first_id + 2, Access(CacheId.GPU_PARAMS, layer), tag, "gpu", after=(first_id + 1,),
               reads=(prev,), writes=(act,))]


def _canons(probe: ModuleType, block: Block) -> list[tuple[object, ...]]:
    return [tuple(probe._canon(op, unit, ops[0].id, probe._origin(unit, ops)) for op in ops)
            for _, unit, ops in probe._runs(block)]


def test_layers_equal_up_to_their_number() -> None:
    probe = _probe()
    block = Block("mb", tuple(_layer_ops(1, 0) + _layer_ops(2, 3) + _layer_ops(3, 6)))
    runs = probe._runs(block)
    assert [(phase, unit, len(ops)) for phase, unit, ops in runs] == [("forward", 1, 3), ("forward", 2, 3),
                                                                      ("forward", 3, 3)]
    canons = _canons(probe, block)
    assert canons[0] == canons[1] == canons[2]
    assert probe._equal_counts(canons, (1, 2)) == {1: 2, 2: 1}


def test_a_different_neighbour_or_size_is_not_equal() -> None:
    probe = _probe()
    block = Block("mb", tuple(_layer_ops(1, 0) + _layer_ops(2, 3, reads_back=2) + _layer_ops(3, 6, nbytes=101)))
    canons = _canons(probe, block)
    assert canons[0] != canons[1]  # layer 2 reads layer 0's activation, layer 1 the embedding's (its previous)
    assert canons[0] != canons[2]  # 101 bytes, not 100
    assert probe._equal_counts(canons, (1, 2)) == {1: 0, 2: 0}


def test_period_three_counted_by_hand() -> None:
    """a b c a b c a: equal to the one 3 before: 4 (items 3-6); 1 before: none; 6 before: 1."""
    probe = _probe()
    assert probe._equal_counts(list("abcabca"), (1, 3, 6)) == {1: 0, 3: 4, 6: 1}


def _unit(anchor_s: float, offset_s: float = 0.0) -> tuple[float, list[tuple[object, ...]]]:
    """A unit whose two spans lie 0.1 s and 0.3 s after its anchor (relative times)."""
    return (anchor_s, [("gpu", "forward", "block# forward", 0.0, 0.0, 0.25 + offset_s),
                       ("h2d", "param_fetch", "block# params", 1e6, 0.1, 0.3)])


def test_spans_match_to_the_tolerance_only() -> None:
    """Anchors 100, 100.5, 101, 101.5 s: each unit repeats the one before (same spacing, same
    spans); a span 1e-9 s longer (>> 1e-13 x 101.5 s ~ 1e-11 s) does not; nor does a unit whose
    start comes 1e-9 s late (the spacing changes)."""
    probe = _probe()
    units = [_unit(100.0), _unit(100.5), _unit(101.0), _unit(101.5)]
    assert [probe._matches(units, i, 1) for i in range(4)] == [False, False, True, True]
    longer = [*units[:3], _unit(101.5, offset_s=1e-9)]
    assert not probe._matches(longer, 3, 1)
    late = [*units[:3], _unit(101.5 + 1e-9)]
    assert not probe._matches(late, 3, 1)
    rounding = [*units[:3], _unit(101.5, offset_s=1e-12)]  # within 1e-13 x 101.5 s
    assert probe._matches(rounding, 3, 1)


def _backward_ops(layer: int, first_id: int, first_buffer: int, buffers: int = 4) -> list[Op]:
    """A backward layer holding ``buffers`` gradient buffers numbered from ``first_buffer`` (as
    the compiler numbers them across the whole backward), and reading a static buffer (1004)."""
    tag = Tag(Activity.BACKWARD, MechanismId.GRADS, Phase.BACKWARD, layer=layer)
    static = TensorRef(TensorKind.BUFFER, unit=-1, group=1004)
    return [Op(first_id + k, Alloc(Tier.GPU, 10, TensorRef(TensorKind.BUFFER, unit=-4, group=first_buffer + k,
                                                           mb=CUR_MB)), tag, "gpu", reads=(static,))
            for k in range(buffers)]


def test_gradient_buffers_relative_to_the_run_static_ones_not() -> None:
    """Layers 45 and 44 with buffers 205-208 and 209-212 are equal (4 a layer); layer 43 with
    213-215 (3) is not; the static buffer 1004 stays 1004 (further than GROUP_WINDOW from 213)."""
    probe = _probe()
    block = Block("mb", tuple(_backward_ops(45, 0, 205) + _backward_ops(44, 4, 209)
                              + _backward_ops(43, 8, 213, buffers=3)))
    canons = _canons(probe, block)
    assert canons[0] == canons[1] != canons[2]
    reads = canons[0][0][9]
    assert reads[0][2] == 1004
    assert canons[0][0][1][2][1][2] == ("g", 0) and canons[0][3][1][2][1][2] == ("g", 3)
