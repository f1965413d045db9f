"""Fresh pageable host pages, one rule for every blocking dtype-changing copy (offsim/plan/host_pages.py).

glibc serves a request of at least its mmap threshold with a new mapping, and the dynamic
threshold never rises above DEFAULT_MMAP_THRESHOLD_MAX (32 MiB on 64-bit; malloc.c, mallopt(3)),
so a host temporary of 32 MiB or more is fresh pages on every call. The first touch of those pages
runs at the profile's ``cpu.page_touch_gb_per_s`` (default 1 GiB per 0.3266 s, rapidsai/dask-cuda
PR #98). Two copies make such a temporary: ZeRO-3's boundary 16-bit D2H (v0.6.0-v0.15.3, the
driver's copy touches it) and the step's blocking upload of the updated 16-bit parameters (ZeRO-3
with parameters on the GPU, and ZeRO-1/2's ``cpu_cast_pageable``, v0.9.0-v0.14.0: the CPU cast
``src.to(dst dtype)`` writes it). Hand-computed on ``tiny`` (DRAM 100 GB/s, pageable 0.5 GB/s).
"""

from __future__ import annotations

import pytest

from offsim.config.loading import load_profile
from offsim.config.run import RunConfig
from offsim.core.enums import Res
from offsim.plan import host_pages
from offsim.systems import _part_optimizer as po
from offsim.systems._parts import build_ctx
from tests.conftest import strategy
from tests.test_step_upload import STEP_KINDS
from tests.test_timelines import _run
from tests.test_zero3_first_touch import _boundary_d2h_s, _cfg

MIB = 2**20
DASK_98_BYTES_PER_S = 2**30 / 0.3266  # 1 GiB touched in 0.3266 s by one thread
#: a 7.5e8-parameter sub-group's 16-bit temporary, 1.5e9 B, touched by the cast on tiny's 4 cores:
#: x min(4, 7.6 / 3.1) (kvcache-ai/Mooncake PR #3939's 8-thread saturation): 0.186103984 s
TOUCH_S = 1.5e9 / (DASK_98_BYTES_PER_S * 7.6 / 3.1)


def _with_touch_rate(cfg: RunConfig, gb_per_s: float) -> RunConfig:
    cpu = cfg.hardware.cpu.model_copy(update={"page_touch_gb_per_s": gb_per_s})
    return cfg.model_copy(update={"hardware": cfg.hardware.model_copy(update={"cpu": cpu})})


def test_profile_default_is_dask_cuda_98() -> None:
    """A profile that says nothing touches at 2**30 / 0.3266 = 3,287,635,713 B/s."""
    cpu = load_profile("tiny").cpu
    assert cpu.page_touch_bytes_per_s == pytest.approx(DASK_98_BYTES_PER_S, rel=1e-12)
    assert cpu.page_touch_gb_per_s == pytest.approx(3.2876, abs=1e-4)


def test_glibc_threshold_cap_decides_what_is_fresh() -> None:
    """32 MiB is always mapped afresh; 32 MiB - 1 B is served from the heap once the dynamic
    threshold has risen (a freed mapped chunk of at most 32 MiB raises it to that size)."""
    assert host_pages.MMAP_THRESHOLD_MAX_BYTES == 4 * 1024 * 1024 * 8  # 4 MiB x sizeof(long)
    assert host_pages.fresh_bytes([32 * MIB - 1]) == 0
    assert host_pages.fresh_bytes([32 * MIB, 20 * MIB]) == 32 * MIB
    assert host_pages.first_touch_s(10**9, 5e9) == pytest.approx(0.2)


def test_boundary_touch_reads_the_profile_rate() -> None:
    """tests/test_zero3_first_touch.py's vocab-16384 boundary (167,790,592 B D2H, 64 MiB fresh) on
    a host with transparent huge pages, 5 GB/s (dask-cuda #106): 0.335581184 + 2**26 / 5e9 =
    0.335581184 + 0.0134217728 = 0.3490029568 s."""
    nbytes, seconds = _boundary_d2h_s(_with_touch_rate(_cfg(vocab=16384), 5.0))
    assert nbytes == 2 * 83_895_296
    assert seconds == pytest.approx(0.3490029568, rel=1e-9)


def test_touch_flow_is_capped_at_the_rate_and_writes_dram() -> None:
    """1.5e9 B at one thread's rate: 1.5e9 x 0.3266 / 2**30 = 0.456254929 s; one DRAM write per byte."""
    flow = host_pages.touch_flow(1_500_000_000, DASK_98_BYTES_PER_S)
    assert flow.nbytes / flow.cap_bytes_per_s == pytest.approx(0.456254929)
    assert dict(flow.usage) == {Res.DRAM: 1.0}


def test_threads_fault_side_by_side_up_to_the_measured_saturation() -> None:
    """One thread: the rate; two: twice it; 4 or 64: 7.6 / 3.1 = 2.4516x (Mooncake #3939)."""
    rate = 1e9
    assert host_pages.threaded_touch_bytes_per_s(rate, 1) == rate
    assert host_pages.threaded_touch_bytes_per_s(rate, 2) == 2 * rate
    assert host_pages.threaded_touch_bytes_per_s(rate, 4) == pytest.approx(2.4516129e9)
    assert host_pages.threaded_touch_bytes_per_s(rate, 64) == pytest.approx(2.4516129e9)


def test_one_thread_per_rank_touches_at_the_profile_rate(tiny_profile, tiny_workload) -> None:
    """cpu_adam_threads_per_rank 1 (OMP_NUM_THREADS=1): the cast faults on one thread, 0.456254929 s
    per 7.5e8-parameter sub-group."""
    spans = _upload_spans(tiny_profile, tiny_workload, 3, cpu_adam_threads_per_rank=1)
    assert _same_timeline(spans, _expected(1.5e9 / DASK_98_BYTES_PER_S))


def _upload_spans(tiny_profile, tiny_workload, stage: int, **fields: object) -> list[tuple[str, float, float]]:
    """The step's host and transfer spans from its start (tests/test_step_upload.py's setup:
    three 5e8-parameter layers, two sub-groups of 7.5e8, parameters on the GPU)."""
    st = strategy(zero_stage=stage, prefetch_depth=0, optimizer_device="cpu", sub_group_params=7.5e8,
                  placement={"params": "gpu", "grads": "cpu", "optimizer_states": "cpu", "activations": "gpu"},
                  **fields)
    rec = _run(tiny_profile, tiny_workload, st, fwd_s=0.25, bwd_s=0.5)
    spans = sorted((s for s in rec.spans if s.phase == "optimizer" and s.resource in STEP_KINDS),
                   key=lambda s: s.start_s)
    t0 = spans[0].start_s
    return [(s.name, round(s.start_s - t0, 9), round(s.end_s - t0, 9)) for s in spans]


def _expected(t: float) -> list[tuple[str, float, float]]:
    """tests/test_step_upload.py's two sub-groups of 7.5e8 parameters with ``t`` seconds of first
    touch between CPU Adam and the cast: unscale 0.06, Adam 0.75, touch t, cast 0.045, blocking
    pageable upload 1.5 GB / 0.5 GB/s = 3 s; sub-group 1 starts at 3.855 + t."""
    rows, t0 = [], 0.0
    for g in (0, 1):
        a, b = t0 + 0.81, t0 + 0.81 + t
        rows += [(f"unscale gradients, sub-group {g}", t0, t0 + 0.06), (f"CPU Adam sub-group {g}", t0 + 0.06, a)]
        if t:
            rows.append((f"cast to 16-bit, sub-group {g}", a, b))
        rows += [(f"cast to 16-bit, sub-group {g}", b, b + 0.045), (f"sub-group {g} params", b + 0.045, b + 3.045)]
        t0 = b + 3.045
    return rows


def _same_timeline(got: list[tuple[str, float, float]], want: list[tuple[str, float, float]]) -> bool:
    """Same span names in order, start and end within 2 ns (the spans are rounded to 1 ns)."""
    return [n for n, _, _ in got] == [n for n, _, _ in want] and all(
        abs(a - c) < 2e-9 and abs(b - d) < 2e-9 for (_, a, b), (_, c, d) in zip(got, want, strict=True))


def test_zero3_upload_faults_its_cast_temporary(tiny_profile, tiny_workload) -> None:
    """ZeRO-3, parameters on the GPU: each sub-group's cast writes a new 1.5e9 B temporary
    (stage3.py _reassign_or_swap_out_partitioned_parameters; Copy.cu src.to(dst dtype)):
    0.186103984 s more per sub-group, the step 2 x (3.855 + 0.186103984) = 8.082207969 s."""
    spans = _upload_spans(tiny_profile, tiny_workload, 3)
    assert _same_timeline(spans, _expected(TOUCH_S))
    assert spans[-1][2] == pytest.approx(2 * (3.855 + TOUCH_S))


def test_zero12_cpu_cast_pageable_faults_too(tiny_profile, tiny_workload) -> None:
    """ZeRO-2 with v0.9.0-v0.14.0's upload (stage_1_and_2.py step: bit16_partitions[...].copy_(
    fp32_partition)): the same blocking timeline and touch as ZeRO-3's."""
    spans = _upload_spans(tiny_profile, tiny_workload, 2, z12_lp_upload="cpu_cast_pageable")
    assert _same_timeline(spans, _expected(TOUCH_S))


@pytest.mark.parametrize(("mode", "casts"), [("staged_lp", 1), ("fp32_pinned_gpu_cast", 0)])
def test_zero12_later_uploads_make_no_temporary(tiny_profile, tiny_workload, mode: str, casts: int) -> None:
    """v0.17.0+ (#7309: the CPU cast into a preallocated staging buffer, its one pass) and
    v0.14.1-v0.16.9 (#5301: fp32 to the GPU, cast there, no CPU pass) allocate no host temporary
    per call: no touch pass beside the cast."""
    spans = _upload_spans(tiny_profile, tiny_workload, 2, z12_lp_upload=mode)
    assert sum(1 for n, _, _ in spans if n == "cast to 16-bit, sub-group 0") == casts


def _ctx(tiny_profile, tiny_workload, stage: int, params: str = "gpu", **fields: object):
    st = strategy(zero_stage=stage, optimizer_device="cpu", sub_group_params=1e7,
                  placement={"params": params, "grads": "cpu", "optimizer_states": "cpu", "activations": "gpu"},
                  **fields)
    big = tiny_profile.model_copy(update={"gpu": tiny_profile.gpu.model_copy(update={"memory_gib": 64.0})})
    return build_ctx(RunConfig(hardware=big, workload=tiny_workload, strategy=st, iterations=1, warmup_iterations=0))


def test_which_calls_make_a_fresh_temporary(tiny_profile, tiny_workload) -> None:
    """tiny's rank holds 67,118,080 parameters (134 MB of bf16). ZeRO-3 copies per sub-group:
    16,777,216 parameters make 32 MiB (fresh), 1e7 make 20 MB (heap). ZeRO-1/2 copies the rank's
    whole partition once per parameter group: 134 MB, fresh, so a 1e7 share counts (2e7 B).
    Parameters on NVMe go home by a write: none."""
    z3 = _ctx(tiny_profile, tiny_workload, 3)
    assert po.upload_fresh_bytes(z3, 16_777_216) == 32 * MIB
    assert po.upload_fresh_bytes(z3, 1e7) == 0
    z2 = _ctx(tiny_profile, tiny_workload, 2, z12_lp_upload="cpu_cast_pageable")
    assert po.upload_fresh_bytes(z2, 1e7) == 20_000_000
    assert po.upload_fresh_bytes(_ctx(tiny_profile, tiny_workload, 3, params="nvme"), 16_777_216) == 0
