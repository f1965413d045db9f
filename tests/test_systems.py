"""Published offloading systems: each preset against its baseline on a profile like the paper's
testbed, asserting the direction and a generous range of the headline claim (citation beside
each). Claims offsim does not reproduce are expected failures with the reason; nothing is tuned
to pass.
"""

from __future__ import annotations

import pytest

from offsim import load_profile, load_strategy, load_workload, make_run_config, simulate
from offsim.metrics import RunMetrics


def run(hardware: str, workload, strategy: str) -> RunMetrics:
    m = simulate(make_run_config(hardware, workload, strategy)).metrics
    assert m.feasible, m.infeasible_reason
    return m


def variant(name: str, **training) -> object:
    wl = load_workload(name)
    return wl.model_copy(update={"training": wl.training.model_copy(update=training)})


def test_zero_offload_dpu_hides_the_cpu_step() -> None:
    """ZeRO-Offload (arXiv 2101.06840) Sec. 4.3: DPU overlaps the CPU step of iteration i with
    forward/backward of i+1, so the step time becomes max(fwd+bwd, CPU step) instead of the sum."""
    base = run("rtx4090-pcie4-ws", "llama2-7b", "zero-offload")
    dpu = run("rtx4090-pcie4-ws", "llama2-7b", "zero-offload-dpu")
    speedup = base.iteration_time_s / dpu.iteration_time_s
    assert 1.05 <= speedup <= 2.0
    assert dpu.iteration_time_s >= dpu.phases_s.forward + dpu.phases_s.backward


def test_zero_offload_moves_4m_bytes_per_step() -> None:
    """ZeRO-Offload Sec. 6.2.2: 2M bytes of fp16 gradients down and 2M of fp16 params up."""
    m = run("dgx2-v100", variant("zero-offload-10b", grad_accumulation=1), "zero-offload")
    params = load_workload("zero-offload-10b").model.total_params
    assert m.traffic_bytes.d2h == pytest.approx(2 * params)
    assert m.traffic_bytes.h2d == pytest.approx(2 * params)


def test_zero_infinity_bandwidth_centric_partitioning() -> None:
    """ZeRO-Infinity (arXiv 2104.07857) Sec. 6.1: with dp ranks each GPU fetches only its 1/dp
    slice over its own PCIe link and the slices are all-gathered over NVLink/NVSwitch."""
    one = run("dgx2-v100", variant("llama2-7b", data_parallel=1), "zero-infinity-cpu")
    sixteen = run("dgx2-v100", variant("llama2-7b", data_parallel=16), "zero-infinity-cpu")
    assert sixteen.traffic_bytes.h2d == pytest.approx(one.traffic_bytes.h2d / 16, rel=1e-6)
    assert sixteen.traffic_bytes.gpu_link > 0


def test_lsp_offload_cuts_iteration_time_vs_zero_offload() -> None:
    """LSP-Offload (arXiv 2406.10181) Fig. 6a text: per-iteration latency 50% lower than
    ZeRO-Offload (RTX 4090 workstation, 7B). Generous range: 25% to 75% lower."""
    zo = run("rtx4090-pcie4-ws", "llama2-7b", "zero-offload")
    lsp = run("rtx4090-pcie4-ws", "llama2-7b", "lsp-offload")
    reduction = 1 - lsp.iteration_time_s / zo.iteration_time_s
    assert 0.25 <= reduction <= 0.75
    assert lsp.traffic_bytes.d2h < zo.traffic_bytes.d2h


def test_memascend_lowers_peak_pinned_host_memory() -> None:
    """MemAscend (arXiv 2505.23254): exact-size pinned buffers instead of power-of-two rounding
    lower peak system memory, with the same data movement (direction)."""
    ds = run("rtx4090-pcie4-ws", "llama2-13b", "zero-infinity-nvme")
    ma = run("rtx4090-pcie4-ws", "llama2-13b", "memascend")
    assert ma.peak_bytes.host_pinned < ds.peak_bytes.host_pinned
    assert ma.peak_bytes.host < ds.peak_bytes.host
    assert ma.traffic_bytes == ds.traffic_bytes


@pytest.mark.xfail(strict=True, reason=(
    "MemAscend reports 55.7% lower peak system memory on average; offsim models only the "
    "allocator's power-of-two rounding (about 14% here), not fragmentation, staging spikes or "
    "file-system overhead"))
def test_memascend_headline_reduction() -> None:
    ds = run("rtx4090-pcie4-ws", "llama2-13b", "zero-infinity-nvme")
    ma = run("rtx4090-pcie4-ws", "llama2-13b", "memascend")
    assert 0.35 <= 1 - ma.peak_bytes.host / ds.peak_bytes.host <= 0.75


def test_superoffload_overlaps_the_cpu_step_on_gh200() -> None:
    """SuperOffload (DeepSpeed blog): on GH200 the CPU step runs during backward, so the
    iteration is shorter than ZeRO-Offload's (direction)."""
    zo = run("gh200-superchip", "llama2-13b", "zero-offload")
    so = run("gh200-superchip", "llama2-13b", "superoffload")
    assert so.iteration_time_s < zo.iteration_time_s


def test_tba_moves_activations_to_nvme_and_lowers_gpu_memory() -> None:
    """TBA / SSDTrain (arXiv 2408.10013): activations go to NVMe, lowering GPU memory (direction)."""
    wl = variant("llama2-7b", activation_checkpointing=False)
    keep = run("h200-sxm-node", wl, "gpu-only")
    tba = run("h200-sxm-node", wl, "tba-ssdtrain")
    assert tba.peak_bytes.gpu < keep.peak_bytes.gpu
    assert tba.traffic_bytes.nvme_write > 0 and tba.traffic_bytes.nvme_read == pytest.approx(tba.traffic_bytes.nvme_write)


@pytest.mark.xfail(strict=True, reason=(
    "TBA claims negligible overhead; on the h200-sxm-node profile a Llama-2 7B block computes in "
    "~2.4 ms while its ~0.56 GB of activations take ~21 ms to write at 26 GB/s, so offsim predicts "
    "a several-fold slowdown. TBA's testbed (GPU, SSD count, model width) was not read"))
def test_tba_overhead_is_negligible() -> None:
    wl = variant("llama2-7b", activation_checkpointing=False)
    keep = run("h200-sxm-node", wl, "gpu-only")
    tba = run("h200-sxm-node", wl, "tba-ssdtrain")
    assert tba.iteration_time_s <= 1.2 * keep.iteration_time_s


def _fuyou_13b(micro_batch: int):
    """Fuyou's benchmark shape (workloads/fuyou-gpt3-13b.yaml) at ``micro_batch`` sequences."""
    wl = load_workload("fuyou-gpt3-13b")
    return wl.model_copy(update={"training": wl.training.model_copy(update={"micro_batch": micro_batch})})


def _zero_infinity_cpu_checkpointing():
    """ZeRO-Infinity as Fuyou/LoHan ran it (ICDE'25 slides): parameters and optimizer state on
    NVMe, block-input checkpoints offloaded to DRAM (DeepSpeed ``cpu_checkpointing``)."""
    st = load_strategy("zero-infinity-nvme")
    return st.model_copy(update={"placement": st.placement.model_copy(update={"activations": "cpu"})})


def test_fuyou_beats_zero_infinity_at_the_same_batch() -> None:
    """Fuyou (arXiv 2403.06504, abstract: 156 vs 45 TFLOPS for GPT-3 13B on an RTX 4090; LoHan v2:
    2.32x over the best baseline): direction, at batch 32 on the artifact's testbed (12 SSDs).
    Fuyou overlaps the SSD traffic of the optimizer step with backward, ZeRO-Infinity runs it
    after backward. Generous range around the claims: 1.2x to 6x."""
    wl = _fuyou_13b(32)
    zi = run("fuyou-4090-testbed", wl, _zero_infinity_cpu_checkpointing())
    fy = run("fuyou-4090-testbed", wl, "fuyou")
    assert 1.2 <= fy.tflops_per_gpu / zi.tflops_per_gpu <= 6.0


@pytest.mark.xfail(strict=True, reason=(
    "Fuyou reports 156 vs 45 TFLOPS over ZeRO-Infinity for GPT-3 13B on an RTX 4090 (3.5x; LoHan, "
    "v2 of the paper, says 2.32x). On the artifact's testbed (12 SSDs) offsim reproduces Fuyou's own "
    "figures at batch 32-64 (validation/cases.yaml fuyou-4090-13b-*: 141-143 vs 143-156 hardware "
    "TFLOPS) but predicts ZeRO-Infinity (CPU checkpointing) at 95 hardware / 71 model TFLOPS at batch "
    "32, its largest batch that fits, so Fuyou's best over ZeRO-Infinity's best is ~1.5x. The paper's "
    "45 TFLOPS run (its batch and DeepSpeed configuration) is not published in what was read"))
def test_fuyou_headline_over_zero_infinity() -> None:
    fy = run("fuyou-4090-testbed", _fuyou_13b(64), "fuyou")
    zi = run("fuyou-4090-testbed", _fuyou_13b(32), _zero_infinity_cpu_checkpointing())
    assert 2.0 <= fy.hardware_tflops_per_gpu / zi.hardware_tflops_per_gpu <= 6.0


def _with_dram_gib(profile: str, gib: float):
    hw = load_profile(profile)
    return hw.model_copy(update={"dram": hw.dram.model_copy(update={"capacity_gib": gib})})


def test_fuyou_fits_gpt3_175b_on_a_4090_with_256_gb() -> None:
    """LoHan (Fuyou v2, arXiv 2403.06504v2, abstract): the first to fine-tune a 175B model on an
    RTX 4090 with 256 GB main memory. The out-of-core optimizer consumes gradients as they
    arrive (4 layer buffers); a whole-model fp32 gradient buffer (650 GiB) would not fit."""
    hw = _with_dram_gib("fuyou-4090-testbed", 256.0)
    fy = run(hw, "gpt3-175b", "fuyou")
    assert fy.peak_bytes.host < 256 * 2**30
    whole = load_strategy("fuyou").model_copy(update={"layerwise_grad_buffers": None})
    m = simulate(make_run_config(hw, "gpt3-175b", whole)).metrics
    assert not m.feasible and m.infeasible_tier == "host_pinned"


@pytest.mark.xfail(strict=True, reason=(
    "Fuyou/LoHan report that ZeRO-Infinity cannot fine-tune GPT-3 175B on the same RTX 4090 box; "
    "offsim's zero-infinity-nvme keeps parameters, gradients and optimizer state on NVMe and needs "
    "~17 GiB of host memory, so it fits (at ~1040 s per iteration vs Fuyou's ~830 s). What makes "
    "the real run fail (the secondary summary says ZeRO-Infinity keeps activations in DRAM; its "
    "batch size and DeepSpeed configuration were not read) is not modelled"))
def test_zero_infinity_cannot_fit_gpt3_175b_on_the_4090_box() -> None:
    m = simulate(make_run_config(_with_dram_gib("fuyou-4090-testbed", 256.0), "gpt3-175b",
                                 "zero-infinity-nvme")).metrics
    assert not m.feasible
