"""Published headlines of the DeepSpeed-built seed systems (issue 18), each on its own testbed
profile, against its own baseline, with the factor it is held to beside its citation.

Twin-Flow (ZeRO-Offload++) and SuperOffload both claim "N times over ZeRO-Offload" in a DeepSpeed
blog; the blogs give the testbed and model, not the batch or every configuration key, so each test
states what it sets and why.
"""

from __future__ import annotations

import functools

import pytest

from offsim import load_strategy, load_workload, make_run_config, simulate
from offsim.config.strategy import Strategy
from offsim.config.workload import Workload
from offsim.metrics import RunMetrics


def _strategy(preset: str, **update) -> Strategy:
    st = load_strategy(preset)
    return Strategy.model_validate({**st.model_dump(), **update})


def _workload(name: str, **training) -> Workload:
    wl = load_workload(name)
    return wl.model_copy(update={"training": wl.training.model_copy(update=training)})


def _run(hardware: str, workload: Workload, strategy: Strategy | str) -> RunMetrics:
    return simulate(make_run_config(hardware, workload, strategy)).metrics


# ---------------------------------------------------------------- Twin-Flow
#: DeepSpeed ``offload_optimizer.ratio`` values the test tunes over ("with some tuning on offload
#: ratio", blog), applied as DeepSpeed does, in whole sub-groups (system_options ratio,
#: offsim/systems/twin_flow.py; stage3.py _create_fp32_partitions, deepspeed_runtime.md section 11).
TWIN_FLOW_RATIOS = (0.7, 0.5, 0.3, 0.1)


@functools.cache
def twin_flow_on_dgx_h100() -> tuple[float, float]:
    """(ratio 1.0, fastest tuned ratio that fits) iteration seconds: OPT-30B on h100-sxm5-gen5
    (8 x H100 SXM5 80 GB) at data parallel 8, the Megatron-DeepSpeed offload_pp template's
    configuration (ZeRO-3, offload_optimizer cpu, pin_memory, DeepSpeed's default sub_group_size
    1e9: 4 sub-groups per rank, so ratio 0.1 leaves 3 of them, 80.8% of the elements, on the GPU)."""
    hw, wl = "h100-sxm5-gen5", _workload("opt-30b", data_parallel=8)

    def at(ratio: float) -> RunMetrics:
        return _run(hw, wl, _strategy("twin-flow", optimizer_gpu_fraction=0.0, system_options={"ratio": ratio}))

    base = at(1.0)
    assert base.feasible, base.infeasible_reason
    tuned = [m.iteration_time_s for m in map(at, TWIN_FLOW_RATIOS) if m.feasible]
    assert tuned, "no Twin-Flow ratio fits"
    return base.iteration_time_s, min(tuned)


def test_twin_flow_beats_zero_offload_on_dgx_h100() -> None:
    """Direction of the blog's headline (below): the tuned ratio is faster than ratio 1.0."""
    base_s, best_s = twin_flow_on_dgx_h100()
    assert best_s < base_s


@pytest.mark.xfail(strict=True, reason=(
    "The Twin-Flow blog reports 6x for OPT-30B on a DGX-H100; offsim reaches 2.86x (7.67 s at ratio 1.0 -> "
    "2.68 s at ratio 0.1, measured 2026-11-25 once Twin-Flow takes DeepSpeed ZeRO-3's gradient path: IPG "
    "buckets flushed from their gradient hooks and every partition's host round trip, z3hook; 2.74x before) "
    "with DeepSpeed's "
    "whole-sub-group split at its default "
    "sub_group_size 1e9 (4 sub-groups per rank, at most 80.8% on the GPU for any ratio > 0). The blog "
    "publishes neither its batch, sequence length nor sub_group_size: with finer sub-groups the share "
    "could reach 90% (3.59x) or 95% (4.17x; 4.78x and 5.9x before the round trip was composed), so part of "
    "what is missing is the blog's configuration; the round trip every partition makes (GPU sub-groups' "
    "too) now bounds what a ratio can gain"))
def test_twin_flow_headline_over_zero_offload_on_dgx_h100() -> None:
    """DeepSpeed blog "ZeRO-Offload++: 6x Higher Training Throughput via Collaborative CPU/GPU
    Twin-Flow" (blogs/deepspeed-offloadpp/README.md, Performance Evaluation): OPT-30B on one
    DGX-H100-80GB (8 GPUs), "with some tuning on offload ratio", 6x over ZeRO-Offload (ratio 1.0:
    every sub-group on the CPU, ZeRO-3 as Twin-Flow requires). Held to the 6x within a factor of
    1.5 (4x to 9x). The blog's 3x for OPT-13B on a DGX-A100-40GB has no shipped 8 x A100-40GB
    profile."""
    base_s, best_s = twin_flow_on_dgx_h100()
    assert 4.0 <= base_s / best_s <= 9.0


# ---------------------------------------------------------------- SuperOffload
#: Fig. 1 of the blog varies sequence length and batch size; this grid is offsim's stand-in.
SUPEROFFLOAD_SHAPES = ((1, 2048), (4, 2048), (1, 4096), (4, 4096))


def superoffload_as_the_blog_ran() -> Strategy:
    """The blog's DeepSpeed: SuperOffload landed in v0.18.0 (PR #7559) and its runs predate
    v0.19.3 (PR #8068), which made ``gradient_clipping`` 1.0 the default; with clipping 0 the
    sub-groups' CPU Adam is enqueued during backward (superoffload_stage3.py partition_grads,
    deepspeed_runtime.md sections 0 and 11), i.e. the layer-wise schedule, set here explicitly."""
    return _strategy("superoffload", optimizer_schedule="layerwise")


@pytest.mark.xfail(strict=True, reason=(
    "The SuperOffload blog (DeepSpeed blogs/deepspeed-superoffload, Fig. 1) reports up to 4x over "
    "ZeRO-Offload on one GH200; offsim on gh200-superchip, Llama-2 13B, micro-batch 1-4 x sequence "
    "2048-4096, reaches at most 1.84x (mb 4, seq 4096: 5.01 -> 2.73 s; 1.37x at mb 1, seq 2048), "
    "measured 2026-11-25. Missing (offload_systems.md, SuperOffload): GraceAdam (the blog's 1.3x over "
    "CPU-Adam; not in DeepSpeed's tree, which builds CPU Adam __SCALAR__ on Arm, op_builder/builder.py "
    "simd_width, as the gh200-superchip profile derives its rate), the last buckets' step kept on the "
    "GPU, and casting on the GPU (offsim keeps DeepSpeed's CPU cast pass, lp_copy separate_cast); the "
    "DRAM-bound CPU step, overlapped with backward, bounds the iteration"))
def test_superoffload_headline_over_zero_offload_on_gh200() -> None:
    """Held to the blog's 4x within a factor of 2 (2x to 8x), the best shape of the grid."""
    ratios = []
    for micro_batch, seq_len in SUPEROFFLOAD_SHAPES:
        wl = _workload("llama2-13b", micro_batch=micro_batch, seq_len=seq_len)
        zo = _run("gh200-superchip", wl, "zero-offload")
        so = _run("gh200-superchip", wl, superoffload_as_the_blog_ran())
        assert zo.feasible and so.feasible, (zo.infeasible_reason, so.infeasible_reason)
        ratios.append(zo.iteration_time_s / so.iteration_time_s)
    assert min(ratios) > 1.0  # direction at every shape
    assert 2.0 <= max(ratios) <= 8.0
