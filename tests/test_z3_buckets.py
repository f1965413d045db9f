"""DeepSpeed ZeRO-3's reduce buckets (issue 23 part 1): gradients are reduce-scattered and copied
per bucket of at most ``reduce_bucket_size`` elements, not per layer, with at most three
reductions in flight (stage3.py ``reduce_independent_p_g_buckets_and_remove_grads``,
``__reduce_and_partition_ipg_grads``, ``partition_grads``; deepspeed_runtime.md §3)."""

from __future__ import annotations

import dataclasses

import pytest

from offsim.config.run import RunConfig
from offsim.plan.footprint import state_sizes
from offsim.plan.model import Layer, ReduceBucket, reduce_buckets
from offsim.simulation import run_schedule
from tests.conftest import strategy


def test_a_bucket_is_flushed_before_the_gradient_that_would_overflow_it() -> None:
    """Bucket of 10 elements; gradients in backward order: layer 2 (4, 4), layer 1 (3, 12, 1),
    layer 0 (5). 4 + 4 = 8; + 3 = 11 > 10: flush {2: 8} after layer 2. 3; + 12 = 15 > 10: flush
    {1: 3} after layer 1; 12 alone (larger than the bucket, a bucket of its own); + 1 = 13 > 10:
    flush {1: 12}; 1 + 5 = 6: the epilogue flushes {1: 1, 0: 5} after layer 0."""
    got = reduce_buckets([(2, (4, 4)), (1, (3, 12, 1)), (0, (5,))], 10)
    assert got == (ReduceBucket(((2, 8),), 2), ReduceBucket(((1, 3),), 1), ReduceBucket(((1, 12),), 1),
                   ReduceBucket(((1, 1), (0, 5)), 0))
    assert [b.elements for b in got] == [8, 3, 12, 6]


def test_a_bucket_exactly_full_waits_for_the_next_gradient() -> None:
    """``elements + numel > reduce_bucket_size`` flushes: a bucket filled to exactly its size
    stays open until the next gradient arrives (5 + 5 = 10 is not above 10)."""
    assert reduce_buckets([(1, (5, 5)), (0, (1,))], 10) == (ReduceBucket(((1, 10),), 1), ReduceBucket(((0, 1),), 0))


PARAMS = 500_000_000  # 1 GB of bf16 per layer: one bucket of DeepSpeed's default 5e8 elements each


def _run(profile, workload, layers: int) -> RunConfig:
    st = strategy(zero_stage=3, optimizer_device="cpu", prefetch_depth=1, reuse_distance_params=0.0,
                  placement={"params": "gpu", "grads": "cpu", "optimizer_states": "cpu", "activations": "gpu"})
    # room for 2.5e9 parameters' state: GPU 96 GiB, DRAM 512 GiB (tiny has 16 and 64)
    hw = profile.model_copy(update={"gpu": profile.gpu.model_copy(update={"memory_gib": 96.0}),
                                    "dram": profile.dram.model_copy(update={"capacity_gib": 512.0})})
    cfg = RunConfig(hardware=hw, workload=workload, strategy=st, iterations=1, warmup_iterations=0)
    blocks = tuple(Layer(i, f"block{i}", PARAMS, 0.0, 0.25, 0.5, 0.0, 0.0) for i in range(layers))
    sz = dataclasses.replace(state_sizes(cfg), layers=blocks, params_total=layers * PARAMS,
                             param_bytes=layers * PARAMS * 2.0, grad_bytes=layers * PARAMS * 2.0)
    return run_schedule(cfg, sz)[0]


def test_the_fourth_bucket_waits_for_the_first_to_finish(tiny_profile, tiny_workload) -> None:
    """Five blocks of 5e8 parameters on tiny (1 GB/s each way, HBM 1000 GB/s), parameters on the
    GPU (dp 1: no fetch, no reduce-scatter), one bucket per block. Each bucket on the one
    reduction stream, at GAS 1: D2H of the 16-bit partition (1 GB, 1 s), H2D back (1 s), the
    boundary's fp64 norms and fp32 cast on the GPU (5e8 x (2 + 8 + 8 + 2 + 4) B / 1e12 = 0.012 s,
    tests/test_zero3_boundary_norms.py), fp32 D2H (2 GB, 2 s): 4.012 s; its event (the slot back)
    after the fp32 copy.

    Each bucket is flushed by the gradient hook of the next block's first gradient (its down
    projection, 166,639,544 of the block's 5e8 elements: 0.166639544 s into its 0.5 s backward;
    stage3.py ``reduce_independent_p_g_buckets_and_remove_grads``, tests/test_z3_hook_flush.py).
    Forward [0, 1.25]. Backward: B4 [1.25, 1.75]; B3's down [1.75, 1.916639544] flushes bucket 4,
    stream [1.916639544, 5.928639544]; B3's rest [.., 2.25]; B2's down [2.25, 2.416639544]
    flushes bucket 3 [5.928639544, 9.940639544]; B1's down [2.75, 2.916639544] flushes bucket 2
    [9.940639544, 13.952639544] (three in flight); B0's down [3.25, 3.416639544]: bucket 1 finds
    three unfinished, the host waits for bucket 4's event: stall [3.416639544, 5.928639544], B0's
    rest [5.928639544, 6.262]; the epilogue's bucket 0 waits for bucket 3: [6.262, 9.940639544];
    bucket 1 runs [13.952639544, 17.964639544], bucket 0 [17.964639544, 21.976639544]; the drain
    [9.940639544, 21.976639544]. Backward 20.726639544 s (20.56 s when buckets were flushed after
    their last layer, 20.5 s before the norms)."""
    rec = _run(tiny_profile, tiny_workload, 5)
    gpu = [(s.name, s.start_s, s.end_s) for s in rec.spans
           if s.resource == "gpu" and s.phase == "backward" and s.name.endswith(" backward")]
    cut = 0.166639544
    pieces = [("block4", 1.25, 1.75), ("block3", 1.75, 1.75 + cut), ("block3", 1.75 + cut, 2.25),
              ("block2", 2.25, 2.25 + cut), ("block2", 2.25 + cut, 2.75), ("block1", 2.75, 2.75 + cut),
              ("block1", 2.75 + cut, 3.25), ("block0", 3.25, 3.25 + cut), ("block0", 5.928639544, 6.262)]
    assert gpu == [(f"{n} backward", pytest.approx(a), pytest.approx(b)) for n, a, b in pieces]
    ends = (5.928639544, 9.940639544, 13.952639544, 17.964639544, 21.976639544)
    norms = [(s.start_s, s.end_s) for s in rec.spans if s.phase == "backward" and "gradient norms" in s.name]
    assert norms == [(pytest.approx(t - 2.012), pytest.approx(t - 2)) for t in ends]
    throttle = [(s.start_s, s.end_s) for s in rec.spans if s.resource == "gpu_stall" and "throttle" in s.name]
    assert throttle == [(pytest.approx(3.25 + cut), pytest.approx(5.928639544)),
                        (pytest.approx(6.262), pytest.approx(9.940639544))]
    drain = [(s.start_s, s.end_s) for s in rec.spans if s.resource == "gpu_stall" and "end of backward" in s.name]
    assert drain == [(pytest.approx(9.940639544), pytest.approx(21.976639544))]
    fp32 = [(s.name, s.start_s, s.end_s) for s in rec.spans if s.resource == "d2h" and s.bytes == 4 * PARAMS]
    assert [(a, b) for _, a, b in fp32] == [(pytest.approx(t - 2), pytest.approx(t)) for t in ends]
    backward = next(end - start for _, name, start, end in rec.phases if name == "backward")
    assert backward == pytest.approx(20.726639544)


def test_a_70b_layer_is_two_buckets() -> None:
    """The MLP-Offload 70B shape (dos-7b at 80 x 8192, FFN 28672, 64 heads, 4 key/value heads of
    128; untied head of 50304 x 8192), buckets of 5e8 by hand. Backward starts with the head:
    412,090,368 + its final norm 8,192 = 412,098,560; block 79's down projection (8192 x 28672 =
    234,881,024) would pass 5e8, so the head is a bucket of its own, flushed after the head (layer
    81). Block 79: down + up = 469,762,048; gate would pass 5e8: flushed; gate + Wo 67,108,864 +
    Wv and Wk 4,194,304 each + Wq 67,108,864 + its two norms 16,384 = 377,503,744; block 78's
    down would pass 5e8: flushed, both after block 79 (layer 80). 80 blocks x 2 + head + the
    embedding (412,090,368, flushed by the epilogue after layer 0) = 162 buckets."""
    from offsim.config.loading import load_workload
    from offsim.config.run import make_run_config
    from offsim.systems._ctx import build_ctx
    from offsim.systems._part_grads import grad_buckets

    wl = load_workload("dos-7b")
    model = wl.model.model_copy(update={"layers": 80, "hidden": 8192, "ffn_hidden": 28672, "heads": 64})
    training = wl.training.model_copy(update={"data_parallel": 4})
    st = strategy(zero_stage=3, optimizer_device="cpu",
                  placement={"params": "gpu", "grads": "cpu", "optimizer_states": "cpu", "activations": "gpu"})
    cfg = make_run_config("polaris-a100-grand", wl.model_copy(update={"model": model, "training": training}), st)
    buckets = grad_buckets(build_ctx(cfg), 0)
    assert len(buckets) == 162
    assert [(b.pieces, b.flush_layer) for b in buckets[:4]] == [
        (((81, 412_098_560),), 81), (((80, 469_762_048),), 80), (((80, 377_503_744),), 80),
        (((79, 469_762_048),), 79)]
    assert (buckets[-1].pieces, buckets[-1].flush_layer) == (((0, 412_090_368),), 0)
    # dp 4: the reduce-scatter moves 3/4 of the bucket's bf16 bytes; a quarter of it goes down
    d2h = buckets[1].flows.d2h
    assert d2h is not None and d2h.nbytes == 469_762_048 * 2 // 4
