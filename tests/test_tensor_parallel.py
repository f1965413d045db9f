"""Tensor parallelism (Megatron-LM, arXiv 1909.08053): per-GPU FLOPs, parameters and activation
bytes (Korthikanti et al., arXiv 2205.05198, Sec. 4.2.1) and the blocking all-reduces, by hand."""

from __future__ import annotations

import pytest

from offsim import load_profile, load_workload, make_run_config, simulate
from offsim.errors import ConfigError
from offsim.plan.footprint import state_sizes
from offsim.plan.model import block_activation_bytes, block_gemms, build_layers


def _gpt(tp: int, flash: bool = False):
    wl = load_workload("gpt3-13b")
    return wl.model_copy(update={"training": wl.training.model_copy(
        update={"tensor_parallel": tp, "flash_attention": flash, "micro_batch": 2})})


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_activation_bytes_follow_korthikanti(tp: int) -> None:
    """sbh(10 + 24/t + 5as/(ht)) bytes per block per GPU, no sequence parallelism (MHA, 4h MLP)."""
    wl = _gpt(tp)
    s, b, h, a = wl.training.seq_len, wl.training.micro_batch, wl.model.hidden, wl.model.heads
    assert block_activation_bytes(wl) == pytest.approx(s * b * h * (10 + 24 / tp + 5 * a * s / (h * tp)))


def test_flops_and_parameters_split_over_the_group() -> None:
    one, two = _gpt(1), _gpt(2)
    assert sum(block_gemms(two)) == pytest.approx(sum(block_gemms(one)) / 2)
    gpu = load_profile("rtx4090-pcie4-ws").gpu
    for a, b in zip(build_layers(one, gpu), build_layers(two, gpu), strict=True):
        assert b.params == -(-a.params // 2)
        assert b.fwd_flop == pytest.approx(a.fwd_flop / 2)


def _two_gpu_tiny(link_gb_per_s: float = 10.0, latency_us: float = 5.0):
    hw = load_profile("tiny")
    topo = hw.topology.model_copy(update={"gpus_per_node": 2, "gpu_link": hw.topology.gpu_link.model_copy(
        update={"kind": "pcie", "bandwidth_gb_per_s": link_gb_per_s, "latency_us": latency_us})})
    return hw.model_copy(update={"topology": topo})


def _tiny_tp(tp: int):
    wl = load_workload("tiny")
    return wl.model_copy(update={"training": wl.training.model_copy(
        update={"tensor_parallel": tp, "activation_checkpointing": False})})


def test_all_reduces_by_hand() -> None:
    """tiny on two GPUs, t = 2, no checkpointing: each block all-reduces its 16-bit output twice in
    forward and its input gradient twice in backward; a ring all-reduce sends 2(t-1)/t x bytes,
    so each block moves 4 x 2sbh bytes per micro-batch, and the GPU waits for each pair
    (2 x 2sbh / rate + 4 link latencies)."""
    hw, wl = _two_gpu_tiny(), _tiny_tp(2)
    m = simulate(make_run_config(hw, wl, "gpu-only")).metrics
    t = wl.training
    hidden_bytes = 2.0 * t.seq_len * t.micro_batch * wl.model.hidden
    per_iteration = wl.model.layers * 4 * hidden_bytes * t.grad_accumulation
    assert m.traffic_bytes.gpu_link == pytest.approx(per_iteration)
    pair_s = 2 * hidden_bytes / 10e9 + 4 * 5e-6
    assert m.stall_s == pytest.approx(wl.model.layers * 2 * pair_s * t.grad_accumulation, rel=1e-6)


def test_node_storage_is_shared_by_the_tensor_parallel_gpus() -> None:
    cfg = make_run_config(_two_gpu_tiny(), _tiny_tp(2), "gpu-only")
    assert state_sizes(cfg).ranks_per_node == 2


def test_a_group_larger_than_the_node_is_refused() -> None:
    with pytest.raises((ConfigError, ValueError), match="tensor_parallel=2"):
        make_run_config("tiny", _tiny_tp(2), "gpu-only")
