"""GreedySnake (Yue, Yin, Qian, arXiv 2512.17570; new_systems.md §3): unit-major snake order,
parameters fetched once per unit visit whatever the number of micro-batches M, gradients
accumulated on the GPU and sent once; its headline against ZeRO-Infinity (``zero-infinity-nvme``).

Testbed: the paper's abstract says "A100 GPUs"; GPU memory, SSD count and host DRAM were not
confirmed (new_systems.md §3), so the shipped ``a100-azure-4nvme`` (A100 80GB PCIe, 4 NVMe RAID-0,
880 GiB DRAM) stands for it, on one GPU. GPT-65B is not a shipped workload: Llama 2 70B (80 x 8192)
stands for it. Nothing is tuned to pass.
"""

from __future__ import annotations

from functools import cache

import pytest

from offsim import load_workload, make_run_config, simulate
from offsim.config.workload import Workload
from offsim.core.enums import OpKind
from offsim.schedule.analysis import op_instances
from offsim.systems._compile import OrderKind, compile_system, unit_visits
from offsim.systems._registry import compose

HEADLINE_HW = "a100-azure-4nvme"
#: saturated-throughput point: ZeRO-Infinity at M = 32 is within 10% of its M = 64 throughput
#: (68.1 vs 75.1 tokens/s, measured here)
HEADLINE_M = 32


def _workload(name: str, micro_batches: int, dp: int = 1) -> Workload:
    wl = load_workload(name)
    return wl.model_copy(update={"training": wl.training.model_copy(
        update={"grad_accumulation": micro_batches, "data_parallel": dp})})


def test_compose_is_unit_major_snake_with_its_options() -> None:
    cfg = make_run_config("tiny", _workload("tiny", 2), "greedysnake", iterations=2)
    sysm = compose(cfg)
    assert sysm.order.kind is OrderKind.UNIT_MAJOR and sysm.order.snake and sysm.order.unit_layers == 1
    st = cfg.strategy.model_copy(update={"system_options": {"checkpoint_interval": 2}})
    sysm2 = compose(cfg.model_copy(update={"strategy": st}))
    n = sysm2.n_layers
    # units of 2: ceil(n/2) forward visits and as many backward, the last two fused at the turn
    assert len(unit_visits(sysm2)) == 2 * ((n + 1) // 2) - 1


def _per_iteration(strategy: str, m: int) -> tuple[int, float]:
    """Parameter demands and gradient D2H bytes per steady iteration on tiny."""
    cfg = make_run_config("tiny", _workload("tiny", m), strategy, iterations=2)
    sc = compile_system(compose(cfg))
    accesses = sum(1 for i in op_instances(sc) if i.iteration == 1 and i.op.body.kind is OpKind.ACCESS
                   and str(i.op.tag.mechanism) == "param_fetch")
    df = simulate(cfg).spans()
    last = df[df["iteration"] == cfg.iterations - 1]
    grad_d2h = float(last[(last["resource"] == "d2h") & (last["kind"] == "grad_offload")]["bytes"].sum())
    return accesses, grad_d2h


def test_parameters_and_gradients_cross_once_whatever_m() -> None:
    """new_systems.md §3: each parameter crosses PCIe once in forward and once in backward per
    iteration and its gradient leaves the GPU once, whatever M; horizontal ZeRO-Infinity demands
    every layer's parameters once per micro-batch."""
    gs1, gs4 = _per_iteration("greedysnake", 1), _per_iteration("greedysnake", 4)
    assert gs1[0] == gs4[0]
    assert gs4[1] == pytest.approx(gs1[1], rel=1e-9)
    zi1, zi4 = _per_iteration("zero-infinity-nvme", 1), _per_iteration("zero-infinity-nvme", 4)
    assert zi4[0] == 4 * zi1[0]


@cache
def _headline_ratio() -> float:
    """Tokens/s of greedysnake over zero-infinity-nvme, Llama 2 70B, one A100, M = HEADLINE_M."""
    wl = _workload("llama2-70b", HEADLINE_M)
    base = simulate(make_run_config(HEADLINE_HW, wl, "zero-infinity-nvme")).metrics
    gs = simulate(make_run_config(HEADLINE_HW, wl, "greedysnake")).metrics
    assert base.feasible and gs.feasible, (base.infeasible_reason, gs.infeasible_reason)
    return gs.tokens_per_s / base.tokens_per_s


def test_greedysnake_beats_zero_infinity_saturated_one_gpu() -> None:
    """arXiv 2512.17570 abstract: saturated throughput 1.96x ZeRO-Infinity for GPT-65B on 1 A100.
    Direction: GreedySnake faster (offsim: 5.03x at M = 32; 1.29x at M = 1, 1.75x at 4, 3.35x at 16,
    5.38x at 64). Not tested, measured: 4 GPUs (the paper: 1.93x) 2.37x at M = 16; GPT-175B (2.53x)
    cannot be compared here: zero-infinity-nvme needs 1030 GiB of host memory on this 792 GiB VM
    (DeepSpeed's 512 GiB flat gradient buffer), greedysnake runs (40.3 tokens/s at M = 16)."""
    assert _headline_ratio() > 1.0


@pytest.mark.xfail(strict=True, reason=(
    "offsim reaches 5.03x (M = 32; 5.38x at M = 64), above 2 x 1.96: its ZeRO-Infinity baseline "
    "reads every micro-batch's parameters from NVMe (75 tokens/s saturated, ~55 s per 4096-token "
    "micro-batch, twice the 2 x 138 GB / 10 GB/s read bound), while the paper's testbed (GPU "
    "memory, SSD count, DRAM, where ZeRO-Infinity kept its parameters) is unconfirmed; and "
    "GreedySnake's deferred alpha share and parameter slicing are not modelled"))
def test_greedysnake_headline_within_factor_2() -> None:
    """arXiv 2512.17570 abstract: 1.96x on 1 GPU (GPT-65B); within a factor 2: 0.98x to 3.92x."""
    assert 1.96 / 2 <= _headline_ratio() <= 1.96 * 2
