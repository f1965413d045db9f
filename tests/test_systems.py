"""Published offloading systems: each preset against its baseline on a profile like the paper's
testbed, asserting the direction and a generous range of the headline claim (citation beside
each). Claims offsim does not reproduce are expected failures with the reason; nothing is tuned
to pass.
"""

from __future__ import annotations

import pytest

from offsim import load_profile, load_strategy, load_workload, make_run_config, simulate
from offsim.metrics import RunMetrics


def run(hardware: str, workload, strategy) -> RunMetrics:
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


#: the DeepSpeed config of the paper's scripts (DeepSpeedExamples Megatron-LM/model_size_test*,
#: validation case zo-v100-1gpu-10b-tflops): overlap_comm off, 5e7 buckets, v0.3.x behaviour
PAPER_SCRIPTS = {"overlap_grad_offload": False, "reduce_bucket_params": 5e7, "lp_copy": "fused_zero_copy",
                 "system_options": {"z12_accum_mode": "v1", "ipg_buffer_factor": 4.5}}


def test_zero_offload_release_moves_8m_bytes_per_step() -> None:
    """ZeRO-Offload Sec. 6.2.2 counts 2M bytes of fp16 gradients down and 2M of fp16 params up;
    the v0.3.x release its scripts ran copies the gradient as fp32 (stage2.py
    async_inplace_copy_grad_to_fp32_buffer_from_gpu: GPU .float(), then a 4 B D2H) and its fused CPU
    Adam step has the GPU read the fp32 parameters over PCIe (custom_cuda_kernel.cu
    param_update_kernel, 4 B), so one micro-batch per step moves 4M down and 4M up; with the
    separate cast of later releases 2M up."""
    st = load_strategy("zero-offload").model_copy(update=PAPER_SCRIPTS)
    m = run("dgx2-v100", variant("zero-offload-10b", grad_accumulation=1), st)
    params = load_workload("zero-offload-10b").model.total_params
    assert m.traffic_bytes.d2h == pytest.approx(4 * params)
    assert m.traffic_bytes.h2d == pytest.approx(4 * params)
    cast = run("dgx2-v100", variant("zero-offload-10b", grad_accumulation=1),
               st.model_copy(update={"lp_copy": "separate_cast"}))
    assert cast.traffic_bytes.h2d == pytest.approx(2 * params)


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
    assert tba.traffic_bytes.nvme_write > 0
    assert tba.traffic_bytes.nvme_read == pytest.approx(tba.traffic_bytes.nvme_write)


#: TBA's Fig. 6 shapes (hidden, layers) of its BERT/GPT/T5 runs (Sec. IV-B), TP 2 on the testbed.
TBA_SHAPES = [(8192, 4), (12288, 3), (16384, 2)]
_STATIC_GPU = ("reserved", "params", "grads", "optimizer state")


def _tba_bert(hidden: int, layers: int):
    wl = load_workload("tba-bert-12k")
    model = wl.model.model_copy(update={"hidden": hidden, "ffn_hidden": 4 * hidden, "heads": hidden // 128,
                                        "layers": layers})
    return wl.model_copy(update={"model": model})


def _tba_pair(hidden: int, layers: int) -> tuple[RunMetrics, RunMetrics, float, float]:
    """Keep-all and TBA on the TBA testbed, with each run's peak activation memory: the GPU peak
    less weights, gradients, optimizer state and the reserved bytes (how TBA measures it:
    max_memory_allocated minus model state, K-Wu/Megatron-DeepSpeed megatron/training.py)."""
    from offsim.fit_check import footprint

    out = []
    for strategy in ("gpu-only", "tba-ssdtrain"):
        cfg = make_run_config("tba-a100-optane", _tba_bert(hidden, layers), strategy)
        m = simulate(cfg).metrics
        assert m.feasible, m.infeasible_reason
        static = sum(v for k, v in footprint(cfg).breakdown["gpu"].items() if k.startswith(_STATIC_GPU))
        out.append((m, m.peak_bytes.gpu - static))
    (keep, keep_act), (tba, tba_act) = out
    return keep, tba, keep_act, tba_act


@pytest.mark.parametrize(("hidden", "layers"), TBA_SHAPES)
def test_tba_overhead_is_negligible(hidden: int, layers: int) -> None:
    """TBA / SSDTrain (arXiv 2408.10013, DAC'25 Sec. IV-B: "almost no performance overhead in all
    cases"): on its testbed (A100 PCIe 40GB at base clock, Optane RAID-0 through GDS, TP 2) the
    activation writes hide under forward and the reads under backward. Generous: within 10%."""
    keep, tba, _, _ = _tba_pair(hidden, layers)
    assert tba.iteration_time_s <= 1.10 * keep.iteration_time_s
    assert tba.traffic_bytes.nvme_write > 0
    # GPUDirect Storage: the writes cross PCIe but stage nothing in host memory
    assert tba.traffic_bytes.d2h == pytest.approx(tba.traffic_bytes.nvme_write)
    assert tba.peak_bytes.host_pinned == 0


def test_tba_lowers_peak_activation_memory_on_the_4_layer_model() -> None:
    """TBA Sec. IV-B: peak activation memory 28%-40% lower in the Fig. 6 cases (47% "up to" in
    the abstract). Generous range 20%-60% for the (8192, 4) shape (offsim: ~36%)."""
    _, _, keep_act, tba_act = _tba_pair(8192, 4)
    assert 0.20 <= 1 - tba_act / keep_act <= 0.60


@pytest.mark.xfail(strict=True, reason=(
    "TBA reports 28%-40% lower peak activation memory for every Fig. 6 shape; offsim gets 36.0% at "
    "(8192, 4) but 14.8% at (12288, 3) and 3.7% at (16384, 2) (measured 2026-11-25): it frees a block's "
    "activations only when its whole backward ends and prefetches whole blocks, so with 2-3 blocks the "
    "last block and the one coming back are both resident at the peak. TBA's tensor cache works per "
    "module (attention, MLP) and frees tensors inside a block's backward. Not expressible in a system "
    "file yet: the compiled schedule's smallest unit is one layer's forward or backward op "
    "(offsim/systems/_compile.py) and offsim/mechanisms/activations.py frees a layer's activations after "
    "its backward op (Stage.AFTER); per-module freeing needs sub-layer compute ops from the compiler and "
    "the compute mechanism, outside a system file, and TBA's adaptive keep rule a policy over them"))
@pytest.mark.parametrize(("hidden", "layers"), TBA_SHAPES[1:])
def test_tba_lowers_peak_activation_memory_on_every_shape(hidden: int, layers: int) -> None:
    _, _, keep_act, tba_act = _tba_pair(hidden, layers)
    assert 0.20 <= 1 - tba_act / keep_act <= 0.60


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


#: micro-batches tried for ZeRO-Infinity's best on the Fuyou testbed (its largest that fits is 56
#: in this tree: 60 is short by 1.74 ± 1.12 GiB of GPU memory)
_ZI_BATCHES = (32, 48, 56, 64)


def _best_hardware_tflops(wl_batches, strategy) -> tuple[int, float]:
    """The micro-batch with the most hardware TFLOPS of ``strategy`` on the Fuyou testbed, among
    those that fit, and that figure."""
    best = (0, 0.0)
    for mb in wl_batches:
        m = simulate(make_run_config("fuyou-4090-testbed", _fuyou_13b(mb), strategy)).metrics
        if m.feasible and m.hardware_tflops_per_gpu > best[1]:
            best = (mb, m.hardware_tflops_per_gpu)
    return best


@pytest.mark.xfail(strict=True, reason=(
    "Fuyou reports 156 vs 45 TFLOPS over ZeRO-Infinity for GPT-3 13B on an RTX 4090 (3.5x; LoHan, "
    "v2 of the paper, says 2.32x). On the artifact's testbed (12 SSDs) offsim reproduces Fuyou's own "
    "figures at batch 32-64 (validation/cases.yaml fuyou-4090-13b-*; 142.7 hardware / 107.0 model "
    "TFLOPS at batch 64, every block recomputed: GPU memory admits no swap there) but predicts "
    "ZeRO-Infinity (CPU checkpointing) at 101.2 hardware / 75.9 model TFLOPS at batch 56, its largest "
    "batch that fits (82.6 at batch 32), so Fuyou's best over ZeRO-Infinity's best is 1.41x (1.73x "
    "against batch 32). The paper's 45 TFLOPS run (its batch and DeepSpeed configuration) is not "
    "published in what was read"))
def test_fuyou_headline_over_zero_infinity() -> None:
    fy = run("fuyou-4090-testbed", _fuyou_13b(64), "fuyou")
    zi_batch, zi_tflops = _best_hardware_tflops(_ZI_BATCHES, _zero_infinity_cpu_checkpointing())
    assert zi_batch > 0
    assert 2.0 <= fy.hardware_tflops_per_gpu / zi_tflops <= 6.0


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


def test_zero_infinity_cannot_fit_gpt3_175b_on_the_4090_box() -> None:
    """Fuyou / LoHan (arXiv 2403.06504 v1 abstract: ZeRO-Infinity's "limited trainable model size
    due to CPU memory capacity"; v2: 175B on an RTX 4090 with 256 GB): ZeRO-Infinity does not fit.
    The reason offsim finds is DeepSpeed's own: ZeRO-3 with an offloaded optimizer pins one 16-bit
    gradient buffer for the whole partition (stage3.py grad_partitions_flat_buffer), 350 GB for
    175B, rounded up by the caching host allocator. (The GPU is also short, marginally: 0.99 ±
    1.10 GiB since ZeRO-3's three reduce buckets in flight are counted, b3b46f4, and the GPU is
    the tier the verdict names first; the host's pinned need is checked on the footprint.)"""
    from offsim.fit_check import footprint

    cfg = make_run_config(_with_dram_gib("fuyou-4090-testbed", 256.0), "gpt3-175b", "zero-infinity-nvme")
    assert not simulate(cfg).metrics.feasible
    fp = footprint(cfg)
    assert fp.need_bytes["host_pinned"] > fp.capacity_bytes["host_pinned"]
    largest = max(fp.breakdown["host_pinned"].items(), key=lambda kv: kv[1])
    assert "grad_partitions_flat_buffer" in largest[0]
    assert largest[1] > fp.capacity_bytes["host_pinned"]  # that buffer alone does not fit
