"""Hand-computed timelines of whole iterations on the `tiny` profile.

The layers are built by hand (three blocks of 5e8 parameters = 1 GB in bf16, no embedding or
head, no activations) so every time below is worked out from tiny's round numbers:
PCIe 1 GB/s per direction, host copies 10 GB/s, CPU Adam 1e9 params/s, DRAM 100 GB/s.
"""

from __future__ import annotations

import dataclasses

import pytest
import simpy

from offsim.config.run import RunConfig
from offsim.plan.footprint import state_sizes
from offsim.plan.model import Layer
from offsim.simulation import run_schedule
from offsim.trace import Recorder
from tests.conftest import strategy

PARAMS = 500_000_000  # 1 GB of bf16 per layer
#: where ZeRO-3's gradient hook cuts a 0.5 s layer backward on tiny: after its first gradient (the
#: down projection, 166,639,544 of the block's 5e8 elements, a third), whose hook flushes the
#: previous layer's full bucket (stage3.py ``reduce_independent_p_g_buckets_and_remove_grads``)
C = 0.166639544


def _c(t_s: float) -> float:
    """``t_s`` moved by the hook's cut, as :func:`_spans` rounds it."""
    return round(t_s + C, 9)


def _big_gpu(profile):
    """tiny with a 64 GiB GPU, so that the whole 1.5e9-parameter model and its state fit."""
    return profile.model_copy(update={"gpu": profile.gpu.model_copy(update={"memory_gib": 64.0})})


def _run(profile, workload, st, fwd_s: float, bwd_s: float) -> Recorder:
    if st.placement.params == "gpu":
        profile = _big_gpu(profile)
    cfg = RunConfig(hardware=profile, workload=workload, strategy=st, iterations=1, warmup_iterations=0)
    layers = tuple(Layer(i, f"block{i}", PARAMS, 0.0, fwd_s, bwd_s, 0.0, 0.0) for i in range(3))
    sz = dataclasses.replace(state_sizes(cfg), layers=layers, params_total=3 * PARAMS,
                             param_bytes=3 * PARAMS * 2.0, grad_bytes=3 * PARAMS * 2.0)
    return run_schedule(cfg, sz)[0]


def _spans(rec: Recorder, resource: str, kind: str | None = None) -> list[tuple[str, float, float]]:
    return [(s.name, round(s.start_s, 9), round(s.end_s, 9)) for s in rec.spans
            if s.resource == resource and (kind is None or s.kind == kind)]


def _phases(rec: Recorder) -> dict[str, float]:
    return {name: pytest.approx(end - start) for _, name, start, end in rec.phases}


STREAMED = dict(zero_stage=3, placement={"params": "cpu", "grads": "cpu", "optimizer_states": "cpu",
                                         "activations": "gpu"},
                optimizer_device="cpu", prefetch_depth=1, reuse_distance_params=0.0)


def test_transfer_bound_layers(tiny_profile, tiny_workload) -> None:
    """Fetching a layer (1 s) takes longer than computing it (0.25 s fwd, 0.5 s bwd).

    Forward: fetches run in order on one stream: L0 [0,1], L1 [1,2], L2 [2,3]; each layer
    computes as soon as its fetch ends: [1,1.25], [2,2.25], [3,3.25]. L2 is kept for backward
    (it is the next op). Backward: L2 [3.25,3.75] while L1 is re-fetched [3.25,4.25]; L1
    [4.25,4.75] while L0 is fetched [4.25,5.25]; L0 [5.25,5.75]. Each layer is one reduce bucket
    (5e8 elements), flushed from the gradient hook of the next layer's first gradient, C = 0.1666
    s into that layer's backward (the layer's kernels cut there), the last by the epilogue.

    Gradients as DeepSpeed ZeRO-3 runs them at GAS 1 (stage3.py ``partition_grads``,
    deepspeed_runtime.md §3): per partition, in issue order on the one reduction stream, D2H the
    16-bit partition (1 GB, 1 s), H2D it back (1 GB, 1 s), the fp64 norms and the fp32 cast on
    the GPU (5e8 x 24 B at HBM 1000 GB/s, 0.012 s, tests/test_zero3_boundary_norms.py), then
    the fp32 copy D2H (5e8 x 4 B = 2 GB, 2 s). L2's, flushed at 4.25 + C: D2H [4.25+C,5.25+C],
    H2D [5.25+C,6.25+C] (L0's fetch is done by 5.25: the link is free), norms, fp32 D2H
    [6.262+C,8.262+C]. The stream then runs L1 (flushed at 5.25 + C): D2H [8.262+C,9.262+C],
    H2D, norms, fp32 [10.274+C,12.274+C]; L0 (the epilogue's, at 5.75): D2H [12.274+C,13.274+C],
    H2D, norms, fp32 [14.286+C,16.286+C]. The compute stream never waits the reduction stream
    until the end of backward, which waits for it to drain: [5.75,16.286+C] (16.286 when each
    bucket was flushed after its own layer: L2's D2H then began at 3.75 and its H2D shared the
    link with L0's fetch). No host accumulate: the addition is on the GPU and the fp32 gradient
    lands in place.

    The CPU step, two sub-groups of 7.5e8 params, each as DeepSpeed runs it (stage3.py
    ``_optimizer_step``): unscale the fp32 gradient (7.5e8 x 8 B = 6 GB at DRAM's 100 GB/s,
    0.06 s), CPU Adam (at 1e9/s, 0.75 s), cast the master to 16 bits (7.5e8 x 6 B = 4.5 GB,
    0.045 s): [16.286+C, 17.141+C] and [17.141+C, 17.996+C].
    """
    rec = _run(tiny_profile, tiny_workload, strategy(**STREAMED), fwd_s=0.25, bwd_s=0.5)
    assert _spans(rec, "gpu") == [
        ("block0 forward", 1.0, 1.25), ("block1 forward", 2.0, 2.25), ("block2 forward", 3.0, 3.25),
        ("block2 backward", 3.25, 3.75), ("block1 backward", 4.25, _c(4.25)), ("block1 backward", _c(4.25), 4.75),
        ("block0 backward", 5.25, _c(5.25)), ("block0 backward", _c(5.25), 5.75),
        ("block2 gradient norms (fp64)", _c(6.25), _c(6.262)), ("block1 gradient norms (fp64)", _c(10.262), _c(10.274)),
        ("block0 gradient norms (fp64)", _c(14.274), _c(14.286)),
    ]
    assert _spans(rec, "h2d") == [
        ("block0 params", 0.0, 1.0), ("block1 params", 1.0, 2.0), ("block2 params", 2.0, 3.0),
        ("block1 params", 3.25, 4.25), ("block0 params", 4.25, 5.25), ("block2 grads", _c(5.25), _c(6.25)),
        ("block1 grads", _c(9.262), _c(10.262)), ("block0 grads", _c(13.274), _c(14.274)),
    ]
    assert _spans(rec, "d2h") == [
        ("block2 grads", _c(4.25), _c(5.25)), ("block2 grads", _c(6.262), _c(8.262)),
        ("block1 grads", _c(8.262), _c(9.262)), ("block1 grads", _c(10.274), _c(12.274)),
        ("block0 grads", _c(12.274), _c(13.274)), ("block0 grads", _c(14.286), _c(16.286))]
    drain = [(s.start_s, s.end_s) for s in rec.spans if s.resource == "gpu_stall" and "reduction stream" in s.name]
    assert drain == [(pytest.approx(5.75), pytest.approx(16.286 + C))]
    assert _spans(rec, "cpu") == [("CPU Adam sub-group 0", _c(16.346), _c(17.096)),
                                  ("CPU Adam sub-group 1", _c(17.201), _c(17.951))]
    assert [s for s in _spans(rec, "dram_copy") if "sub-group" in s[0]] == [
        ("unscale gradients, sub-group 0", _c(16.286), _c(16.346)),
        ("cast to 16-bit, sub-group 0", _c(17.096), _c(17.141)),
        ("unscale gradients, sub-group 1", _c(17.141), _c(17.201)),
        ("cast to 16-bit, sub-group 1", _c(17.951), _c(17.996))]
    assert _phases(rec) == {"forward": 3.25, "backward": _c(13.036), "optimizer": 1.71}
    assert rec.end_s == pytest.approx(17.996 + C)


def test_compute_bound_layers_hide_all_but_the_first_fetch(tiny_profile, tiny_workload) -> None:
    """Computing a layer (2 s) takes longer than fetching it (1 s): with prefetch depth 1 only
    L0's fetch is exposed. Forward: L0 [1,3], L1 [3,5] (fetched [1,2]), L2 [5,7] (fetched [3,4])."""
    rec = _run(tiny_profile, tiny_workload, strategy(**STREAMED), fwd_s=2.0, bwd_s=4.0)
    fwd = [s for s in _spans(rec, "gpu") if "forward" in s[0]]
    assert fwd == [("block0 forward", 1.0, 3.0), ("block1 forward", 3.0, 5.0), ("block2 forward", 5.0, 7.0)]
    stalls = [s for s in rec.spans if s.resource == "gpu_stall" and s.phase == "forward"]
    assert [(s.start_s, s.end_s) for s in stalls] == [(0.0, pytest.approx(1.0))]


def test_prefetch_depth_zero_exposes_every_fetch(tiny_profile, tiny_workload) -> None:
    """Depth 0 fetches on demand: each forward layer waits its full 1 s fetch."""
    st = strategy(**{**STREAMED, "prefetch_depth": 0})
    rec = _run(tiny_profile, tiny_workload, st, fwd_s=2.0, bwd_s=4.0)
    fwd = [s for s in _spans(rec, "gpu") if "forward" in s[0]]
    assert fwd == [("block0 forward", 1.0, 3.0), ("block1 forward", 4.0, 6.0), ("block2 forward", 7.0, 9.0)]


def test_gpu_resident_params_move_nothing(tiny_profile, tiny_workload) -> None:
    """gpu-only: no transfers at all; the iteration is compute plus the GPU Adam step.

    GPU Adam touches 2 x 12 + 2 + 2 = 28 B per parameter: 1.5e9 x 28 B / 1000 GB/s = 0.042 s.
    """
    st = strategy(zero_stage=0, prefetch_depth=0)
    rec = _run(tiny_profile, tiny_workload, st, fwd_s=0.25, bwd_s=0.5)
    assert [s for s in rec.spans if s.resource in ("h2d", "d2h", "nvme_read", "nvme_write")] == []
    assert rec.end_s == pytest.approx(3 * 0.75 + 1.5e9 * 28 / 1e12)


def test_blocking_gradient_offload_stalls_backward(tiny_profile, tiny_workload) -> None:
    """Without overlap (DeepSpeed ``overlap_comm: false``: the reduction stream is the compute
    stream, deepspeed_runtime.md §3) each backward layer waits for all of its gradient copies:
    D2H 1 GB (1 s), H2D back 1 GB (1 s), the fp64 norms and fp32 cast on the GPU (0.012 s),
    fp32 D2H 2 GB (2 s) = 4.012 s, from the gradient hook of the next layer's first gradient (C
    into its backward; the last bucket from the epilogue). L2 [3.25,3.75]; L1 (fetched
    [3.25,4.25]) [4.25,4.25+C] while L0 is fetched [4.25,5.25]; L1's hook flushes L2's bucket:
    copies [4.25+C,8.262+C] (its H2D after the fetch, [5.25+C,6.25+C]); L1's rest
    [8.262+C,8.762]; L0 [8.762,8.762+C], its hook flushes L1's: [8.762+C,12.774+C]; L0's rest
    [12.774+C,13.274]; the epilogue flushes L0's: [13.274,17.286]. Backward: 17.286 - 3.25 =
    14.036 s (13.536 s when each bucket was flushed after its own layer, which left L0's fetch
    waiting behind L2's copies; 13.036 s overlapped)."""
    st = strategy(**{**STREAMED, "overlap_grad_offload": False})
    rec = _run(tiny_profile, tiny_workload, st, fwd_s=0.25, bwd_s=0.5)
    stalls = [s for s in rec.spans if s.resource == "gpu_stall" and "gradient offload" in s.name]
    assert [(s.start_s, s.end_s) for s in stalls] == [
        (pytest.approx(4.25 + C), pytest.approx(8.262 + C)), (pytest.approx(8.762 + C), pytest.approx(12.774 + C)),
        (pytest.approx(13.274), pytest.approx(17.286))]
    assert _spans(rec, "h2d")[3:] == [
        ("block1 params", 3.25, 4.25), ("block0 params", 4.25, 5.25), ("block2 grads", _c(5.25), _c(6.25)),
        ("block1 grads", _c(9.762), _c(10.762)), ("block0 grads", 14.274, 15.274)]
    assert _phases(rec)["backward"] == pytest.approx(14.036)


def test_zero_offload_compute_stream_waiting_for_the_step_is_a_stall(tiny_profile, tiny_workload) -> None:
    """ZeRO-Offload (ZeRO-2, parameters on the GPU, the optimizer on the CPU after backward):
    the compute stream waits, idle, until the CPU step has sent the last sub-group's parameters
    home (DeepSpeed stage_1_and_2.py ``step``: the next forward needs the updated 16-bit
    parameters). That wait is a GPU stall like every other wait of the compute stream, so it
    spans [end of backward, end of the step] and equals the optimizer phase (it read 0 before:
    the Join carried no ``stall``).

    Backward is DeepSpeed's ZeRO-2 gradient path with ``overlap_comm`` (offsim/mechanisms/
    zero2_grads.py, e384742; by hand): each layer's backward (0.5 s) is followed on the compute
    stream by its IPG bucket copy, 5e8 x 2 x 2 B / 1e12 B/s = 0.002 s, then its fp32 copy,
    5e8 x 4 B / 1 GB/s = 2 s, runs on the reduction stream while the next layer computes, and the
    next layer waits for it (``average_tensor``): block2 [0.75, 1.25] + [1.25, 1.252], its D2H
    [1.252, 3.252]; block1 [1.252, 1.754], waits [1.754, 3.252]; block0 [3.252, 3.754], waits
    [3.754, 5.252]; block0's D2H [5.252, 7.252], waited for by the epilogue's synchronize
    (``independent_gradient_partition_epilogue``). Backward ends at 7.252 s."""
    st = strategy(zero_stage=2, prefetch_depth=0, optimizer_device="cpu",
                  placement={"params": "gpu", "grads": "cpu", "optimizer_states": "cpu", "activations": "gpu"})
    rec = _run(tiny_profile, tiny_workload, st, fwd_s=0.25, bwd_s=0.5)
    stalls = [(s.name, s.start_s, s.end_s) for s in rec.spans if s.resource == "gpu_stall"]
    assert stalls == [
        ("block1 waits for the reduction stream (previous bucket)", pytest.approx(1.754), pytest.approx(3.252)),
        ("block0 waits for the reduction stream (previous bucket)", pytest.approx(3.754), pytest.approx(5.252)),
        ("block0 waits for the reduction stream at the end of backward (epilogue synchronize)",
         pytest.approx(5.252), pytest.approx(7.252)),
        ("waits for the optimizer step", pytest.approx(7.252), pytest.approx(rec.end_s))]
    assert _spans(rec, "d2h") == [("block2 grads", 1.252, 3.252), ("block1 grads", 3.252, 5.252),
                                  ("block0 grads", 5.252, 7.252)]
    assert _phases(rec)["backward"] == pytest.approx(7.252 - 0.75)
    assert _spans(rec, "h2d")[-1][2] == pytest.approx(rec.end_s)  # the step ends with the last params home
    assert rec.end_s - 7.252 == pytest.approx(_phases(rec)["optimizer"])


def test_activation_checkpointing_recomputes_each_block(tiny_profile, tiny_workload) -> None:
    """With checkpointing a block's backward is preceded by a recompute of its forward."""
    st = strategy(zero_stage=0, prefetch_depth=0, activation_checkpointing=True)
    rec = _run(tiny_profile, tiny_workload, st, fwd_s=0.25, bwd_s=0.5)
    kinds = [s.kind for s in rec.spans if s.resource == "gpu" and s.phase == "backward"]
    assert kinds == ["recompute", "backward"] * 3


def test_simpy_is_deterministic(tiny_profile, tiny_workload) -> None:
    a = _run(tiny_profile, tiny_workload, strategy(**STREAMED), fwd_s=0.25, bwd_s=0.5)
    b = _run(tiny_profile, tiny_workload, strategy(**STREAMED), fwd_s=0.25, bwd_s=0.5)
    assert a.spans == b.spans and a.levels == b.levels
    assert isinstance(simpy.Environment(), simpy.Environment)


def _run_with_activations(profile, workload, st, fwd_s: float, bwd_s: float, act_bytes: float) -> Recorder:
    """As :func:`_run`, with ``act_bytes`` of activations kept per block (nothing to checkpoint)."""
    profile = _big_gpu(profile)
    cfg = RunConfig(hardware=profile, workload=workload, strategy=st, iterations=1, warmup_iterations=0)
    layers = tuple(Layer(i, f"block{i}", PARAMS, 0.0, fwd_s, bwd_s, act_bytes, 0.0) for i in range(3))
    sz = dataclasses.replace(state_sizes(cfg), layers=layers, params_total=3 * PARAMS,
                             param_bytes=3 * PARAMS * 2.0, grad_bytes=3 * PARAMS * 2.0)
    return run_schedule(cfg, sz)[0]


def test_swapped_activations_throttle_forward_and_are_prefetched_in_backward(tiny_profile, tiny_workload) -> None:
    """Three blocks each swap 1 GB of activations to DRAM over 1 GB/s links (fwd 0.25 s, bwd
    0.5 s, prefetch depth 1, so at most depth + 2 = 3 blocks' activations may be in flight,
    and forward waits when a fourth would be).

    Forward: B0 [0,0.25], B1 [0.25,0.5], B2 [0.5,0.75]; copies out (one stream, in order)
    A0 [0.25,1.25], A1 [1.25,2.25], A2 [2.25,3.25]. After B2, three copies are in flight, one
    more than depth + 1, so forward waits for A0 until 1.25.
    Backward: B2 needs A2 back, which starts once A2 is out: [3.25,4.25]; meanwhile the
    prefetch of A1 (depth 1) started as soon as A1 was out: [2.25,3.25]. B2 [4.25,4.75]; B1
    (A1 already back) [4.75,5.25]; A0 is prefetched from B1's start: [4.75,5.75]; B0 waits and
    runs [5.75,6.25]. Without the prefetch A1 would come back only at 4.75 and B1 end at 6.25.
    """
    st = strategy(zero_stage=0, prefetch_depth=1,
                  policies={"activations": {"kind": "per-block", "offload": 3, "tier": "cpu"}})
    rec = _run_with_activations(tiny_profile, tiny_workload, st, fwd_s=0.25, bwd_s=0.5, act_bytes=1e9)
    assert _spans(rec, "d2h") == [("block0 activations", 0.25, 1.25), ("block1 activations", 1.25, 2.25),
                                  ("block2 activations", 2.25, 3.25)]
    assert _spans(rec, "h2d") == [("block1 activations", 2.25, 3.25), ("block2 activations", 3.25, 4.25),
                                  ("block0 activations", 4.75, 5.75)]
    gpu = [(name, start, end) for name, start, end in _spans(rec, "gpu") if "backward" in name]
    assert gpu == [("block2 backward", 4.25, 4.75), ("block1 backward", 4.75, 5.25),
                   ("block0 backward", 5.75, 6.25)]
    assert _phases(rec)["forward"] == pytest.approx(1.25)


def test_layerwise_grad_buffers_make_backward_wait_for_the_cpu_update(tiny_profile, tiny_workload) -> None:
    """Layer-wise CPU updates with one host gradient buffer (Fuyou's synchronous out-of-core
    optimizer): a layer's buffer is held from its gradient copy until its update is done.

    Per layer: copy 1 GB of bf16 gradients down (1 s), cast to the 2 GB fp32 buffer (3 GB of
    DRAM at 10 GB/s, 0.3 s), CPU Adam (5e8 params at 1e9/s, 0.5 s), updated params back up
    (1 s): 2.8 s. Forward ends at 0.75. B2 [0.75,1.25]; its buffer is held [1.25,4.05]. B1
    [1.25,1.75] waits for the buffer [1.75,4.05]; B0 [4.05,4.55] waits [4.55,6.85]."""
    fields = dict(zero_stage=0, prefetch_depth=0, optimizer_device="cpu", optimizer_schedule="layerwise",
                  placement={"params": "gpu", "grads": "cpu", "optimizer_states": "cpu", "activations": "gpu"})
    rec = _run(tiny_profile, tiny_workload, strategy(**fields, layerwise_grad_buffers=1), fwd_s=0.25, bwd_s=0.5)
    stalls = [(s.start_s, s.end_s) for s in rec.spans if s.resource == "gpu_stall" and "host gradient" in s.name]
    assert stalls == [(pytest.approx(1.75), pytest.approx(4.05)), (pytest.approx(4.55), pytest.approx(6.85))]
    whole = _run(tiny_profile, tiny_workload, strategy(**fields), fwd_s=0.25, bwd_s=0.5)
    assert not [s for s in whole.spans if s.resource == "gpu_stall" and "host gradient" in s.name]
