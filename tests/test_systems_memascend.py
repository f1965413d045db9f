"""MemAscend (Liaw and Chen, arXiv 2505.23254) against DeepSpeed ZeRO-3 NVMe offload
(zero-infinity-nvme): host buffers as DeepSpeed v0.16.9 allocates them, hand-computed on the
``tiny`` profile and workload, each MemAscend switch alone, and the headline (citation beside
it). Nothing is tuned to pass.

Hand computation for ``tiny`` (4 blocks, hidden 1024, FFN 4096, vocab 8192, bf16, one GPU):
tensors embedding 8,388,608; per block Wq, Wk, Wv, Wo 1,048,576 each, two MLP matrices
4,194,304 each, norms 2,048; final norm 1,024 and LM head 8,388,608: 67,118,080 parameters, one
optimizer sub-group (sub_group_size 1e9 covers them all).
"""

from __future__ import annotations

import pytest

from offsim import load_strategy, load_workload, make_run_config, simulate
from offsim.fit_check import footprint
from offsim.metrics import RunMetrics
from offsim.plan.footprint import (
    deepspeed_sub_groups,
    overflow_check_bytes,
    param_partitions,
    param_pool_bytes,
    state_sizes,
)
from offsim.results import RunResult

GiB = 2**30
PARAMS = 67_118_080  # tiny's parameters = its one sub-group
STATIC_DS = 2**30 + 2**28 + 4 * 2**29 + 2**28  # param pool, max_in_cpu, optimizer pool, gradients
MOMENTS = PARAMS * 2 * 4  # CPU Adam's two fp32 moments of the sub-group, first step
MA_POOL = (4_194_304 + 4_194_304 + 2_048 + 1_024 + 8_388_608) * 2  # 5 partitions in flight at most
STATIC_MA = MA_POOL + PARAMS * 2 + 4 * PARAMS * 4 + PARAMS * 2  # exact sizes


def strategy(name: str, **update) -> object:
    """A shipped strategy with ``update``; zero-infinity-nvme as DeepSpeed v0.16.9 runs it, its NVMe
    swap buffers pinned by PyTorch (``nvme_swap_buffers`` torch_pinned, v0.3.15-v0.19.3), the
    baseline MemAscend measured against, unless ``update`` says otherwise."""
    if name == "zero-infinity-nvme":
        update = {"nvme_swap_buffers": "torch_pinned", **update}
    return load_strategy(name).model_copy(update=update)


ZI = strategy("zero-infinity-nvme")  # DeepSpeed v0.16.9's ZeRO-Infinity (see strategy())


def fp16(name: str) -> object:
    wl = load_workload(name)
    pr = wl.precision.model_copy(update={"compute": "fp16", "params": "fp16", "grads": "fp16"})
    return wl.model_copy(update={"precision": pr})


def result(hardware: str, workload, strat) -> RunResult:
    r = simulate(make_run_config(hardware, workload, strat))
    assert r.metrics.feasible, r.metrics.infeasible_reason
    return r


def run(hardware: str, workload, strat) -> RunMetrics:
    return result(hardware, workload, strat).metrics


def host_levels(r: RunResult, after_s: float = -1.0, until_s: float = float("inf")) -> float:
    """Highest node host level (pinned + pageable) in (after_s, until_s]: the level held at
    ``after_s`` and each change after it (a tier's level is sampled when it changes)."""
    df = r.levels()
    host = df[df.tier == "host"]
    held = host[host.t_s <= after_s].bytes.tail(1).tolist()
    inside = host[(host.t_s > after_s) & (host.t_s <= until_s)].bytes.tolist()
    return float(max(held + inside))


# ---------------------------------------------------------------- DeepSpeed's buffers, by hand
def test_sub_groups_close_once_they_reach_sub_group_size() -> None:
    """stage3.py _create_fp16_sub_groups: add partitions until the group holds sub_group_size or
    more; the last parameter closes the last group; one group when sub_group_size covers all."""
    assert deepspeed_sub_groups([3, 4, 5, 2], 6) == [7, 7]
    assert deepspeed_sub_groups([3, 4, 5, 2, 1], 6) == [7, 7, 1]
    assert deepspeed_sub_groups([3, 4, 5, 2], 14) == [14]


def test_tiny_tensor_partitions() -> None:
    cfg = make_run_config("tiny", "tiny", ZI)
    parts = param_partitions(cfg, state_sizes(cfg))
    assert sum(parts) == PARAMS and len(parts) == 1 + 4 * 7 + 2
    assert parts[:5] == [8_388_608] + [1_048_576] * 4
    assert deepspeed_sub_groups(parts, 1e9) == [PARAMS]


def test_fixed_param_pool_holds_the_largest_parameter() -> None:
    """partitioned_param_swapper.py: one pinned tensor of buffer_count x buffer_size; buffer_size
    must hold the largest parameter (DeepSpeed issue #3506), here the 8,388,608-element embedding."""
    cfg = make_run_config("tiny", "tiny", strategy("zero-infinity-nvme", pinned_buffer_mib=1.0))
    parts = param_partitions(cfg, state_sizes(cfg))
    assert param_pool_bytes(cfg, parts, 2.0) == 5 * 8_388_608 * 2
    cfg = make_run_config("tiny", "tiny", ZI)
    assert param_pool_bytes(cfg, parts, 2.0) == pytest.approx(5 * 190.7 * 2**20)


def test_adaptive_param_pool_holds_the_tensors_in_flight() -> None:
    """Adaptive: the largest 5 consecutive partitions (the last MLP matrices, the norms, the head)."""
    cfg = make_run_config("tiny", "tiny", "memascend")
    assert param_pool_bytes(cfg, param_partitions(cfg, state_sizes(cfg)), 2.0) == MA_POOL


def test_zero_infinity_nvme_host_buffers_on_tiny() -> None:
    """DeepSpeed's pinned buffers, each rounded up to a power of two by the caching allocator:
    parameter pool 5 x 190.7 MiB -> 2^30; max_in_cpu buffer 134,236,160 B -> 2^28 (no partitioned
    swap space: the one sub-group fits it whole); 4 optimizer buffers of 268,472,320 B -> 2^29
    each; 16-bit gradients 134,236,160 B -> 2^28. The peak adds the first step's moments."""
    cfg = make_run_config("tiny", "tiny", ZI)
    bd = footprint(cfg).breakdown
    assert bd["host_pinned"]["parameter swap buffers (offload_param)"] == 2**30
    assert bd["host_pinned"]["parameters kept in CPU (offload_param.max_in_cpu)"] == 2**28
    assert bd["host_pinned"]["optimizer swap buffers (offload_optimizer)"] == 4 * 2**29
    assert bd["host_pinned"]["16-bit gradient partitions (grad_partitions_flat_buffer)"] == 2**28
    assert not any("partitioned parameter swap space" in k for k in bd["host_pinned"])
    m = run("tiny", "tiny", ZI)
    assert m.peak_bytes.host_pinned == STATIC_DS
    assert m.peak_bytes.host == STATIC_DS + MOMENTS


def test_current_release_locks_swap_buffers_of_the_exact_size() -> None:
    """DeepSpeed v0.19.4+ (PR #8212): the swappers' buffers are posix_memalign + mlock of the
    exact size (csrc/pin_memory/page_alloc.cpp), zeroed in place: parameter pool 5 x 99,981,722
    elements (190.7 MiB / 2 B, a whole number) x 2 B = 999,817,220 B (not 2^30); 4 optimizer
    buffers of 268,472,320 B (not 2^29 each). The max_in_cpu
    buffer and the 16-bit gradients are still pinned by PyTorch (2^28 each)."""
    cfg = make_run_config("tiny", "tiny", load_strategy("zero-infinity-nvme"))
    assert cfg.strategy.nvme_swap_buffers == "locked"
    bd = footprint(cfg).breakdown["host_pinned"]
    assert bd["parameter swap buffers (offload_param)"] == 5 * 99_981_722 * 2  # round(190.7 MiB / 2 B) elements
    assert bd["optimizer swap buffers (offload_optimizer)"] == 4 * 268_472_320
    assert bd["parameters kept in CPU (offload_param.max_in_cpu)"] == 2**28
    assert bd["16-bit gradient partitions (grad_partitions_flat_buffer)"] == 2**28


def test_memascend_host_buffers_on_tiny() -> None:
    """Exact sizes, the adaptive pool, no pageable copies: the same buffers without rounding."""
    m = run("tiny", "tiny", "memascend")
    assert m.peak_bytes.host_pinned == STATIC_MA
    assert m.peak_bytes.host == STATIC_MA + MOMENTS


def test_pin_memory_copy_is_the_start_up_peak() -> None:
    """tensor.pin_memory() of the torch.zeros gradient buffer: its 134,236,160-byte pageable source
    and the 2^28-byte pinned copy coexist, the highest level at start-up (t = 0); allocating pinned
    zeros directly leaves the fp32 gradient buffer of initialize_optimizer_states (268,472,320 B,
    beside the pools) as the start-up peak."""
    copy = result("tiny", "tiny", ZI)
    assert host_levels(copy, until_s=0.0) == STATIC_DS + PARAMS * 2
    direct = result("tiny", "tiny", strategy("zero-infinity-nvme", pin_by_copy=False))
    assert host_levels(direct, until_s=0.0) == STATIC_DS - 2**28 + PARAMS * 4


def test_first_step_moments_appear_once() -> None:
    """CPU Adam creates the moments (pageable) at the first step only; later steps of a bf16 run
    add nothing (no overflow check for bf16)."""
    r = result("tiny", "tiny", ZI)
    second = r.recorder.iteration_starts_s[1]
    assert host_levels(r, until_s=second) == STATIC_DS + MOMENTS
    assert host_levels(r, after_s=second) == STATIC_DS


def test_fp16_overflow_check_temporaries_every_step() -> None:
    """stage3.py has_overflow (fp16): isinf = abs() == inf, a 16-bit copy and a 1-byte mask per
    gradient element alive together: 67,118,080 x 3 B at each step; fused: none; bf16: skipped."""
    wl = fp16("tiny")
    for workload, nbytes in (("tiny", 0.0), (wl, PARAMS * 3)):
        cfg = make_run_config("tiny", workload, ZI)
        assert overflow_check_bytes(cfg, state_sizes(cfg)) == nbytes
    r = result("tiny", wl, ZI)
    second = r.recorder.iteration_starts_s[1]
    assert host_levels(r, after_s=second) == STATIC_DS + PARAMS * 3
    fused = result("tiny", wl, strategy("zero-infinity-nvme", system="memascend", overflow_check="fused"))
    assert host_levels(fused, after_s=second) == STATIC_DS


def test_pageable_gradient_buffer_without_pin_memory() -> None:
    """offload_optimizer.pin_memory false: grad_partitions_flat_buffer stays pageable, exact size."""
    cfg = make_run_config("tiny", "tiny", strategy("zero-infinity-nvme", pin_memory=False))
    bd = footprint(cfg).breakdown
    assert bd["host"]["16-bit gradient partitions (grad_partitions_flat_buffer)"] == PARAMS * 2
    assert "16-bit gradient partitions (grad_partitions_flat_buffer)" not in bd["host_pinned"]


@pytest.mark.parametrize(("workload", "name"), [
    ("tiny", ZI), ("tiny", "memascend"), ("tiny", "zero-infinity-cpu"),
    (fp16("tiny"), ZI), (fp16("tiny"), "zero-infinity-cpu"),
])
def test_footprint_bounds_the_engine(workload, name) -> None:
    """The planner's footprint is an upper bound on the host levels the engine reaches."""
    cfg = make_run_config("tiny", workload, name)
    fp, m = footprint(cfg), run("tiny", workload, name)
    assert m.peak_bytes.host <= fp.need_bytes["host"] * (1 + 1e-9)
    assert m.peak_bytes.host_pinned <= fp.need_bytes["host_pinned"] * (1 + 1e-9)


# ---------------------------------------------------------------- MemAscend against DeepSpeed
def test_memascend_lowers_peak_pinned_host_memory() -> None:
    """MemAscend (arXiv 2505.23254): exact-size pinned buffers, an adaptive parameter pool and
    pinned allocation without copies lower peak system memory, with the same data movement
    (direction)."""
    ds = run("rtx4090-pcie4-ws", "llama2-13b", ZI)
    ma = run("rtx4090-pcie4-ws", "llama2-13b", "memascend")
    assert ma.peak_bytes.host_pinned < ds.peak_bytes.host_pinned
    assert ma.peak_bytes.host < ds.peak_bytes.host
    assert ma.traffic_bytes == ds.traffic_bytes


@pytest.mark.parametrize(("workload", "switch"), [
    ("llama2-13b", {"host_allocator": "exact"}),
    ("llama2-13b", {"param_swap_pool": "adaptive"}),
    ("llama2-13b", {"pin_by_copy": False}),
    (fp16("llama2-13b"), {"overflow_check": "fused"}),  # DeepSpeed checks overflow for fp16 only
])
def test_each_memascend_switch_alone_lowers_peak_host(workload, switch: dict) -> None:
    ds = run("rtx4090-pcie4-ws", workload, ZI)
    st = strategy("zero-infinity-nvme", system="memascend", **switch)
    one = run("rtx4090-pcie4-ws", workload, st)
    assert one.peak_bytes.host < ds.peak_bytes.host
    if "overflow_check" in switch:
        # DeepSpeed's isinf/isnan scans touch 12 B per fp16 element, the fused check reads each
        # once, 2 B (offsim.plan.cpu_adam.overflow_scan_bytes_per_param): 10 B per element of
        # the rank's partition less host-copy traffic per step; every other link the same
        local = state_sizes(make_run_config("rtx4090-pcie4-ws", workload, st)).local_params
        assert ds.traffic_bytes.dram_copy - one.traffic_bytes.dram_copy == pytest.approx(10.0 * local)
        assert one.traffic_bytes.model_copy(update={"dram_copy": 0.0}) == \
            ds.traffic_bytes.model_copy(update={"dram_copy": 0.0})
    else:
        assert one.traffic_bytes == ds.traffic_bytes


def _bf16_gap(measured: str) -> pytest.MarkDecorator:
    return pytest.mark.xfail(strict=True, reason=(
        f"offsim gives {measured} lower peak host memory for this bf16 model (measured 2026-11-25, "
        "the same as before the ZeRO-3 work 4bcfd6d-5ac1e20): DeepSpeed skips the "
        "fp16 overflow check for bf16, so MemAscend's gain here is the pinned rounding, the adaptive "
        "parameter pool and the pin_memory() copy of the 16-bit gradient buffer; the first step's "
        "pageable moments remain in both. The paper's models, precision, batch and DeepSpeed "
        "configuration, and its Direct NVMe engine, are not modelled"))


@pytest.mark.parametrize("workload", [
    pytest.param("llama2-13b", marks=_bf16_gap("34.7% (78.2 -> 51.1 GiB)")),
    pytest.param("llama2-7b", marks=_bf16_gap("22.9% (50.6 -> 39.0 GiB)")),
    pytest.param("llama3-8b", marks=_bf16_gap("28.3% (59.0 -> 42.2 GiB)")),
    "opt-30b",  # fp16: 54.7% (189.8 -> 86.0 GiB), the overflow check's temporaries included
])
def test_memascend_headline_reduction(workload: str) -> None:
    """MemAscend (arXiv 2505.23254) abstract: 55.7% lower peak system memory on average than
    standard SSD offloading (ZeRO-Infinity). Generous range: 35% to 75% lower peak host memory
    (pinned + pageable) on rtx4090-pcie4-ws. offsim's average over these four models is 35.2%."""
    ds = run("rtx4090-pcie4-ws", workload, ZI)
    ma = run("rtx4090-pcie4-ws", workload, "memascend")
    assert 0.35 <= 1 - ma.peak_bytes.host / ds.peak_bytes.host <= 0.75
