"""Fuyou's automatic activation swap amount (offsim.search.swap_amount, policy ``auto-swap``).

Fuyou (Liao et al., arXiv 2403.06504) swaps some blocks' activations to SSD and recomputes the
rest, choosing how many by predicting the iteration time. These tests check the choice against
simulated runs of the alternatives, on the fuyou-4090-testbed profile and on random variations
of the ``tiny`` case.
"""

from __future__ import annotations

import itertools

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from offsim import load_profile, load_strategy, load_workload, make_run_config, simulate
from offsim.core.enums import Res
from offsim.fit_check import footprint
from offsim.plan.footprint import state_sizes
from offsim.policies.auto_swap import AutoSwapConfig
from offsim.schedule.bound import RES_NAMES
from offsim.search.swap_amount import choose_swap_blocks, per_block_plan, resolve_auto_swap, swap_stalls_s
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
    assert choice.gpu_limit == choice.total_blocks and not choice.gpu_binds  # time, not memory
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
    pol = st_.policies.model_copy(update={"activations": AutoSwapConfig(tier="cpu")})
    st_ = st_.model_copy(update={"policies": pol})
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
    assert all(b >= a for a, b in itertools.pairwise(stalls))
    block = next(lay for lay in sz.layers if lay.is_block)
    hw = cfg.hardware
    # one swapped block (Fuyou's depth 1 since b47ba05): nothing waits in forward; backward waits
    # for the read beyond `depth` blocks' backward
    depth = cfg.strategy.prefetch_depth
    read_s = (block.act_full_bytes / hw.host_link.h2d.pinned.peak_bytes_per_s
              + block.act_full_bytes / hw.nvme.read_bytes_per_s)
    assert stalls[1] == pytest.approx(max(0.0, read_s - depth * block.bwd_s))


def _scaled_rate(link_dir, factor: float):
    """One PCIe direction with its pinned and pageable bandwidths times ``factor``."""
    return link_dir.model_copy(update={k: getattr(link_dir, k).model_copy(update={
        "bandwidth_gb_per_s": getattr(link_dir, k).bandwidth_gb_per_s * factor}) for k in ("pinned", "pageable")})


def _tiny_with(gpu_gib: float, pcie: float, nvme: float, gpu: float = 1.0):
    """The ``tiny`` profile with ``gpu_gib`` of GPU memory, its PCIe and NVMe rates and its GPU's
    peak scaled."""
    hw = load_profile("tiny")
    link = hw.host_link
    return hw.model_copy(update={
        "host_link": link.model_copy(update={d: _scaled_rate(getattr(link, d), pcie) for d in ("h2d", "d2h")}),
        "nvme": hw.nvme.model_copy(update={"read_gb_per_s": hw.nvme.read_gb_per_s * nvme,
                                           "write_gb_per_s": hw.nvme.write_gb_per_s * nvme}),
        "gpu": hw.gpu.model_copy(update={"memory_gib": gpu_gib,
                                         "peak_tflops": {k: v * gpu for k, v in hw.gpu.peak_tflops.items()}}),
    })


SCALE = st.sampled_from([0.25, 1.0, 4.0])


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pcie=SCALE, nvme=SCALE, gpu=SCALE, depth=st.sampled_from([0, 1, 2]), tier=st.sampled_from(["cpu", "nvme"]))
def test_auto_swap_is_never_slower_than_either_extreme(pcie, nvme, gpu, depth, tier) -> None:
    """Whatever the link, SSD and GPU speeds, the automatic amount simulates no slower than
    recomputing every block or swapping every block (2% slack: the choice is profiled over two
    iterations, the run over three)."""
    hw = _tiny_with(16.0, pcie, nvme, gpu)
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


# ---------------------------------------------------------------- GPU memory bounds the amount
# Fuyou's rule (arXiv 2403.06504 v1 §4, automatic activation swapping management): the swapped
# amount is bounded by the GPU memory left for the swap buffers as well as by the SSD/PCIe time.

GiB = 2**30


def _fuyou_13b_cfg(micro_batch: int, depth: int | None = None):
    """Fuyou's preset on its artifact's testbed, GPT-3 13B at its benchmark shape (seq 1024,
    h 5120, flash attention) and ``micro_batch`` sequences (``depth``: a prefetch depth other than
    the preset's 1)."""
    wl = load_workload("fuyou-gpt3-13b")
    wl = wl.model_copy(update={"training": wl.training.model_copy(update={"micro_batch": micro_batch})})
    s = load_strategy("fuyou")
    if depth is not None:
        s = s.model_copy(update={"prefetch_depth": depth})
    return make_run_config("fuyou-4090-testbed", wl, s)


def _hand_buffers_bytes(n: int, micro_batch: int, depth: int = 1) -> int:
    """Swap buffers of "swap the first n of 40 blocks, checkpoints on the host", by hand: per block
    a swapped one keeps its full activations, 34 B per token and hidden unit with flash attention
    (Korthikanti et al., arXiv 2205.05198 Table 2 without the attention scores), a recomputed one
    its 2 B input checkpoint; the throttle lets depth + 2 consecutive offloaded layers sit on the
    GPU, the largest window being the first: min(n, depth + 2) blocks and the rest checkpoints."""
    sbh = 1024 * micro_batch * 5120
    window = depth + 2
    return min(n, window) * 34 * sbh + max(0, window - n) * 2 * sbh


@pytest.mark.parametrize("depth", [1, 2])
def test_swap_buffers_are_the_throttles_window_by_hand(depth: int) -> None:
    """GPT-3 13B, micro-batch 32: a block's full activations are 5.3125 GiB, a checkpoint 0.3125
    GiB; at depth 1 (Fuyou's preset) one swapped block and two checkpoints are 5.9375 GiB, three
    blocks 15.9375 GiB; at depth 2 one block and three checkpoints 6.25 GiB, four blocks 21.25 GiB."""
    cfg = _fuyou_13b_cfg(32, depth)
    choice = choose_swap_blocks(cfg, state_sizes(cfg), "nvme")
    assert [choice.candidates[n].gpu.buffers_bytes for n in range(6)] == \
        [_hand_buffers_bytes(n, 32, depth) for n in range(6)]
    assert choice.candidates[1].gpu.buffers_bytes == {1: 5.9375, 2: 6.25}[depth] * GiB
    assert choice.candidates[40].gpu.buffers_bytes == {1: 15.9375, 2: 21.25}[depth] * GiB


def test_gpu_memory_not_time_binds_fuyous_swap_at_batch_64() -> None:
    """Fuyou's benchmark shape at micro-batch 64: the model's time alone would swap 4 blocks (the
    GPU term binds and each swapped block saves its recompute), but what the all-recompute
    plan's other GPU needs leave of the 24 GiB (a few GiB) holds the three host checkpoints in
    flight at Fuyou's depth 1 (1.875 GiB) and not one block's 10.6 GiB of activations (11.875 GiB
    with two checkpoints): the rule swaps nothing, and says so."""
    cfg = _fuyou_13b_cfg(64)
    choice = choose_swap_blocks(cfg, state_sizes(cfg), "nvme")
    left = choice.candidates[0].gpu.left_bytes
    assert _hand_buffers_bytes(0, 64) <= left < _hand_buffers_bytes(1, 64)
    time_best = min(choice.candidates, key=lambda c: (c.estimate_s, c.blocks)).blocks
    assert time_best > 0 and choice.gpu_binds
    assert choice.gpu_limit == 0 and choice.blocks == 0
    chosen = resolve_auto_swap(cfg).strategy.policies.activations.chosen
    assert chosen.blocks == 0 and "GPU memory bounds the swap at 0 blocks" in chosen.note


def test_gpu_limit_is_the_largest_count_whose_buffers_fit_by_hand() -> None:
    """Micro-batch 32 at prefetch depth 2 (Fuyou's preset before b47ba05; at its depth 1 every
    count fits at this batch): the room the other needs leave, against the hand-computed buffers of
    each count, gives the limit (2 blocks: 11.25 GiB of buffers), under the model's time-best 4."""
    cfg = _fuyou_13b_cfg(32, depth=2)
    choice = choose_swap_blocks(cfg, state_sizes(cfg), "nvme")
    by_hand = max(n for n in range(41) if _hand_buffers_bytes(n, 32, 2) <= choice.candidates[n].gpu.left_bytes)
    assert choice.gpu_limit == by_hand
    assert 0 < by_hand < 4 and choice.gpu_binds
    assert choice.blocks <= choice.gpu_limit


def test_fit_check_accepts_what_fuyous_gpu_rule_admits() -> None:
    """Fuyou's 13B at micro-batch 32 with 1 block swapped and 39 host checkpoints: the forward
    throttle lets depth + 2 = 3 consecutive offloaded layers occupy the GPU (Fuyou's depth 1), 1 block
    and 2 checkpoints (5.9375 GiB), not 3 x the block's 5.31 GiB = 15.94 GiB (Activations.footprint's
    window sum), so the fit check admits the block Fuyou's GPU-memory rule admits."""
    cfg = _fuyou_13b_cfg(32)
    choice = choose_swap_blocks(cfg, state_sizes(cfg), "nvme")
    assert choice.candidates[1].gpu.fits
    assert choice.candidates[1].fits


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(gpu_gib=st.sampled_from([0.17, 0.18, 0.19, 0.2, 0.21, 0.25, 16.0]), pcie=SCALE, nvme=SCALE,
       gpu=st.sampled_from([0.25, 1.0]), depth=st.sampled_from([0, 1, 2]), tier=st.sampled_from(["cpu", "nvme"]))
@example(gpu_gib=0.19, pcie=1.0, nvme=4.0, gpu=0.25, depth=2, tier="nvme")  # GPU memory binds: limit 1, time-best 4
def test_chosen_amount_fits_gpu_and_profiles_no_slower_than_recompute(gpu_gib, pcie, nvme, gpu, depth, tier) -> None:
    """On ``tiny`` with 0.17-16 GiB of GPU memory (its blocks' swap buffers are 16 MiB each, so
    the room binds anywhere from 0 to all 4 blocks), any link and SSD speeds and a GPU at 1/4 or
    full speed (recompute dear or cheap): the chosen count is within Fuyou's GPU-memory limit, its
    plan fits every tier by the fit check, and its profiled time is at most the all-recompute
    plan's (profiled alike, so no tolerance)."""
    s = load_strategy("fuyou")
    s = s.model_copy(update={"prefetch_depth": depth, "policies": s.policies.model_copy(
        update={"activations": AutoSwapConfig(tier=tier, checkpoint_tier="cpu")})})
    cfg = make_run_config(_tiny_with(gpu_gib, pcie, nvme, gpu), load_workload("tiny"), s)
    choice = choose_swap_blocks(cfg, state_sizes(cfg), tier)
    if not any(c.admissible for c in choice.candidates):
        assert choice.blocks == 0
        return
    c = choice.chosen
    assert c.admissible and c.gpu.buffers_bytes <= c.gpu.left_bytes and choice.blocks <= choice.gpu_limit
    plan = per_block_plan(cfg, choice.blocks, choice.total_blocks, tier)
    assert footprint(plan).first_overflow() is None
    recompute = choice.candidates[0]
    if recompute.admissible:
        assert c.simulated_s is not None and recompute.simulated_s is not None
        assert c.simulated_s <= recompute.simulated_s
