"""DeepSpeed ZeRO-3's boundary copy in v0.6.0-v0.15.3 (``z3_fp32_grad_copy: cpu_upcast_blocking``):
``fp32_grad.copy_(grad_buffer)`` lands the 16-bit partition in a new pageable temporary
(PyTorch Copy.cu, ``at::empty_like``), which glibc maps afresh when it is 32 MiB or more, so the
driver's copy out of its staging buffer faults its pages in (offsim/plan/host_pages.py: 1 GiB in
0.3266 s, rapidsai/dask-cuda PR #98). Hand-computed on the tiny profile (pageable D2H 0.5 GB/s,
no latency; pinned 1 GB/s; memcpy 10 GB/s; DRAM 100 GB/s)."""

from __future__ import annotations

import pytest

from offsim import simulate
from offsim.config.loading import load_strategy
from offsim.config.run import RunConfig, make_run_config
from offsim.core.enums import Link, Res
from offsim.plan import host_pages
from offsim.schedule.ops import Flow

MIB = 2**20
TOUCH_S_PER_BYTE = 0.3266 / 2**30  # dask-cuda PR #98: a new 1 GiB numpy array touched in 0.3266 s


def _cfg(vocab: int | None = None, mode: str = "cpu_upcast_blocking") -> RunConfig:
    st = load_strategy("zero-infinity-cpu").model_copy(update={"z3_fp32_grad_copy": mode})
    cfg = make_run_config("tiny", "tiny", st)
    if vocab is None:
        return cfg
    model = cfg.workload.model.model_copy(update={"vocab": vocab})
    return cfg.model_copy(update={"workload": cfg.workload.model_copy(update={"model": model})})


def _boundary_d2h_s(cfg: RunConfig) -> tuple[float, float]:
    """(bytes, seconds) of the last gradient D2H of the last iteration: the boundary copy (one
    bucket holds the whole tiny model at the default 5e8 elements, flushed after layer 0)."""
    result = simulate(cfg)
    assert result.metrics.feasible, result.metrics.infeasible_reason
    spans = result.spans()
    last = spans[(spans.iteration == spans.iteration.max()) & (spans.kind == "grad_offload")
                 & (spans.resource == "d2h")].sort_values("start_s")
    row = last.iloc[-1]
    return row.bytes, row.end_s - row.start_s


def test_only_temporaries_of_32_mib_or_more_are_fresh() -> None:
    """glibc's DEFAULT_MMAP_THRESHOLD_MAX (32 MiB on 64-bit): 32 MiB and 100 MiB are new
    mappings, 32 MiB - 1 B reuses the heap: 132 MiB."""
    assert host_pages.fresh_bytes([32 * MIB, 32 * MIB - 1, 100 * MIB]) == 132 * MIB
    assert host_pages.first_touch_s(2**30, 2**30 / 0.3266) == pytest.approx(0.3266)


def test_first_touch_runs_in_series_with_the_copy() -> None:
    """A 1e9 B pageable D2H capped at 0.5 GB/s (2 s) with 2**29 B of fresh pages: 2 + 0.1633 s,
    cap 1e9 / 2.1633 B/s; DRAM gains 2**29 / 1e9 of a byte per byte (the kernel's zeroing)."""
    flow = Flow(10**9, ((Res.D2H, 1.0), (Res.DRAM, 3.0), (Res.MEMCPY, 2.0)), 5e8, (Link.D2H,), copy_engine=True)
    got = host_pages.with_first_touch(flow, 2**29, 2**30 / 0.3266)
    assert got.nbytes / got.cap_bytes_per_s == pytest.approx(2.0 + 0.1633)
    assert dict(got.usage) == pytest.approx({Res.D2H: 1.0, Res.DRAM: 3.0 + 2**29 / 1e9, Res.MEMCPY: 2.0})
    assert host_pages.with_first_touch(flow, 0.0, 2**30 / 0.3266) is flow


def test_tiny_tensors_below_the_threshold_pay_no_fault() -> None:
    """tiny's largest tensors are 8,388,608 elements (16 MiB in bf16): the boundary D2H is the
    pageable copy alone, 2 B x 67,118,080 elements / 0.5 GB/s = 0.26847232 s."""
    nbytes, seconds = _boundary_d2h_s(_cfg())
    assert nbytes == 2 * 67_118_080
    assert seconds == pytest.approx(2 * 67_118_080 / 5e8, rel=1e-9)


def test_embedding_and_head_of_32_mib_fault_their_pages() -> None:
    """vocab 16384: embedding and head weight 1024 x 16384 = 16,777,216 elements, 32 MiB each in
    bf16, both fresh; the blocks' 1,048,576- and 4,194,304-element tensors are not. Elements:
    16,777,216 + 4 x 12,584,960 + (1024 + 16,777,216) = 83,895,296; D2H 167,790,592 B at 0.5 GB/s
    = 0.335581184 s, plus 64 MiB faulted in: 0.0625 x 0.3266 = 0.0204125 s; 0.355993684 s."""
    nbytes, seconds = _boundary_d2h_s(_cfg(vocab=16384))
    assert nbytes == 2 * 83_895_296
    assert seconds == pytest.approx(2 * 83_895_296 / 5e8 + 64 * MIB * TOUCH_S_PER_BYTE, rel=1e-9)


def test_releases_with_a_gpu_cast_pay_no_fault() -> None:
    """v0.16.3+ cast on the GPU and copy fp32 into the preallocated (pinned) fp32 gradient: no
    new host temporary. gpu_upcast_blocking, vocab 16384: 4 B x 83,895,296 / 1 GB/s (pinned)
    = 0.335581184 s."""
    nbytes, seconds = _boundary_d2h_s(_cfg(vocab=16384, mode="gpu_upcast_blocking"))
    assert nbytes == 4 * 83_895_296
    assert seconds == pytest.approx(4 * 83_895_296 / 1e9, rel=1e-9)
