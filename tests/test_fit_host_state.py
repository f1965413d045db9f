"""Host optimizer state as DeepSpeed allocates it (systems/_part_static._optimizer_state): the fp32
master partition pinned iff pin_memory under ZeRO-1/2 (stage_1_and_2.py) and pageable under ZeRO-3
(stage3.py _create_fp32_partitions), the Adam moments always pageable (ops/adam/cpu_adam.py
torch.zeros_like), so only a ZeRO-1/2 master is rounded up to a power of two. Figures hand-computed
from the parameter count."""

from __future__ import annotations

from typing import Any

import pytest

from offsim import make_run_config
from offsim.api import resolve
from offsim.fit_check import footprint
from offsim.plan.footprint import state_sizes

MASTER = "optimizer state: fp32 master params"
MOMENTS = "optimizer state: Adam moments (pageable)"


def _breakdown(strategy: str, **update: Any) -> tuple[int, dict[str, dict[str, float]]]:
    cfg = make_run_config("rtx4090-pcie4-ws", "llama2-7b", strategy)
    if update:
        cfg = cfg.model_copy(update={"strategy": cfg.strategy.model_copy(update=update)})
    cfg = resolve(cfg)
    sz = state_sizes(cfg)
    return sz.params_total, footprint(cfg, sz).breakdown


def test_zero2_master_pinned_and_rounded_moments_pageable() -> None:
    # Llama 2 7B, one rank: master 4 P = 26.95e9 B, pinned as 2^35 B (32 GiB); moments 8 P pageable.
    p, bd = _breakdown("zero-offload")
    assert p == pytest.approx(6.738e9, rel=1e-3)
    assert bd["host_pinned"][MASTER] == 2**35
    assert bd["host"][MOMENTS] == pytest.approx(8 * p, abs=1)
    assert "optimizer state" not in bd["host_pinned"]


def test_zero2_without_pin_memory_nothing_rounded() -> None:
    p, bd = _breakdown("zero-offload", pin_memory=False)
    assert bd["host"][MASTER] == pytest.approx(4 * p, abs=1)
    assert bd["host"][MOMENTS] == pytest.approx(8 * p, abs=1)
    assert MASTER not in bd["host_pinned"]


def test_zero3_master_pageable_even_with_pin_memory() -> None:
    # ZeRO-3 offload (zero-infinity-cpu, pin_memory true): 4 P + 8 P pageable, 12 P in all, unrounded
    # (the 74.4 GiB of per-sub-group rounding the old single pinned item gave a 5.95e9-parameter
    # model is what the DOS vanilla log does not show: +22.24 GiB at "After creating fp32 partitions").
    p, bd = _breakdown("zero-infinity-cpu")
    assert bd["host"][MASTER] == pytest.approx(4 * p, abs=1)
    assert bd["host"][MOMENTS] == pytest.approx(8 * p, abs=1)
    assert not any(k.startswith("optimizer state") for k in bd["host_pinned"])


def test_other_systems_keep_one_item() -> None:
    _, bd = _breakdown("harmony")
    assert "optimizer state" in bd["host_pinned"] and MOMENTS not in bd["host"]


def test_deep_optimizer_states_pins_with_its_prefetch_only() -> None:
    _, prefetch = _breakdown("deep-optimizer-states")
    assert "optimizer state" in prefetch["host_pinned"]
    p, vanilla = _breakdown("deep-optimizer-states", optimizer_split="fixed")
    assert vanilla["host"][MASTER] == pytest.approx(4 * p, abs=1)
