"""The optimizer step's other costs (issue 23 part 1): DeepSpeed ZeRO-3's fp16 overflow check, a
CPU scan of the host gradient accumulator, and the delayed parameter update's wait for the
previous step counted as a GPU stall.

Overflow check (``stage3.py::step`` -> ``_overflow_check_and_loss_scale_update``, fp16 only ->
``has_overflow``: ``torch.isinf(grad_partitions_flat_buffer).any()``, ``torch.isnan(...).any()``,
``.item()``): isinf = ``abs() == inf`` (aten TensorCompare.cpp). Per fp16 element: abs reads
2 B and writes 2 B, ``==`` reads 2 B and writes a 1-byte mask, ``any`` reads 1 B; isnan reads
2 B and writes 1 B, ``any`` reads 1 B: 12 B (:func:`offsim.plan.cpu_adam.overflow_scan_bytes_per_param`).
"""

from __future__ import annotations

import dataclasses

import pytest

from offsim.config.run import RunConfig
from offsim.plan import cpu_adam
from offsim.plan.footprint import state_sizes
from offsim.plan.model import Layer
from offsim.simulation import run_schedule
from tests.conftest import strategy
from tests.test_timelines import PARAMS, STREAMED, C, _big_gpu, _c, _run


def _fp16(wl):
    pr = wl.precision.model_copy(update={"compute": "fp16", "params": "fp16", "grads": "fp16"})
    return wl.model_copy(update={"precision": pr})


def _step_spans(rec) -> list[tuple[str, float, float]]:
    return [(s.name, round(s.start_s, 9), round(s.end_s, 9)) for s in sorted(rec.spans, key=lambda s: s.start_s)
            if s.phase == "optimizer" and s.resource in ("cpu", "dram_copy")]


def test_overflow_scan_bytes() -> None:
    assert cpu_adam.overflow_scan_bytes_per_param(2.0) == 12.0
    assert cpu_adam.overflow_scan_bytes_per_param(2.0, fused=True) == 2.0


def test_fp16_zero3_step_starts_with_the_overflow_scan(tiny_profile, tiny_workload) -> None:
    """tests/test_timelines.py::test_transfer_bound_layers in fp16: backward ends at 16.286 + C s
    (16.25 s plus the three boundary fp64 norms on the reduction stream in series before each
    layer's fp32 D2H, 6343d29, offsim/systems/_part_grads.py: 5e8 x (2 + 8 + 8 + 2 + 4) B / 1e12
    B/s = 0.012 s each, 3 x 0.012 = 0.036 s; plus C = 0.166639544 s since the first bucket is
    flushed from the next layer's gradient hook, tests/test_timelines.py); the scan of the
    1.5e9-element accumulator, 1.5e9 x 12 B = 18 GB at DRAM's 100 GB/s = 0.18 s, runs
    [16.286, 16.466] + C; then each 7.5e8 sub-group: unscale 0.06, Adam 0.75, cast 0.045 s:
    [16.466, 17.321] + C and [17.321, 18.176] + C (was [16.25, 17.96] without the scan, and the
    scan [16.25, 16.43] without the norms)."""
    rec = _run(tiny_profile, _fp16(tiny_workload), strategy(**{**STREAMED, "sub_group_params": 7.5e8}),
               fwd_s=0.25, bwd_s=0.5)
    backward = [(n, s, e) for _, n, s, e in rec.phases if n == "backward"]
    assert backward == [("backward", 3.25, pytest.approx(16.286 + C))]
    assert _step_spans(rec) == [
        ("fp16 overflow check (isinf, isnan)", _c(16.286), _c(16.466)),
        ("unscale gradients, sub-group 0", _c(16.466), _c(16.526)), ("CPU Adam sub-group 0", _c(16.526), _c(17.276)),
        ("cast to 16-bit, sub-group 0", _c(17.276), _c(17.321)),
        ("unscale gradients, sub-group 1", _c(17.321), _c(17.381)), ("CPU Adam sub-group 1", _c(17.381), _c(18.131)),
        ("cast to 16-bit, sub-group 1", _c(18.131), _c(18.176))]


def test_bf16_runs_no_overflow_scan(tiny_profile, tiny_workload) -> None:
    """stage3.py skips the check unless the model dtype is fp16 (tiny is bf16)."""
    rec = _run(tiny_profile, tiny_workload, strategy(**STREAMED), fwd_s=0.25, bwd_s=0.5)
    assert not [s for s in rec.spans if "overflow" in s.name]


def test_delayed_update_wait_for_the_previous_step_is_a_stall(tiny_profile, tiny_workload) -> None:
    """ZeRO-Offload's DPU (arXiv 2101.06840 Sec. 4.3): from the second iteration, the compute
    stream waits at the end of backward for the previous step to finish (its last sub-group's
    parameters home) before the next forward. That idle GPU time is a stall like every other wait
    of the compute stream: it spans [end of iteration k's backward, end of step k-1]."""
    st = strategy(zero_stage=2, prefetch_depth=0, optimizer_device="cpu", delayed_param_update=True,
                  placement={"params": "gpu", "grads": "cpu", "optimizer_states": "cpu", "activations": "gpu"})
    cfg = RunConfig(hardware=_big_gpu(tiny_profile), workload=tiny_workload, strategy=st, iterations=3,
                    warmup_iterations=0)
    layers = tuple(Layer(i, f"block{i}", PARAMS, 0.0, 0.25, 0.5, 0.0, 0.0) for i in range(3))
    sz = dataclasses.replace(state_sizes(cfg), layers=layers, params_total=3 * PARAMS,
                             param_bytes=3 * PARAMS * 2.0, grad_bytes=3 * PARAMS * 2.0)
    rec = run_schedule(cfg, sz)[0]
    stalls = [s for s in rec.spans if s.resource == "gpu_stall" and "previous optimizer step" in s.name]
    assert [s.iteration for s in stalls] == [1, 2]
    backward_end = {it: end for it, name, _, end in rec.phases if name == "backward"}
    for s in stalls:
        step_end = max(x.end_s for x in rec.spans if x.iteration == s.iteration - 1 and x.phase == "optimizer"
                       and x.resource != "gpu_stall")
        assert (s.start_s, s.end_s) == (pytest.approx(backward_end[s.iteration]), pytest.approx(step_end))
        assert s.end_s > s.start_s  # the step (about 6 s) is longer than an iteration's 2.25 s of compute


def test_pipelined_write_waits_for_the_previous_write(tiny_profile, tiny_workload) -> None:
    """``pipeline_read``/``pipeline_write`` (pipelined_optimizer_swapper.py
    ``swap_out_optimizer_state``): sub-group i's async write is completed
    (``_complete_swap_out(ASYNC_SWAP_OUT)``) when sub-group i+1's swap-out begins, so at most one
    write is in flight and the step's thread waits for it.

    tiny with a fast NVMe (read 16 GB/s, write 4 GB/s), parameters on the CPU, three sub-groups of
    5e8: read 16 B x 5e8 = 8 GB, write 12 B x 5e8 = 6 GB. From the first read's start t0: read 0
    [0, 0.5]; read 1 (pipelined) [0.5, 1.0]; sub-group 0's unscale (4 GB at the 84 GB/s of DRAM the
    read leaves) [0.5, 0.5476], Adam 0.5 s, cast 3 GB at 100 GB/s, to 1.0776; write 0 and read 2
    then share the array, each at r with r/4 + r/16 = 1, r = 3.2 GB/s: write 0 ends at
    1.0776 + 6/3.2 = 2.9526, when read 2 has 2 GB left. Sub-group 1's cast ends at 1.6524, but its
    write starts only at 2.9526 (it would start at 1.6524 without the wait); shared with read 2 it
    moves 2 GB by 3.5776, then alone 4 GB at 4 GB/s: ends 4.5776. Sub-group 2 (read done at
    3.5776) is cast by 4.15; its write waits until 4.5776 and ends 1.5 s later, 6.0776."""
    p = tiny_profile.model_copy(update={"nvme": tiny_profile.nvme.model_copy(
        update={"read_gb_per_s": 16.0, "write_gb_per_s": 4.0})})
    st = strategy(zero_stage=3, prefetch_depth=0, optimizer_device="cpu", sub_group_params=5e8,
                  optimizer_swap_pipeline=True,
                  placement={"params": "cpu", "grads": "nvme", "optimizer_states": "nvme", "activations": "gpu"})
    rec = _run(p, tiny_workload, st, fwd_s=0.25, bwd_s=0.5)
    io = sorted((s for s in rec.spans if s.phase == "optimizer" and s.resource.startswith("nvme")),
                key=lambda s: s.start_s)
    t0 = io[0].start_s
    writes = [(round(s.start_s - t0, 4), round(s.end_s - t0, 4)) for s in io if s.resource == "nvme_write"]
    assert writes == [(1.0776, 2.9526), (2.9526, 4.5776), (4.5776, 6.0776)]
    assert rec.end_s == pytest.approx(t0 + 6.0776, abs=1e-4)
