"""dllm issue 9 (github.com/ZHZisZZ/dllm/issues/9): LLaDA-8B-Instruct under DeepSpeed ZeRO-2 on
2 x A100 40GB, 'CUDA out of memory. Tried to allocate 14.9 GiB' during ZeRO optimizer state
initialization.

The case states the configuration whose log that is: ZeRO-2 WITHOUT optimizer offload, as dllm's
scripts/accelerate_configs/deepspeed_zero2.yaml @ f8d72374 sets it (offload_optimizer_device none).
DeepSpeed stage_1_and_2.py DeepSpeedZeroOptimizer.__init__ (v0.16.3, the version dllm's
requirements.txt pinned on the issue's date, and v0.18.0 alike) holds on the GPU the flat 16-bit
buffer (2 B x P), this rank's fp32 master partition (4 B x P/2) and, in
initialize_optimizer_states, its fp32 gradient (torch.zeros(partition_size, fp32,
device=self.device), 4 B x P/2; self.device is 'cpu' only with offload_optimizer): three requests
of 2P bytes each, the third of which fails on a 40 GB A100.
"""

from __future__ import annotations

import pytest

from offsim.core.units import GiB
from offsim.fit_check import footprint
from offsim.plan.footprint import state_sizes
from offsim.validation import Outcome, ValidationCase, case_config, default_cases_path, load_cases, run_case

CASE_ID = "dllm9-llada8b-2xa100-zero2-gpu-oom"

# LLaDA 8B, Nie et al. 2025 (arXiv 2502.09992) Table 5: 32 layers, d 4096, 32 heads and 32
# key/value heads (full-size K and V projections), FFN 12288 (SwiGLU: three matrices), vocabulary
# 126464, input embedding and output layer untied; two RMSNorm weights per layer and a final one.
LAYERS, HIDDEN, FFN, VOCAB = 32, 4096, 12288, 126464
PER_LAYER = 4 * HIDDEN * HIDDEN + 3 * HIDDEN * FFN + 2 * HIDDEN  # 218,112,000
PARAMS = 2 * VOCAB * HIDDEN + LAYERS * PER_LAYER + HIDDEN  # 8,015,581,184


def _case() -> ValidationCase:
    (case,) = [c for c in load_cases(default_cases_path()) if c.id == CASE_ID]
    return case


def test_the_case_is_the_run_without_offload() -> None:
    """The logged request is a GPU allocation made only without offload: the case must say so."""
    case = _case()
    cfg = case_config(case)
    assert case.outcome is Outcome.OOM
    assert case.known_miss is None
    assert cfg.strategy.zero_stage == 2
    assert cfg.strategy.placement.optimizer_states == "gpu"
    assert cfg.strategy.optimizer_device == "gpu"
    assert cfg.workload.training.data_parallel == 2


def test_parameter_count_and_the_logged_request() -> None:
    """offsim's count is Table 5's hand count; one rank's fp32 partition, 4 B x P / 2 = 2P bytes
    = 16,031,162,368 B = 14.93 GiB, is the log's 'Tried to allocate 14.9 GiB'."""
    cfg = case_config(_case())
    assert PARAMS == 8_015_581_184
    assert state_sizes(cfg).params_total == PARAMS
    fp32_partition_bytes = 4 * PARAMS / 2
    assert round(fp32_partition_bytes / GiB, 1) == 14.9
    gpu = footprint(cfg).breakdown["gpu"]
    assert gpu["params (16-bit)"] == 2 * PARAMS
    # fp32 master, exp_avg and exp_avg_sq of this rank's half: 12 B x P / 2 = 6P
    assert gpu["optimizer state"] == 12 * PARAMS / 2
    # the step's fp32 gradient of the partition: the initialize_optimizer_states request
    assert gpu["step temporaries (flattened and fp32 gradients of a sub-group)"] == fp32_partition_bytes


def test_offsim_rejects_it_on_the_gpu() -> None:
    """Already the three initialization requests (3 x 14.93 = 44.79 GiB) exceed the 40 GiB
    profile; offsim's verdict is out of memory on the GPU tier."""
    case = _case()
    cfg = case_config(case)
    assert cfg.hardware.gpu.memory_bytes < 3 * 2 * PARAMS
    result = run_case(case)
    assert not result.feasible
    assert result.verdict_ok
    assert result.infeasible_reason is not None and result.infeasible_reason.startswith("gpu memory")


# The reporter's CPU-offload attempt ('still OOM', no log) with DeepSpeed 0.16.3's behaviour: the
# Accelerate-built ds_config leaves overlap_comm at the stage-2 default (false) and pin_memory at
# 0.16.3's default (false); v0.14.1-v0.16.9 upload the fp32 partition to the GPU before the cast
# (stage_1_and_2.py step: bit16_partitions[partition_id].data.copy_(fp32_partition.to(device)),
# z12_lp_upload fp32_pinned_gpu_cast), v0.15.2-v0.18.9 accumulate with drop_middle.
OFFLOAD_0163 = {"strategy.overlap_grad_offload": False, "strategy.pin_memory": False,
                "strategy.z12_lp_upload": "fp32_pinned_gpu_cast",
                "strategy.system_options": {"z12_accum_mode": "drop_middle"}}


@pytest.mark.xfail(strict=True, reason=(
    "the footprint holds the activations kept for backward through the step (offsim/mechanisms/"
    "activations.py footprint: moment None) and adds the step's transients on top (mechanisms/base.py "
    "sum_needs); DeepSpeed's step runs after the last backward has freed them, so the GPU peak is the "
    "larger of the backward's and the step's, not their sum"))
def test_the_step_upload_does_not_meet_the_activations() -> None:
    """With DeepSpeed 0.16.3's upload the GPU holds in backward 2P (16-bit) + activations +
    working memory + buckets + reserve, at the step 2P + 2P (the fp32 partition, 4 B x P/2) +
    buckets + reserve: the peak is the larger (about 28.6 and 33.3 GiB), not 2P + 2P + activations
    (43.5 GiB, which offsim now rejects, short by 5.16 +- 1.49 GiB)."""
    base = _case()
    case = base.model_copy(update={"strategy": "zero-offload",
                                   "overrides": {**base.overrides, **OFFLOAD_0163}})
    for key in ("strategy.zero_stage", "strategy.gpu_adam"):
        case.overrides.pop(key)
    fp = footprint(case_config(case))
    gpu = fp.breakdown["gpu"]
    upload = gpu["fp32 partition uploaded before its GPU cast"]
    assert upload == 4 * PARAMS / 2
    kept = gpu["activations kept for backward"]
    work = gpu["backward working memory (recompute, activation gradients)"]
    held = sum(gpu.values()) - upload - kept - work
    backward = held + kept + work
    step = held + upload
    assert fp.need_bytes["gpu"] == max(backward, step)
