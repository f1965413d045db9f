"""DeepSpeed ZeRO-3's step waits for each sub-group's updated 16-bit parameters (issue 23 part 1).

``stage3.py::step`` runs, per sub-group, ``unscale_and_clip_grads`` -> ``_optimizer_step`` (CPU
Adam) -> ``_reassign_or_swap_out_fp16_params`` -> ``_release_sub_group``. With the parameters on
the GPU the middle call is ``fp16_partitioned_groups_flat[i].data.copy_(fp32...)``: a CPU -> GPU
copy with a dtype change, which PyTorch runs as a CPU cast into a fresh pageable tensor followed by
a blocking copy of it (Copy.cu ``copy_kernel_cuda``; deepspeed_runtime.md section 13, step 4).
With the parameters on NVMe it is ``_partitioned_params_swap_out``, a synchronous write (section 7).
So the next sub-group starts only once the upload (or write) is done, and the upload runs at the
pageable rate whatever ``pin_memory`` says. ZeRO-1/2 (v0.17+, PR #7309) casts into a staging buffer
and issues a non_blocking H2D, which runs beside the next sub-group.

Hand timelines on ``tiny`` (tests/test_timelines.py's three 5e8-parameter layers): the rank's
1.5e9 parameters in two sub-groups of 7.5e8 (``sub_group_params`` 7.5e8). Per sub-group:
unscale 7.5e8 x 8 B = 6 GB at DRAM's 100 GB/s = 0.06 s; CPU Adam at 1e9 params/s = 0.75 s (its
7.5e8 x 28 B = 21 GB of DRAM take 0.21 s: the CPU binds); cast 7.5e8 x 6 B = 4.5 GB = 0.045 s;
upload 7.5e8 x 2 B = 1.5 GB at the pageable 0.5 GB/s = 3 s (NVMe write at 0.5 GB/s: 3 s too).
"""

from __future__ import annotations

import dataclasses

import pytest

from offsim.config.run import RunConfig
from offsim.mechanisms.cpu_optimizer import CpuOptimizer
from offsim.plan.footprint import state_sizes
from offsim.plan.model import Layer
from offsim.systems._parts import build_ctx, optimizer
from offsim.trace import Recorder
from tests.conftest import strategy
from tests.test_timelines import PARAMS, _big_gpu, _run

STEP_KINDS = ("cpu", "dram_copy", "h2d", "nvme_write")


def _step_spans(tiny_profile, tiny_workload, st) -> tuple[Recorder, list[tuple[str, float, float]]]:
    """The run's optimizer-step spans on the step's resources, as (name, start, end) from the step's start."""
    rec = _run(tiny_profile, tiny_workload, st, fwd_s=0.25, bwd_s=0.5)
    spans = sorted((s for s in rec.spans if s.phase == "optimizer" and s.resource in STEP_KINDS),
                   key=lambda s: s.start_s)
    t0 = spans[0].start_s
    return rec, [(s.name, round(s.start_s - t0, 9), round(s.end_s - t0, 9)) for s in spans]


def _step(tiny_profile, tiny_workload, stage: int, params: str) -> tuple[Recorder, list[tuple[str, float, float]]]:
    st = strategy(zero_stage=stage, prefetch_depth=0, optimizer_device="cpu", sub_group_params=7.5e8,
                  placement={"params": params, "grads": "cpu", "optimizer_states": "cpu", "activations": "gpu"})
    return _step_spans(tiny_profile, tiny_workload, st)


def test_zero3_step_waits_for_each_pageable_upload(tiny_profile, tiny_workload) -> None:
    """From the step's start t0: sub-group 0 unscale [0, 0.06], Adam [0.06, 0.81], the cast's
    first touch of its new 1.5e9 B temporary (offsim/plan/host_pages.py: >= 32 MiB, fresh pages at
    2**30 B per 0.3266 s on one thread, x 7.6 / 3.1 on tiny's 4 cores: 0.186103984 s)
    [0.81, 0.996103984], cast [0.996103984, 1.041103984], upload [1.041103984, 4.041103984];
    sub-group 1 only then, 4.041103984 s later. The step is 2 x 4.041103984 = 8.082207969 s (with
    a pinned upload beside the next sub-group it would have been 0.855 + 0.855 + 1.5 = 3.21 s at
    best, before the touch)."""
    rec, spans = _step(tiny_profile, tiny_workload, 3, "gpu")
    assert spans == [
        ("unscale gradients, sub-group 0", 0.0, 0.06), ("CPU Adam sub-group 0", 0.06, 0.81),
        ("cast to 16-bit, sub-group 0", 0.81, 0.996103984),
        ("cast to 16-bit, sub-group 0", 0.996103984, 1.041103984),
        ("sub-group 0 params", 1.041103984, 4.041103984),
        ("unscale gradients, sub-group 1", 4.041103984, 4.101103984),
        ("CPU Adam sub-group 1", 4.101103984, 4.851103984),
        ("cast to 16-bit, sub-group 1", 4.851103984, 5.037207969),
        ("cast to 16-bit, sub-group 1", 5.037207969, 5.082207969),
        ("sub-group 1 params", 5.082207969, 8.082207969)]
    step = [end - start for _, name, start, end in rec.phases if name == "optimizer"]
    assert step == [pytest.approx(8.082207969)]


def test_zero3_parameters_on_nvme_are_written_before_the_next_sub_group(tiny_profile, tiny_workload) -> None:
    """``_partitioned_params_swap_out`` is synchronous: 1.5 GB at tiny's 0.5 GB/s NVMe write
    [0.855, 3.855], then sub-group 1 as above, its write [4.71, 7.71]."""
    _, spans = _step(tiny_profile, tiny_workload, 3, "nvme")
    assert [(n, a, b) for n, a, b in spans if "params" in n] == [
        ("sub-group 0 params", 0.855, 3.855), ("sub-group 1 params", 4.71, 7.71)]
    assert ("unscale gradients, sub-group 1", 3.855, 3.915) in spans


def test_zero2_upload_runs_beside_the_next_sub_group(tiny_profile, tiny_workload) -> None:
    """ZeRO-1/2 (stage_1_and_2.py, v0.17+: non_blocking H2D of a staging buffer): sub-group 1's
    unscale starts when sub-group 0's cast ends (0.855), while sub-group 0's upload runs."""
    _, spans = _step(tiny_profile, tiny_workload, 2, "gpu")
    start = {n: a for n, a, _ in spans}
    assert start["unscale gradients, sub-group 1"] == pytest.approx(0.855)
    assert start["sub-group 0 params"] == pytest.approx(0.855)


def test_adam_moves_28_bytes_when_the_cast_is_its_own_pass(tiny_profile, tiny_workload) -> None:
    """``ds_adam_step`` reads p, g, m, v and writes p, m, v in fp32: 28 B per parameter
    (deepspeed_runtime.md section 5, "Bytes"); the 16-bit write belongs to the cast pass
    (6 B: read fp32, write 16-bit). 7.5e8 x 28 = 21e9 B per sub-group (30 B, 22.5e9, counted the
    16-bit write twice), cast 4.5e9 B, after the first touch of its new 16-bit temporary, 7.5e8 x
    2 B = 1.5e9 B (offsim/plan/host_pages.py), on the cast's track."""
    st = strategy(zero_stage=3, prefetch_depth=0, optimizer_device="cpu", sub_group_params=7.5e8,
                  placement={"params": "gpu", "grads": "cpu", "optimizer_states": "cpu", "activations": "gpu"})
    rec = _run(tiny_profile, tiny_workload, st, fwd_s=0.25, bwd_s=0.5)
    adam = [s.bytes for s in rec.spans if s.name.startswith("CPU Adam")]
    cast = [s.bytes for s in rec.spans if s.name.startswith("cast to 16-bit")]
    assert adam == [pytest.approx(21e9)] * 2
    assert cast == [pytest.approx(1.5e9), pytest.approx(4.5e9)] * 2


def _z12(tiny_profile, tiny_workload, upload: str):
    st = strategy(zero_stage=2, prefetch_depth=0, optimizer_device="cpu", sub_group_params=7.5e8, z12_lp_upload=upload,
                  placement={"params": "gpu", "grads": "cpu", "optimizer_states": "cpu", "activations": "gpu"})
    return _step_spans(tiny_profile, tiny_workload, st)


def test_zero2_before_v0_14_1_casts_on_the_cpu_and_uploads_pageable_blocking(tiny_profile, tiny_workload) -> None:
    """``z12_lp_upload: cpu_cast_pageable`` (v0.9.0-v0.14.0: ``copy_`` from the fp32 master, a CPU
    cast into a pageable temporary, then a blocking H2D): per sub-group unscale 0.06, Adam 0.75,
    the cast's first touch of its new 1.5e9 B temporary 0.186103984 (offsim/plan/host_pages.py),
    cast 0.045, upload 1.5 GB at 0.5 GB/s 3 s, all in series: 4.041103984 s each, as ZeRO-3."""
    _, spans = _z12(tiny_profile, tiny_workload, "cpu_cast_pageable")
    assert [(n, a, b) for n, a, b in spans if "params" in n] == [
        ("sub-group 0 params", 1.041103984, 4.041103984), ("sub-group 1 params", 5.082207969, 8.082207969)]


def test_zero2_v0_14_1_to_v0_16_9_uploads_fp32_and_casts_on_the_gpu(tiny_profile, tiny_workload) -> None:
    """``z12_lp_upload: fp32_pinned_gpu_cast`` (PR #5301: a blocking ``.to(gpu)`` of the pinned
    fp32 master, the cast on the GPU): no CPU cast pass; per sub-group unscale 0.06, Adam 0.75,
    upload 7.5e8 x 4 B = 3 GB at the pinned 1 GB/s, 3 s: [0.81, 3.81], then [4.62, 7.62]. The
    3 GB fp32 copy is held on the GPU while it uploads (a STEP-moment need of the footprint)."""
    rec, spans = _z12(tiny_profile, tiny_workload, "fp32_pinned_gpu_cast")
    assert not [n for n, _, _ in spans if n.startswith("cast to 16-bit")]
    assert [(n, a, b) for n, a, b in spans if "params" in n] == [
        ("sub-group 0 params", 0.81, 3.81), ("sub-group 1 params", 4.62, 7.62)]
    assert [s.bytes for s in rec.spans if "params" in s.name and s.phase == "optimizer"] == [3e9, 3e9]


def test_the_fp32_upload_is_a_gpu_need_of_the_step(tiny_profile, tiny_workload) -> None:
    """The footprint holds the largest sub-group's fp32 copy on the GPU at the step (7.5e8 x 4 B =
    3e9 B) with fp32_pinned_gpu_cast, and nothing of the kind with the current staged upload."""
    def needs(upload: str) -> list[float]:
        st = strategy(zero_stage=2, prefetch_depth=0, optimizer_device="cpu", sub_group_params=7.5e8,
                      z12_lp_upload=upload,
                      placement={"params": "gpu", "grads": "cpu", "optimizer_states": "cpu", "activations": "gpu"})
        cfg = RunConfig(hardware=_big_gpu(tiny_profile), workload=tiny_workload, strategy=st, iterations=1,
                        warmup_iterations=0)
        layers = tuple(Layer(i, f"block{i}", PARAMS, 0.0, 0.25, 0.5, 0.0, 0.0) for i in range(3))
        sz = dataclasses.replace(state_sizes(cfg), layers=layers, params_total=3 * PARAMS,
                                 param_bytes=3 * PARAMS * 2.0, grad_bytes=3 * PARAMS * 2.0)
        opt = optimizer(build_ctx(cfg, sz))
        assert isinstance(opt, CpuOptimizer)
        return [n.nbytes for n in opt.footprint() if n.what.startswith("fp32 partition uploaded")]
    assert needs("fp32_pinned_gpu_cast") == [3e9]
    assert needs("staged_lp") == []
