"""Fuyou's automatic activation swap amount (offsim.search.swap_amount, policy ``auto-swap``).

Fuyou (Liao et al., arXiv 2403.06504) swaps some blocks' activations to SSD and recomputes the
rest, choosing how many by predicting the iteration time. These tests check the choice against
simulated runs of the alternatives, on the fuyou-4090-testbed profile and on random variations
of the ``tiny`` case.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from offsim import load_profile, load_strategy, load_workload, make_run_config, simulate
from offsim.core.enums import Res
from offsim.plan.footprint import state_sizes
from offsim.policies.auto_swap import AutoSwapConfig
from offsim.schedule.bound import RES_NAMES
from offsim.search.swap_amount import choose_swap_blocks, per_block_plan, swap_stalls_s
from tests.test_systems import variant


def _dram_resident(name: str = "fuyou"):
    """Fuyou's preset with parameters and optimizer state in DRAM: only activations use NVMe."""
    s = load_strategy(name)
    return s.model_copy(update={"placement": s.placement.model_copy(update={"params": "cpu",
                                                                             "optimizer_states": "cpu"})})


def _time(cfg) -> float:
    m = simulate(cfg).metrics
    assert m.feasible, m.infeasible_reason
    return m.iteration_time_s


def _testbed_with_drives(drives: int):
    """The Fuyou testbed with ``drives`` of its SSDs in the array (Fuyou's Fig. 10(b) sweeps 1-12)."""
    hw = load_profile("fuyou-4090-testbed")
    return hw.model_copy(update={"nvme": hw.nvme.model_copy(update={"drives": drives})})


def test_ssd_bound_fuyou_recomputes_every_block() -> None:
    """GPT-3 13B, micro-batch 8, on the 4090 testbed with 4 of its SSDs: the iteration is bound
    by the SSD traffic of the optimizer state, and each block's 2.9 GB of activations would add
    ~0.3 s of SSD time against 0.08 s of recompute, so the choice is to swap nothing; swapping
    every block is simulated much slower."""
    cfg = make_run_config(_testbed_with_drives(4), variant("gpt3-13b", micro_batch=8, flash_attention=True), "fuyou")
    choice = choose_swap_blocks(cfg, state_sizes(cfg), "nvme")
    assert choice.blocks == 0 and choice.chosen.binding == RES_NAMES[Res.NVME]
    chosen = _time(cfg)
    all_swapped = _time(per_block_plan(cfg, choice.total_blocks, choice.total_blocks, "nvme"))
    assert chosen == pytest.approx(_time(per_block_plan(cfg, 0, choice.total_blocks, "nvme")))
    assert all_swapped > 1.3 * chosen


def test_gpu_bound_fuyou_swaps_most_blocks_to_dram() -> None:
    """With state in DRAM and activations swapped to DRAM, micro-batch 4, the GPU bounds the
    iteration and a block's 1.4 GB crosses PCIe in ~0.06 s, under the backward it hides behind:
    swapping most blocks saves their recompute, swapping all of them makes forward wait for the
    copies. The chosen count is strictly inside (0, 40) and beats both extremes in simulation."""
    wl = variant("gpt3-13b", micro_batch=4, flash_attention=True)
    st_ = _dram_resident()
    st_ = st_.model_copy(update={"policies": st_.policies.model_copy(update={"activations": AutoSwapConfig(tier="cpu")})})
    cfg = make_run_config("fuyou-4090-testbed", wl, st_)
    choice = choose_swap_blocks(cfg, state_sizes(cfg), "cpu")
    assert 0 < choice.blocks < choice.total_blocks
    chosen = _time(cfg)
    assert chosen < _time(per_block_plan(cfg, 0, choice.total_blocks, "cpu"))
    assert chosen < _time(per_block_plan(cfg, choice.total_blocks, choice.total_blocks, "cpu"))


def test_stalls_grow_with_the_swap_count_and_vanish_without_swapping() -> None:
    cfg = make_run_config("fuyou-4090-testbed", variant("gpt3-13b", micro_batch=4, flash_attention=True), "fuyou")
    sz = state_sizes(cfg)
    stalls = [swap_stalls_s(cfg, sz, "nvme", n) for n in range(41)]
    assert stalls[0] == 0.0
    assert all(b >= a for a, b in zip(stalls, stalls[1:], strict=False))
    block = next(lay for lay in sz.layers if lay.is_block)
    hw = cfg.hardware
    # one swapped block (depth 2): nothing waits in forward; backward waits for the read beyond 2 blocks' backward
    read_s = block.act_full_bytes / hw.host_link.h2d.pinned.peak_bytes_per_s + block.act_full_bytes / hw.nvme.read_bytes_per_s
    assert stalls[1] == pytest.approx(max(0.0, read_s - 2 * block.bwd_s))


SCALE = st.sampled_from([0.25, 1.0, 4.0])


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pcie=SCALE, nvme=SCALE, gpu=SCALE, depth=st.sampled_from([0, 1, 2]), tier=st.sampled_from(["cpu", "nvme"]))
def test_auto_swap_is_never_slower_than_either_extreme(pcie, nvme, gpu, depth, tier) -> None:
    """Whatever the link, SSD and GPU speeds, the automatic amount simulates no slower than
    recomputing every block or swapping every block (2% slack: the choice is profiled over two
    iterations, the run over three)."""
    hw = load_profile("tiny")
    link = hw.host_link
    scaled = {d: getattr(link, d).model_copy(update={
        k: getattr(getattr(link, d), k).model_copy(update={"bandwidth_gb_per_s": getattr(getattr(link, d), k).bandwidth_gb_per_s * pcie})
        for k in ("pinned", "pageable")}) for d in ("h2d", "d2h")}
    hw = hw.model_copy(update={
        "host_link": link.model_copy(update=scaled),
        "nvme": hw.nvme.model_copy(update={"read_gb_per_s": hw.nvme.read_gb_per_s * nvme,
                                           "write_gb_per_s": hw.nvme.write_gb_per_s * nvme}),
        "gpu": hw.gpu.model_copy(update={"peak_tflops": {k: v * gpu for k, v in hw.gpu.peak_tflops.items()}}),
    })
    s = load_strategy("fuyou")
    s = s.model_copy(update={"prefetch_depth": depth, "policies": s.policies.model_copy(
        update={"activations": AutoSwapConfig(tier=tier)})})
    cfg = make_run_config(hw, load_workload("tiny"), s)
    m = simulate(cfg).metrics
    if not m.feasible:
        return
    choice = choose_swap_blocks(cfg, state_sizes(cfg), tier)
    extremes = []
    for n in (0, choice.total_blocks):
        e = simulate(per_block_plan(cfg, n, choice.total_blocks, tier)).metrics
        if e.feasible:
            extremes.append(e.iteration_time_s)
    if extremes:
        assert m.iteration_time_s <= 1.02 * min(extremes)
