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

import pytest

from offsim.trace import Recorder
from tests.conftest import strategy
from tests.test_timelines import _run

STEP_KINDS = ("cpu", "dram_copy", "h2d", "nvme_write")


def _step(tiny_profile, tiny_workload, stage: int, params: str) -> tuple[Recorder, list[tuple[str, float, float]]]:
    st = strategy(zero_stage=stage, prefetch_depth=0, optimizer_device="cpu", sub_group_params=7.5e8,
                  placement={"params": params, "grads": "cpu", "optimizer_states": "cpu", "activations": "gpu"})
    rec = _run(tiny_profile, tiny_workload, st, fwd_s=0.25, bwd_s=0.5)
    spans = sorted((s for s in rec.spans if s.phase == "optimizer" and s.resource in STEP_KINDS),
                   key=lambda s: s.start_s)
    t0 = spans[0].start_s
    return rec, [(s.name, round(s.start_s - t0, 9), round(s.end_s - t0, 9)) for s in spans]


def test_zero3_step_waits_for_each_pageable_upload(tiny_profile, tiny_workload) -> None:
    """From the step's start t0: sub-group 0 unscale [0, 0.06], Adam [0.06, 0.81], cast
    [0.81, 0.855], upload [0.855, 3.855]; sub-group 1 only then: [3.855, 3.915], [3.915, 4.665],
    [4.665, 4.71], upload [4.71, 7.71]. The step is 2 x 3.855 = 7.71 s (with a pinned upload
    beside the next sub-group it would have been 0.855 + 0.855 + 1.5 = 3.21 s at best)."""
    rec, spans = _step(tiny_profile, tiny_workload, 3, "gpu")
    assert spans == [
        ("unscale gradients, sub-group 0", 0.0, 0.06), ("CPU Adam sub-group 0", 0.06, 0.81),
        ("cast to 16-bit, sub-group 0", 0.81, 0.855), ("sub-group 0 params", 0.855, 3.855),
        ("unscale gradients, sub-group 1", 3.855, 3.915), ("CPU Adam sub-group 1", 3.915, 4.665),
        ("cast to 16-bit, sub-group 1", 4.665, 4.71), ("sub-group 1 params", 4.71, 7.71)]
    step = [end - start for _, name, start, end in rec.phases if name == "optimizer"]
    assert step == [pytest.approx(7.71)]


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
    16-bit write twice), cast 4.5e9 B."""
    st = strategy(zero_stage=3, prefetch_depth=0, optimizer_device="cpu", sub_group_params=7.5e8,
                  placement={"params": "gpu", "grads": "cpu", "optimizer_states": "cpu", "activations": "gpu"})
    rec = _run(tiny_profile, tiny_workload, st, fwd_s=0.25, bwd_s=0.5)
    adam = [s.bytes for s in rec.spans if s.name.startswith("CPU Adam")]
    cast = [s.bytes for s in rec.spans if s.name.startswith("cast to 16-bit")]
    assert adam == [pytest.approx(21e9)] * 2
    assert cast == [pytest.approx(4.5e9)] * 2
