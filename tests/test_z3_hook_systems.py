"""Twin-Flow and SuperOffload on DeepSpeed ZeRO-3's gradient path (``Variants.deepspeed_grads``):
both run inside stage3.py's ``DeepSpeedZeroOptimizer_Stage3`` (Twin-Flow as
``offload_optimizer.ratio``, SuperOffload as the subclass ``SuperOffloadOptimizer_Stage3``), so
their gradients take the IPG buckets, the reduction stream and ``partition_grads``' host round
trip (deepspeed_runtime.md §3, §11). Hand-computed bytes per element, one micro-batch, one rank."""

from __future__ import annotations

import pytest

from offsim import load_strategy, make_run_config, simulate
from offsim.config.strategy import Strategy
from offsim.mechanisms.grads import REDUCTION_STREAM
from offsim.plan.footprint import state_sizes
from offsim.systems import superoffload, twin_flow


def _strategy(preset: str, **update: object) -> Strategy:
    st = load_strategy(preset)
    return Strategy.model_validate({**st.model_dump(), **update})


def _clipped() -> Strategy:
    return _strategy("superoffload", optimizer_schedule="after-backward")


def test_superoffload_with_clipping_is_deepspeed_zero3_offload_by_hand() -> None:
    """SuperOffload with clipping (after-backward step) on gh200, Llama-2 7B, one micro-batch:
    per element of the rank's partition P (= every parameter, dp 1), D2H 2 B (the round trip's
    16-bit copy into ``grad_partitions_flat_buffer``) + 4 B (the boundary's fp32 copy into the CPU
    gradient) = 6 P; H2D 2 B (``grad_buffer.to(device)`` back) + 2 B (the updated 16-bit
    parameters) = 4 P. Before it was composed (z3hook) both were 2 P."""
    cfg = make_run_config("gh200-superchip", "llama2-7b", _clipped())
    assert cfg.workload.training.grad_accumulation == 1
    sz = state_sizes(cfg)
    p = sz.params_total / sz.grad_part
    m = simulate(cfg).metrics
    assert m.feasible
    assert m.traffic_bytes.d2h == pytest.approx(6 * p, rel=1e-6)
    assert m.traffic_bytes.h2d == pytest.approx(4 * p, rel=1e-6)


def test_superoffload_speculative_step_keeps_the_layerwise_path() -> None:
    """The speculative step (layerwise, clipping 0) keeps offsim's layer-wise update: no
    reduction stream of DeepSpeed's buckets (the gap superoffload.py's docstring states)."""
    cfg = make_run_config("gh200-superchip", "llama2-7b", "superoffload")
    grads = superoffload.compose(cfg).mechanisms["grads"]
    assert not getattr(grads, "buckets", ())
    clip = make_run_config("gh200-superchip", "llama2-7b", _clipped())
    bucketed = superoffload.compose(clip).mechanisms["grads"]
    assert getattr(bucketed, "buckets", ())
    assert REDUCTION_STREAM in {s.name for s in bucketed.setup().streams}


def test_twin_flow_takes_deepspeed_buckets() -> None:
    """Twin-Flow's gradients go through DeepSpeed ZeRO-3's reduce buckets and reduction stream."""
    cfg = make_run_config("a100-80gb-pcie4", "dos-7b", _strategy("twin-flow", optimizer_gpu_fraction=0.6))
    grads = twin_flow.compose(cfg).mechanisms["grads"]
    assert getattr(grads, "buckets", ())
    assert REDUCTION_STREAM in {s.name for s in grads.setup().streams}
