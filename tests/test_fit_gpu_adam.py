"""The optimizer step's GPU temporaries by Adam implementation (footprint.gpu_step_transient_bytes),
hand-computed, and what they do to the verdict of LLaMA-Factory issue 5977 (ZeRO-3 without offload
of Llama 3 8B on 8 x RTX 3090: out of memory)."""

from __future__ import annotations

import pytest

from offsim.config.run import RunConfig
from offsim.core.units import GiB
from offsim.fit_check import footprint
from offsim.plan.footprint import Footprint, GpuVerdict, gpu_margin, gpu_step_transient_bytes, state_sizes
from offsim.validation import case_config, default_cases_path, load_cases

CASE = "lf5977-llama3-8b-8x3090-zero3-oom"
STEP_ITEM = "step temporaries (flattened and fp32 gradients of a sub-group)"


def _case(gpu_adam: str, **strategy: object) -> RunConfig:
    cfg = case_config({c.id: c for c in load_cases(default_cases_path())}[CASE])
    return cfg.model_copy(update={"strategy": cfg.strategy.model_copy(update={"gpu_adam": gpu_adam, **strategy})})


def test_zero3_sub_group_temporaries_by_adam() -> None:
    # Llama 3 8B: 8,030,261,248 parameters / 8 ranks = 1,003,782,656 per rank > sub_group_size 1e9,
    # so a sub-group is 1e9 elements. Cast: 1e9 x (2 B bf16 flat + 4 B fp32) = 6.0e9 B.
    # FusedAdam: fp32 gradient only, 4.0e9 < 6.0e9 -> 6.0e9 B.
    # torch AdamW: fp32 gradient + exp_avg_sq_sqrt (4 B) = 8.0e9 B > 6.0e9 -> 8.0e9 B.
    fused, torch_adam = _case("fused"), _case("torch")
    assert gpu_step_transient_bytes(fused, state_sizes(fused)) == pytest.approx(6.0e9)
    assert gpu_step_transient_bytes(torch_adam, state_sizes(torch_adam)) == pytest.approx(8.0e9)


def test_small_sub_group_and_below_zero3() -> None:
    # sub_group_size 1e8: cast 1e8 x 6 = 6e8 B; torch: 1e8 x 8 = 8e8 B.
    cfg = _case("torch", sub_group_params=1.0e8)
    assert gpu_step_transient_bytes(cfg, state_sizes(cfg)) == pytest.approx(8.0e8)
    # ZeRO-2: the fp32 gradient partition is steady state; torch's sqrt temporary spans the
    # rank's whole partition: 8,030,261,248 / 8 x 4 B = 4,015,130,624 B; FusedAdam: 0.
    z2 = _case("torch", zero_stage=2)
    assert gpu_step_transient_bytes(z2, state_sizes(z2)) == pytest.approx(8_030_261_248 / 8 * 4)
    z2f = _case("fused", zero_stage=2)
    assert gpu_step_transient_bytes(z2f, state_sizes(z2f)) == 0.0


def test_cpu_optimizer_has_no_gpu_step_temporaries() -> None:
    cfg = _case("torch", optimizer_device="cpu")
    assert gpu_step_transient_bytes(cfg, state_sizes(cfg)) == 0.0


def test_torch_adamw_temporary_turns_lf5977_out_of_memory() -> None:
    # The footprint with the step's need as gpu_step_transient_bytes says for torch AdamW (the HF
    # Trainer's adamw_torch; LLaMA-Factory's ds_z3_config.json has no optimizer section): 2.0e9 B
    # (1.86 GiB) above the cast phase. Hand: A grows by 1.86 GiB, F by 4% of that, so the spare
    # X falls by 1.04 x 1.86 = 1.94 GiB; from "short by 0.83 +- 1.10 GiB" (marginal) to short by
    # ~2.77 +- 1.14 GiB: out of memory.
    cfg = _case("torch")
    sz = state_sizes(cfg)
    fp = footprint(cfg, sz)
    gpu = dict(fp.breakdown["gpu"])
    before = gpu_margin(fp)
    extra = gpu_step_transient_bytes(cfg, sz) - gpu[STEP_ITEM]
    gpu[STEP_ITEM] += extra
    after = gpu_margin(Footprint({**fp.need_bytes, "gpu": fp.need_bytes["gpu"] + extra}, fp.capacity_bytes,
                                 {**fp.breakdown, "gpu": gpu}))
    assert extra == pytest.approx(2.0e9) or extra == 0.0  # 0 once the step declares it itself
    assert before.spare_bytes - after.spare_bytes == pytest.approx(1.04 * extra)
    assert after.verdict is GpuVerdict.OOM
    assert after.spare_bytes < -1.5 * GiB
