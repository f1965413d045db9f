"""Deep Optimizer States as its artifact's fork runs it (DataStates/DeepSpeed deep-optimizer-states,
4570a955, the DeepSpeed of the sample logs): DeepSpeed's own sub-groups of the Megatron layout,
the fork's gap rule over them, the copier streams' round trips, the last GPU-only sub-group's
state that never comes back, and the fork's host and GPU memory. Counted by hand from the fork's
stage3.py and the artifact's 7B sample log (deep-optimizer-states/sample-logs/.../log-7B-...-
prefetch1-flush_async1-opt_gaps2.log)."""

from __future__ import annotations

import pytest

from offsim import simulate
from offsim.config.run import RunConfig
from offsim.plan import footprint as fp
from offsim.plan.optimizer_split import (
    fork_host_state,
    gap_gpu_share,
    gap_on_gpu,
    interleave,
    interleave_layout,
)
from offsim.systems._parts import build_ctx
from offsim.systems._registry import compose
from offsim.systems.deep_optimizer_states import fork_groups, fork_layout, fork_split, megatron_tensors
from offsim.validation import case_config, default_cases_path, load_cases

# dos-7b as Megatron-DeepSpeed registers it (32 x 4096, 32 heads / 4 KV heads of 128, SwiGLU 11008):
# per block the sub-groups both sample logs print (stage3.py _create_fp16_partitions_with_defragmentation:
# 'Subgroup 1, numel: 16781312', 'Subgroup 2, numel: 20971520', 90181632, 45088768, ...):
DENSE = 4096 + 4096 * 4096            # a norm + self_attention.dense: 16,781,312
QKV = 4096 * (4096 + 2 * 512)         # fused query_key_value alone: 20,971,520
FC1 = 4096 + 4096 * 2 * 11008         # post_attention_layernorm + fused dense_h_to_4h: 90,181,632
FC2 = 11008 * 4096                    # dense_4h_to_h: 45,088,768
EMBED = 50304 * 4096                  # word_embeddings: 206,045,184
HEAD = 4096 + 50304 * 4096            # final_layernorm + output_layer: 206,049,280
GPU_ELEMENTS = 32 * (DENSE + FC1) + HEAD  # the odd sub-groups: 3,628,863,488


def _dos() -> RunConfig:
    case = {c.id: c for c in load_cases(default_cases_path())}["dos-7b-deep-optimizer-states"]
    return case_config(case)


def test_gap_rule_by_hand() -> None:
    """get_opt_update_device: x % gap == 0 CPU-with-prefetch, else (x + 1) % gap == 0 GPU-only."""
    assert gap_on_gpu(5, 2) == [False, True, False, True, False]
    assert gap_on_gpu(7, 3) == [False, False, True, False, False, True, False]
    assert gap_gpu_share([10, 20, 30, 40], 2) == pytest.approx((20 + 40) / 100)


@pytest.mark.parametrize(("n", "gap"), [(7, 2), (130, 2), (10, 3), (11, 4), (2, 2)])
def test_layout_makes_the_spread_pick_the_forks_gpu_sub_groups(n: int, gap: int) -> None:
    """The mechanism picks positions with interleave over 0..n-1; the layout puts the fork's
    GPU-only sub-groups exactly there, each side in the fork's order (7, gap 2: 1 0 3 2 5 4 6)."""
    on_gpu = gap_on_gpu(n, gap)
    layout = interleave_layout(on_gpu)
    picked = interleave(list(range(n)), sum(on_gpu))
    assert sorted(layout) == list(range(n))
    assert {layout[p] for p in picked} == {x for x in range(n) if on_gpu[x]}
    gpu_side = [layout[p] for p in range(n) if p in picked]
    cpu_side = [layout[p] for p in range(n) if p not in picked]
    assert gpu_side == sorted(gpu_side) and cpu_side == sorted(cpu_side)
    if (n, gap) == (7, 2):
        assert layout == [1, 0, 3, 2, 5, 4, 6]


def test_megatron_sub_groups_are_the_logs_130() -> None:
    """sub_group_size 1e7 closes a group at the first tensor that reaches it: the embedding, per
    block [norm + dense], [QKV], [norm + fc1], [fc2], then [final norm + output layer]: 1 + 128 + 1
    = 130 (the log: After creating fp16 partitions: 130, each with the numel above), 5,948,837,888
    elements (the log's parameter count); the gap-2 GPU share 3,628,863,488 / 5,948,837,888."""
    c = build_ctx(_dos())
    tensors = megatron_tensors(c)
    assert tensors is not None and sum(tensors) == 5_948_837_888
    groups = fork_groups(c)
    assert groups == [EMBED, *[DENSE, QKV, FC1, FC2] * 32, HEAD]
    assert gap_gpu_share(groups, 2) == pytest.approx(GPU_ELEMENTS / 5_948_837_888)


def test_round_trips_on_the_copier_streams_and_the_last_state_stays() -> None:
    """Each GPU-only sub-group: 12 B per element up (fp32 master, momentum, variance; its gradient
    is on the GPU already) and 12 B down, except the last (x = 129, the output layer): none
    follows it to copy it back (opt_transfers of a CPU-with-prefetch sub-group does, and
    get_prev_next_subgroup_on_gpu from the next step's x = 0 finds none)."""
    c = build_ctx(_dos())
    groups, on_gpu = fork_layout(c, 2)
    split = fork_split(c, groups, on_gpu)
    gpu = [(p, s) for p, s, g in zip(groups, split.groups, on_gpu, strict=True) if g]
    assert len(gpu) == 65 and gpu[-1][0] == HEAD
    assert sum(s.to_gpu.nbytes for _, s in gpu) == 12 * GPU_ELEMENTS == 43_546_361_856
    assert gpu[-1][1].to_host.nbytes == 0
    assert sum(s.to_host.nbytes for _, s in gpu) == 12 * (GPU_ELEMENTS - HEAD) == 41_073_770_496


def test_host_and_gpu_state_by_hand() -> None:
    """fork_host_state on 16, 24, 8 elements, gap 2 (the middle on the GPU), fp32 state, bf16:
    pinned 3 x (64 + 128 + 32) = 672 B (24 x 4 = 96 B rounds to 128); one 16-bit buffer of the
    largest, 48 -> 64 B; CPU Adam moments (16 + 8) x 8 = 192 B; the GPU keeps 24 x 16 = 384 B."""
    def pow2(n: float) -> float:
        return fp.round_pinned(n, "caching")
    host = fork_host_state([16, 24, 8], 2, 4.0, 4.0, 2.0, pow2)
    assert (host.pinned_state_bytes, host.pinned_lp_bytes) == (672, 64)
    assert (host.cpu_moments_bytes, host.gpu_resident_bytes) == (192, 384)


def test_dos_7b_state_items() -> None:
    """dos-7b: the GPU keeps the output layer's 206,049,280 x 16 B = 3,296,788,480 B (3.07 GiB;
    the log's allocated memory after the step: 15.35 GiB against vanilla's 12.28); per block the
    pinned fp32 master and moments round 67.1 MB (64 MiB + 16 KiB) -> 128 MiB, 83.9 MB -> 128 MiB,
    360.7 MB -> 512 MiB, 180.4 MB -> 256 MiB, the embedding and the head 824 MB -> 1 GiB; CPU
    Adam's moments for the even sub-groups, (EMBED + 32 (QKV + FC2)) x 8 B."""
    system = compose(_dos())
    items = {i.what: i.nbytes for i in system.mechanisms["static"].items}  # type: ignore[attr-defined]
    mib = 2**20
    per_block = 3 * (128 + 128 + 512 + 256) * mib
    assert items["optimizer state: fp32 master params and moments, pinned per sub-group (fork)"] == (
        32 * per_block + 2 * 3 * 1024 * mib)
    assert items["16-bit cast buffers of the CPU sub-groups (fork)"] == 512 * mib  # 412 MB of the head
    assert items["optimizer state: CPU Adam moments of the CPU sub-groups (pageable)"] == (
        (EMBED + 32 * (QKV + FC2)) * 8)
    assert items["optimizer state of the last GPU sub-group, kept between steps (fork)"] == 3_296_788_480


def test_step_is_bound_by_the_copies() -> None:
    """The GPU-only sub-groups' copies go one after the other (one buffer): the step takes at
    least their sum at the profile's pinned rates (per copy, its size's rate), and the CPU's
    side (2.19e9 elements at 3.21e9/s) fits under it; within 10% more (the CPU side's 16-bit
    uploads share the H2D direction, GPU Adam between a copy up and its copy down)."""
    cfg = _dos()
    c = build_ctx(cfg)
    groups, on_gpu = fork_layout(c, 2)
    link = cfg.hardware.host_link
    copies_s = sum(12 * p / link.h2d.pinned.rate_bytes_per_s(12 * p) for p, g in zip(groups, on_gpu, strict=True) if g)
    copies_s += sum(12 * p / link.d2h.pinned.rate_bytes_per_s(12 * p)
                    for p, g in zip(groups[:-1], on_gpu[:-1], strict=True) if g and p != HEAD)
    step_s = simulate(cfg).metrics.phases_s.optimizer
    assert copies_s <= step_s <= 1.1 * copies_s


def test_cpu_sub_groups_go_home_pinned_beside_the_step() -> None:
    """The fork's CPU-updated sub-group (fc2, 45,088,768 elements): its bf16 parameters, 2 B
    each = 90,177,536 B, go H2D from the pinned cast buffer, not blocking the step's thread
    (downsample_fp32_fp16 on the executor, copier_fetch_fp16), where vanilla ZeRO-3 blocks on a
    pageable copy_."""
    from offsim.systems._part_optimizer import _group_io
    from offsim.systems.deep_optimizer_states import fork_cpu_io
    c = build_ctx(_dos())
    io, vanilla = fork_cpu_io(c, FC2), _group_io(c, FC2, False)
    assert io.params_home is not None and io.params_home.nbytes == 2 * FC2 == 90_177_536
    assert not io.home_blocks and vanilla.home_blocks
    pinned = c.cfg.hardware.host_link.h2d.pinned.rate_bytes_per_s(90_177_536)
    assert io.params_home.cap_bytes_per_s == pinned
