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

import dataclasses

import pytest

from offsim import simulate
from offsim.core.enums import Tier
from offsim.core.units import GiB
from offsim.fit_check import footprint
from offsim.mechanisms.base import Moment, Need, sum_needs
from offsim.plan.footprint import state_sizes
from offsim.systems._compile import System
from offsim.systems._registry import compose
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


def _offload_case() -> ValidationCase:
    """The reporter's CPU-offload attempt with DeepSpeed 0.16.3's behaviour (``OFFLOAD_0163``).
    With the step's peak apart from backward's, offsim finds it fits on the 40 GB A100 (33.26 GiB,
    5.47 +- 1.29 GiB to spare), against the reporter's 'still OOM', which has no log, version or
    configuration: not a case, so not a figure offsim is judged on."""
    base = _case()
    case = base.model_copy(update={"strategy": "zero-offload",
                                   "overrides": {**base.overrides, **OFFLOAD_0163}})
    for key in ("strategy.zero_stage", "strategy.gpu_adam"):
        case.overrides.pop(key)
    return case


def _gpu_needs(system: System) -> dict[str, Need]:
    needs = [n for m in system.mechanisms.values() for n in m.footprint() if n.tier is Tier.GPU]
    assert len({n.what for n in needs}) == len(needs)  # one need per item here
    return {n.what: n for n in needs}


def test_the_step_upload_does_not_meet_the_activations() -> None:
    """With DeepSpeed 0.16.3's upload the GPU holds in backward 2P (16-bit) + activations +
    working memory + buckets + reserve, at the step 2P + 2P (the fp32 partition, 4 B x P/2) +
    the offload buffer + reserve (the IPG buckets are freed at backward's end: stage_1_and_2.py
    ``_release_ipg_buffers``): the peak is the larger (28.55 and 32.33 GiB), not 2P + 2P +
    activations (43.49 GiB, which offsim rejected, short by 5.16 +- 1.49 GiB, while the
    activations were held through the step)."""
    cfg = case_config(_offload_case())
    needs = _gpu_needs(compose(cfg))
    upload = needs["fp32 partition uploaded before its GPU cast"]
    assert upload.nbytes == 4 * PARAMS / 2 and upload.moment is Moment.STEP
    kept = needs["activations kept for backward"]
    work = needs["backward working memory (recompute, activation gradients)"]
    assert kept.moment is work.moment is Moment.FORWARD_BACKWARD
    held = sum(n.nbytes for n in needs.values() if n.moment is None)
    # reserve 1.50 + 16-bit params 2P 14.93 + the offload buffer (126464 x 4096 x 2 B) 0.96 GiB
    assert round(held / GiB, 2) == 17.40
    ipg = needs["ZeRO-2 IPG bucket buffer(s)"]  # 5e8 x 2 B = 0.93 GiB, backward only
    assert ipg.moment is Moment.FORWARD_BACKWARD
    backward = held + kept.nbytes + work.nbytes + ipg.nbytes  # + activations 9.75 + work 0.48 GiB
    step = held + upload.nbytes
    assert (round(backward / GiB, 2), round(step / GiB, 2)) == (28.55, 32.33)
    fp = footprint(cfg)
    assert fp.need_bytes["gpu"] == max(backward, step) == step
    assert "activations kept for backward" not in fp.breakdown["gpu"]  # the peak is the step's


def test_the_simulated_step_peak_is_under_the_footprint() -> None:
    """The engine's ledger agrees with the footprint: the run is feasible and its GPU peak is the
    step's, reserve + 2P + 2P + the offload buffer (allocated once at start-up and kept:
    stage_1_and_2.py ``__init__``) = 1.50 + 14.93 + 14.93 + 0.96 = 32.33 GiB, the footprint's
    figure."""
    cfg = case_config(_offload_case())
    result = simulate(cfg)
    assert result.feasible
    reserve = cfg.hardware.gpu.reserved_bytes
    offload = _gpu_needs(compose(cfg))["ZeRO-2 offload gradient buffer (temp_grad_buffer_for_gpu_offload)"]
    assert offload.nbytes == 126464 * 4096 * 2 and offload.moment is None
    assert result.metrics.peak_bytes.gpu == pytest.approx(reserve + 2 * PARAMS + 4 * PARAMS / 2 + offload.nbytes,
                                                          abs=1)
    assert footprint(cfg).need_bytes["gpu"] == pytest.approx(result.metrics.peak_bytes.gpu, abs=1)


def test_with_the_delayed_update_the_upload_meets_the_activations() -> None:
    """The delayed parameter update runs the step beside the next iteration's forward and
    backward (ZeRO-Offload, arXiv 2101.06840 Sec. 4.3): the same upload declared by a delayed
    optimizer is held, so the GPU need is the sum, 18.33 + 9.75 + 0.48 + 14.93 = 43.49 GiB."""
    cfg = case_config(_offload_case())
    system = compose(cfg)
    delayed = dataclasses.replace(system.mechanisms["optimizer"], delayed=True)
    needs = _gpu_needs(dataclasses.replace(system, mechanisms={**system.mechanisms, "optimizer": delayed}))
    assert needs["fp32 partition uploaded before its GPU cast"].moment is None
    bd = sum_needs(list(needs.values()), cfg.hardware.gpu.memory_bytes)
    assert round(sum(bd["gpu"].values()) / GiB, 2) == 43.49
