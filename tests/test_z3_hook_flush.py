"""DeepSpeed ZeRO-3 flushes a reduce bucket from the gradient hook of the parameter that would
overflow it, inside that parameter's layer's backward (stage3.py ``reduce_partition_and_remove_grads``
-> ``reduce_independent_p_g_buckets_and_remove_grads`` -> ``__reduce_and_partition_ipg_grads``;
the same rule in v0.3.15's stage3.py, so no version switch): the backward kernels are cut where
such a gradient is ready and the flush's reduction and copies overlap the rest of the layer
(:func:`offsim.systems._part_grads.with_gradient_hooks`)."""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from offsim.config.run import RunConfig
from offsim.plan.footprint import state_sizes
from offsim.plan.model import Layer
from offsim.simulation import run_schedule
from offsim.systems._compile import System
from offsim.systems._ctx import Variants, build_ctx
from offsim.systems._part_grads import hook_points, with_gradient_hooks
from offsim.systems._parts import standard
from tests.conftest import strategy

#: a block of hidden 1000, FFN 4000 (standard MLP), 8 heads, two RMSNorms: q, k, v, o 1e6 each,
#: up and down 4e6 each, norms 2,000 (footprint.layer_tensors); backward makes down, up, o, v, k,
#: q, then the norms
BLOCK = 12_002_000
#: its backward: 1e-7 s per element, so down 0.4 s, up 0.4, o, v, k, q 0.1 each, the norms 0.0002
BACKWARD_S = 1.2002
#: DeepSpeed's per-bucket seconds per element on tiny (1 GB/s each way, HBM 1000 GB/s), dp 1,
#: one micro-batch, bf16 (tests/test_z3_buckets.py): 16-bit D2H 2 B, H2D back 2 B, the boundary's
#: fp64 norms and fp32 cast on the GPU 24 B / 1e12, fp32 D2H 4 B
PER_ELEMENT_S = (2 + 2 + 4) / 1e9 + 24 / 1e12


def _config(tiny_profile, tiny_workload, bucket: float) -> tuple[RunConfig, object]:
    st = strategy(zero_stage=3, optimizer_device="cpu", prefetch_depth=1, reuse_distance_params=0.0,
                  reduce_bucket_params=bucket,
                  placement={"params": "gpu", "grads": "cpu", "optimizer_states": "cpu", "activations": "gpu"})
    model = tiny_workload.model.model_copy(update={"hidden": 1000, "ffn_hidden": 4000, "heads": 8})
    wl = tiny_workload.model_copy(update={"model": model})
    cfg = RunConfig(hardware=tiny_profile, workload=wl, strategy=st, iterations=1, warmup_iterations=0)
    blocks = tuple(Layer(i, f"block{i}", BLOCK, 0.0, 0.6, BACKWARD_S, 0.0, 0.0) for i in range(2))
    sz = dataclasses.replace(state_sizes(cfg), layers=blocks, params_total=2 * BLOCK, param_bytes=2 * BLOCK * 2.0,
                             grad_bytes=2 * BLOCK * 2.0)
    return cfg, sz


def _system(cfg: RunConfig, sz, hooked: bool) -> System:
    c = build_ctx(cfg, sz, Variants(deepspeed_grads=True))
    system = standard(c)
    return with_gradient_hooks(system) if hooked else system


def _run(cfg: RunConfig, sz, hooked: bool):
    return run_schedule(cfg, sz, system=_system(cfg, sz, hooked), steady_shortcut=False)


def test_hook_points_by_hand() -> None:
    """Buckets of 5e6 over two blocks (block 1 first): down(1) 4e6; up(1) would pass 5e6, so
    its hook flushes {down} at 8e6 / 12,002,000 of block 1; up + o = 5e6 (not above); v's hook
    flushes it at 10e6 / 12,002,000; v + k + q + norms = 3,002,000, block 0's down flushes it
    (4e6 / 12,002,000 of block 0); then the same in block 0, its last bucket by the epilogue."""
    from offsim.mechanisms.grads import GradBucket
    from offsim.plan.model import reduce_buckets
    from offsim.systems._part_grads import _ready_points

    tensors = (4_000_000, 4_000_000, 1_000_000, 1_000_000, 1_000_000, 1_000_000, 2_000)
    order = [(1, tensors), (0, tensors)]
    buckets = reduce_buckets(order, 5e6)
    assert [b.pieces for b in buckets] == [((1, 4_000_000),), ((1, 5_000_000),), ((1, 3_002_000),),
                                           ((0, 4_000_000),), ((0, 5_000_000),), ((0, 3_002_000),)]
    ready = _ready_points(order, buckets)
    assert ready == [(1, 8e6 / BLOCK), (1, 10e6 / BLOCK), (0, 4e6 / BLOCK), (0, 8e6 / BLOCK), (0, 10e6 / BLOCK),
                     None]
    grads = tuple(GradBucket(b.pieces, b.flush_layer, None, ready_at=r)  # type: ignore[arg-type]
                  for b, r in zip(buckets, ready, strict=True))
    cuts, where = hook_points(grads)
    assert cuts == {1: (8e6 / BLOCK, 10e6 / BLOCK), 0: (4e6 / BLOCK, 8e6 / BLOCK, 10e6 / BLOCK)}
    assert where == ((1, 0), (1, 1), (0, 0), (0, 1), (0, 2), None)


def test_mid_layer_flushes_overlap_the_layer_by_hand(tiny_profile, tiny_workload) -> None:
    """Forward [0, 1.2]; backward: block 1 [1.2, 2.4002], block 0 [2.4002, 3.6004]. The hooks
    (test_hook_points_by_hand) flush at 1.2 + 0.8 = 2.0 (4e6 elements, 0.032096 s on the
    reduction stream), 1.2 + 1.0 = 2.2 (5e6: 0.04012 s), 2.4002 + 0.4 = 2.8002 (3,002,000:
    0.024088048 s), 3.2002 (4e6), 3.4002 (5e6), and the epilogue at 3.6004 (3,002,000), whose
    drain ends backward at 3.624488048: 2.424488048 s. Each bucket's fp32 copy is its last
    4 B per element. Without the hooks the first three go after block 1 (2.4002, back to back),
    the last three after block 0: backward 3.6004 + 12,002,000 x 8.024e-9 - 1.2 = 2.496704048 s."""
    cfg, sz = _config(tiny_profile, tiny_workload, 5e6)
    flushes = (2.0, 2.2, 2.8002, 3.2002, 3.4002, 3.6004)
    elements = (4e6, 5e6, 3.002e6, 4e6, 5e6, 3.002e6)
    rec = _run(cfg, sz, hooked=True)[0]
    gpu = [(s.start_s, s.end_s) for s in rec.spans
           if s.resource == "gpu" and s.phase == "backward" and s.name.endswith(" backward")]
    cuts = (1.2, 2.0, 2.2, 2.4002, 2.8002, 3.2002, 3.4002, 3.6004)
    assert gpu == [(pytest.approx(a), pytest.approx(b)) for a, b in itertools.pairwise(cuts)]
    fp32 = [(s.start_s, s.end_s) for s in rec.spans if s.resource == "d2h" and s.phase == "backward"
            and s.bytes in {4 * n for n in elements}]
    assert fp32 == [(pytest.approx(t + n * (PER_ELEMENT_S - 4e-9)), pytest.approx(t + n * PER_ELEMENT_S))
                    for t, n in zip(flushes, elements, strict=True)]
    backward = next(end - start for _, name, start, end in rec.phases if name == "backward")
    assert backward == pytest.approx(3.6004 + 3.002e6 * PER_ELEMENT_S - 1.2)
    unhooked = _run(cfg, sz, hooked=False)[0]
    before = next(end - start for _, name, start, end in unhooked.phases if name == "backward")
    assert before == pytest.approx(3.6004 + BLOCK * PER_ELEMENT_S - 1.2)  # buckets 4-6 after block 0


def test_layer_boundary_buckets_keep_bytes_and_memory(tiny_profile, tiny_workload) -> None:
    """Buckets of one block (12,002,000 elements): block 1's is flushed by block 0's first
    gradient (down, 4e6 / 12,002,000 into block 0's backward), later than after block 1 as
    before, but the same bytes move and the same bucket window is held: traffic and the plan's
    GPU need are unchanged, and so is the run's GPU peak."""
    cfg, sz = _config(tiny_profile, tiny_workload, BLOCK)
    hooked, plain = _run(cfg, sz, hooked=True), _run(cfg, sz, hooked=False)
    traffic = [{(s.resource, s.bytes) for s in r[0].spans if s.resource in ("d2h", "h2d")} for r in (hooked, plain)]
    assert traffic[0] == traffic[1]
    assert sum(s.bytes for s in hooked[0].spans if s.resource == "d2h") == \
        sum(s.bytes for s in plain[0].spans if s.resource == "d2h")
    assert hooked[1]["gpu"] == plain[1]["gpu"]
    needs = [sum(n.nbytes for m in _system(cfg, sz, h).mechanisms.values() for n in m.footprint()
                 if n.tier.value == "gpu") for h in (True, False)]
    assert needs[0] == needs[1]


def test_hooks_applied_twice_change_nothing(tiny_profile, tiny_workload) -> None:
    """:func:`with_gradient_hooks` is idempotent (a system file and the registry may both apply
    it), and without two buckets or off DeepSpeed's path it returns the system as it was."""
    cfg, sz = _config(tiny_profile, tiny_workload, 5e6)
    once = _system(cfg, sz, hooked=True)
    assert with_gradient_hooks(once) == once
    whole, _ = _config(tiny_profile, tiny_workload, 1e9)  # one bucket: the epilogue flushes it
    plain = _system(whole, sz, hooked=False)
    assert with_gradient_hooks(plain) is plain


def test_next_flush_hooks_make_the_ipg_buffer_once(tiny_profile, tiny_workload) -> None:
    """v0.3.12-v0.5.10 (``next_flush``: the IPG buffer made per backward, the host waiting for
    the previous bucket's reduction at each flush) runs with the hooks too: the buffer is made
    once per backward, at the first gradient, and the same bytes move as without the hooks."""
    cfg, sz = _config(tiny_profile, tiny_workload, 5e6)
    cfg = cfg.model_copy(update={"strategy": cfg.strategy.model_copy(update={"z3_grad_flush": "next_flush",
                                                                               "z3_host_grads": "legacy"})})
    from offsim.schedule.ops import Alloc, Block
    from offsim.systems._compile import compile_system

    def ops(parts):
        for part in parts:
            yield from part.ops if isinstance(part, Block) else ops(part.period)

    from offsim.mechanisms.grads import GRAD_SLOTS
    from offsim.schedule.ops import Acquire

    every = list(ops(compile_system(_system(cfg, sz, hooked=True)).body))
    ipg = [op for op in every if isinstance(op.body, Alloc) and op.body.tensor.unit == -5]
    assert len(ipg) == 1
    first_flush = next(op for op in every if isinstance(op.body, Acquire) and op.body.pool == GRAD_SLOTS)
    assert ipg[0].id < first_flush.id  # block 1's first hook flushes: the buffer is there before
    hooked, plain = _run(cfg, sz, hooked=True), _run(cfg, sz, hooked=False)
    assert sum(s.bytes for s in hooked[0].spans if s.resource == "d2h") == \
        sum(s.bytes for s in plain[0].spans if s.resource == "d2h")
