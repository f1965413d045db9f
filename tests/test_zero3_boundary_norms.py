"""DeepSpeed ZeRO-3's boundary norms (stage3.py ``partition_grads``: at the accumulation boundary
every gradient partition's L2 norm is taken on the reduction stream as
``part.data.double().norm(2)`` over chunks of at most 250M elements, ``_constant_buffered_norm2``,
before the copy to the host; in the 0.13.3 DataStates forks and at edaa722126): GPU time at HBM
bandwidth and the GPU bytes held (parameters on the GPU), counted by hand on tiny (HBM 1000 GB/s; one reduce bucket of
all 67,118,080 elements at the default 5e8, flushed after layer 0; largest partitions 8,388,608
elements, the embedding and the head; bf16 accumulator, b_acc = 2 B)."""

from __future__ import annotations

import pytest

from offsim import simulate
from offsim.config.loading import load_strategy
from offsim.config.run import RunConfig, make_run_config
from offsim.config.strategy import Strategy
from offsim.mechanisms.grads import Grads
from offsim.systems._registry import compose

P = 67_118_080        # tiny's parameters
BIGGEST = 8_388_608   # its largest tensor (embedding; the head's weight)
HBM_BYTES_PER_S = 1e12


#: parameters homed on the GPU (as in the DOS and MLP-Offload runs), where the workspace is held
ON_GPU = {"params": "gpu", "grads": "cpu", "optimizer_states": "cpu", "activations": "gpu"}


def _cfg(strategy: str = "zero-infinity-cpu", **update: object) -> RunConfig:
    update.setdefault("placement", ON_GPU)
    st = Strategy.model_validate({**load_strategy(strategy).model_dump(), **update})
    return make_run_config("tiny", "tiny", st)


def _grads(cfg: RunConfig) -> Grads:
    g = compose(cfg).mechanisms["grads"]
    assert isinstance(g, Grads) and len(g.buckets) == 1
    return g


def test_current_release_norms_and_casts_on_the_gpu() -> None:
    """v0.19.5 (GPU cast, non_blocking fp32 copy): per element the 16-bit slice read and the fp64
    copy written and read (2 + 8 + 8 B), plus the fp32 cast (2 read, 4 written): 24 B x P / 1e12
    = 1.61083392 ms. Held: the largest partition's slice and fp64 chunk, BIGGEST x (2 + 8) =
    83,886,080 B, declared to the fit check."""
    flows = _grads(_cfg()).buckets[0].flows
    assert flows.boundary_norm_s == pytest.approx(P * 24 / HBM_BYTES_PER_S, rel=1e-12)
    assert flows.boundary_gpu_bytes == BIGGEST * 10 == 83_886_080
    needs = {n.what: n.nbytes for n in _grads(_cfg()).footprint()}
    assert needs["boundary gradient norms (fp64 chunk, GPU slices)"] == 83_886_080


def test_cpu_upcast_release_has_no_gpu_cast() -> None:
    """v0.6.0-v0.15.3 cast on the CPU: 18 B x P / 1e12 = 1.20812544 ms on the GPU."""
    flows = _grads(_cfg(z3_fp32_grad_copy="cpu_upcast_blocking")).buckets[0].flows
    assert flows.boundary_norm_s == pytest.approx(P * 18 / HBM_BYTES_PER_S, rel=1e-12)


def test_gradient_swapper_holds_the_buckets_fp32_gradients() -> None:
    """Gradients on NVMe: ``grad_buffer.float()`` of every parameter of the bucket is kept until
    ``swap_out_gradients``; the largest partition's fp64 chunk can meet the others' fp32 copies:
    slice 2 x BIGGEST + max(8 x BIGGEST + 4 x (P - BIGGEST), 4 x P) = 16,777,216 +
    max(67,108,864 + 234,917,888, 268,472,320) = 318,803,968 B."""
    cfg = _cfg("zero-infinity-nvme", placement={**ON_GPU, "grads": "nvme", "optimizer_states": "nvme"})
    flows = _grads(cfg).buckets[0].flows
    assert flows.boundary_gpu_bytes == 16_777_216 + 67_108_864 + 234_917_888 == 318_803_968


def test_streamed_parameters_keep_the_time_not_the_bytes() -> None:
    """Parameters homed on the host: the norms still take 1.61083392 ms, but no bytes are held
    (the auto parameter window would be sized as if they met a full window; see
    ``_boundary_gpu_work``)."""
    flows = _grads(_cfg(placement={**ON_GPU, "params": "cpu"})).buckets[0].flows
    assert flows.boundary_norm_s == pytest.approx(P * 24 / HBM_BYTES_PER_S, rel=1e-12)
    assert flows.boundary_gpu_bytes == 0
    assert "boundary gradient norms (fp64 chunk, GPU slices)" not in {n.what for n in _grads(
        _cfg(placement={**ON_GPU, "params": "cpu"})).footprint()}


def test_norms_run_on_the_reduction_stream_between_round_trip_and_copy() -> None:
    """Timeline, last iteration: the reduction stream runs the round trip's H2D, then the norms
    (1.61083392 ms), then the boundary D2H, back to back; the GPU holds 83,886,080 B more from
    the H2D's end to the D2H's end (levels: the rise at the H2D's end, the first fall at the
    D2H's end)."""
    result = simulate(_cfg())
    spans = result.spans()
    bwd = spans[(spans.iteration == spans.iteration.max()) & (spans.kind == "grad_offload")].sort_values("start_s")
    h2d = bwd[bwd.resource == "h2d"].iloc[-1]
    norm = bwd[bwd.name.str.contains("gradient norms")].iloc[-1]
    d2h = bwd[bwd.resource == "d2h"].iloc[-1]
    assert norm.resource == "gpu"
    assert norm.start_s == pytest.approx(h2d.end_s, abs=1e-12)
    assert norm.end_s - norm.start_s == pytest.approx(P * 24 / HBM_BYTES_PER_S, rel=1e-9)
    assert d2h.start_s == pytest.approx(norm.end_s, abs=1e-12)
    gpu = result.levels()
    gpu = gpu[gpu.tier == "gpu"].reset_index(drop=True)
    before = gpu[gpu.t_s < h2d.end_s - 1e-9].bytes.iloc[-1]
    during = gpu[(gpu.t_s >= h2d.end_s - 1e-9) & (gpu.t_s <= norm.end_s)].bytes.iloc[-1]
    at_end = gpu[(gpu.t_s - d2h.end_s).abs() < 1e-9].bytes
    assert during - before == 83_886_080
    assert at_end.iloc[0] == during - 83_886_080  # the norms' bytes go first when the copy is done
