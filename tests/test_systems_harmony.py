"""Harmony (Li et al., VLDB 2022, arXiv 2202.01306) against per-GPU swapping with virtualised
memory, on a commodity 8x GTX 1080 Ti server whose GPUs share one host swap path
(``harmony-8x1080ti``). Workload: GPT-2 XL (1.5B, one of the paper's models) in fp32, as Harmony
trained it, with activation checkpointing.

The mechanism: the baseline's every rank swaps the whole model through the shared uplink (swap
volume x N), Harmony swaps each byte over host links once and shares it GPU-to-GPU. Claims offsim
does not reproduce are expected failures with the reason; nothing is tuned to pass.
"""

from __future__ import annotations

import pytest

from offsim import load_workload, make_run_config, simulate
from offsim.config.workload import Workload
from offsim.metrics import RunMetrics

HW = "harmony-8x1080ti"
BASELINE = "virtual-memory-swap"


def gpt2_xl_fp32(gpus: int, grad_accumulation: int = 1) -> Workload:
    """GPT-2 XL on ``gpus`` data-parallel GPUs, micro-batch 1, fp32 math and state."""
    wl = load_workload("gpt2-1.5b")
    training = wl.training.model_copy(update={"data_parallel": gpus, "micro_batch": 1,
                                              "grad_accumulation": grad_accumulation,
                                              "activation_checkpointing": True})
    precision = wl.precision.model_copy(update={"compute": "fp32", "params": "fp32", "grads": "fp32"})
    return wl.model_copy(update={"training": training, "precision": precision})


def run_with_spans(workload: Workload, strategy: str) -> tuple[RunMetrics, dict[tuple[str, str], float]]:
    """Metrics and bytes per (resource, kind) in the last (steady) iteration, per GPU."""
    cfg = make_run_config(HW, workload, strategy)
    result = simulate(cfg)
    assert result.metrics.feasible, result.metrics.infeasible_reason
    df = result.spans()
    last = df[df["iteration"] == cfg.iterations - 1]
    by_kind = last.groupby(["resource", "kind"])["bytes"].sum().to_dict()
    return result.metrics, by_kind


def host_swap_bytes_per_node(m: RunMetrics, gpus: int) -> float:
    """Bytes over the GPUs' host links (both directions) per iteration, all GPUs of the node."""
    return (m.traffic_bytes.h2d + m.traffic_bytes.d2h) * gpus


@pytest.mark.parametrize("gpus", [4, 8])
def test_harmony_swaps_each_byte_once_and_shares_it_peer_to_peer(gpus: int) -> None:
    """Harmony Sec. 1-3: per-GPU virtualised memory moves every GPU's full replica over the shared
    host links; Harmony moves each parameter byte over host links once and the rest GPU-to-GPU."""
    base, base_k = run_with_spans(gpt2_xl_fp32(gpus), BASELINE)
    harm, harm_k = run_with_spans(gpt2_xl_fp32(gpus), "harmony")
    # parameters in and gradients out: N x per GPU under per-GPU swapping
    assert base_k[("h2d", "param_fetch")] == pytest.approx(gpus * harm_k[("h2d", "param_fetch")], rel=1e-6)
    assert base_k[("d2h", "grad_offload")] == pytest.approx(gpus * harm_k[("d2h", "grad_offload")], rel=1e-6)
    # the rest of each layer reaches the other GPUs peer to peer, for Harmony only
    assert harm.traffic_bytes.gpu_link > 0
    assert base.traffic_bytes.gpu_link == 0
    # whole host-link volume (Harmony also swaps its stashed activations): close to N x
    ratio = host_swap_bytes_per_node(base, gpus) / host_swap_bytes_per_node(harm, gpus)
    assert 0.8 * gpus <= ratio <= gpus


def test_harmony_headline_direction_on_8_gpus() -> None:
    """Harmony abstract: swap load reduced by up to two orders of magnitude and up to 7.6x
    training throughput over baselines with virtualised memory. Generous range, 8 GPUs: swap
    volume at least 5x lower; throughput 2x to 11.4x (1.5 x 7.6) higher."""
    base, _ = run_with_spans(gpt2_xl_fp32(8), BASELINE)
    harm, _ = run_with_spans(gpt2_xl_fp32(8), "harmony")
    swap_reduction = host_swap_bytes_per_node(base, 8) / host_swap_bytes_per_node(harm, 8)
    speedup = harm.tokens_per_s / base.tokens_per_s
    assert swap_reduction >= 5.0
    assert 2.0 <= speedup <= 11.4


def test_harmony_swap_reduction_two_orders_of_magnitude() -> None:
    """Harmony abstract: swap load cut by up to two orders of magnitude. It combines the N-fold
    sharing across GPUs with running every micro-batch through a layer pack per swap-in
    (msr-fiddle/harmony task_graph_composor.py: one FWD/BWD task per pack over all micro-batches;
    offsim: unit-major order, parameters fetched once per visit, gradients accumulated on the GPU).
    8 GPUs, 8 micro-batches: offsim reaches 30.3x (7.05x with one micro-batch); at least 30x."""
    base, _ = run_with_spans(gpt2_xl_fp32(8, grad_accumulation=8), BASELINE)
    harm, _ = run_with_spans(gpt2_xl_fp32(8, grad_accumulation=8), "harmony")
    assert host_swap_bytes_per_node(base, 8) / host_swap_bytes_per_node(harm, 8) >= 30.0


@pytest.mark.xfail(strict=True, reason=(
    "offsim predicts 4.07x on 8 GPUs with one micro-batch (4.93x with 8, layer packs of one "
    "layer: swap-bound baseline vs a compute-bound Harmony); the paper's 7.6x also counts the "
    "page-fault and thrashing costs of virtualised memory (UVM), which offsim does not model"))
def test_harmony_throughput_near_7_6x() -> None:
    base, _ = run_with_spans(gpt2_xl_fp32(8), BASELINE)
    harm, _ = run_with_spans(gpt2_xl_fp32(8), "harmony")
    assert harm.tokens_per_s / base.tokens_per_s >= 5.0
