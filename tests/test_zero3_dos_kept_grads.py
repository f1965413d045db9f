"""Deep Optimizer States' fork keeps the boundary gradient of the sub-groups it updates on the GPU
on the GPU (DataStates/DeepSpeed deep-optimizer-states stage3.py ``partition_grads``:
``get_opt_update_device(i) == PF_OPT_GPU_ONLY`` -> ``gpu_fp32_grad_tensor.copy_(grad_buffer)`` into
``prefetch_optimizer_gpu_fp32_grads[i]``, bf16 as ``grad_accum_dtype``; ``opt_transfers`` then
takes it as the GPU update's ``.grad`` and brings only master, momentum and variance up). Counted
by hand on tiny with the fork's gap 2 (67,118,080 parameters in DeepSpeed's 6 sub-groups of
stage3.py ``_create_fp16_sub_groups`` at sub_group_size 1e7: 10,485,760 (embedding 8,388,608 +
Wq + Wk), 10,485,760, 12,584,960, 12,584,960, 12,584,960, 8,391,680; the GPU-only ones x = 1, 3,
5: 10,485,760 + 12,584,960 + 8,391,680 = 31,462,400 elements; one reduce bucket; HBM 1000 GB/s;
pinned D2H 1 GB/s). Before the fork's own sub-groups (tests/test_dos_fork.py) offsim split P into
7 equal ones, 3/7 of P on the GPU."""

from __future__ import annotations

import itertools

import pytest

from offsim import simulate
from offsim.config.loading import load_strategy
from offsim.config.run import RunConfig, make_run_config
from offsim.config.strategy import Strategy
from offsim.mechanisms.grads import Grads
from offsim.systems._parts import build_ctx
from offsim.systems._registry import compose
from offsim.systems.deep_optimizer_states import gpu_kept_share, split_bytes

P = 67_118_080
KEPT = 31_462_400  # elements of the GPU-only sub-groups


def _cfg(gap: int | None = 2) -> RunConfig:
    st = load_strategy("deep-optimizer-states")
    options = {} if gap is None else {"prefetch_optimizer_gap": gap}
    return make_run_config("tiny", "tiny", Strategy.model_validate({**st.model_dump(), "system_options": options}))


def _flows(cfg: RunConfig):
    g = compose(cfg).mechanisms["grads"]
    assert isinstance(g, Grads) and len(g.buckets) == 1
    return g.buckets[0].flows


def test_gap_two_keeps_the_odd_sub_groups_on_the_gpu() -> None:
    """fp32 D2H 4 x P - 4 x KEPT = 268,472,320 - 125,849,600 = 142,622,720 B; kept 2 x KEPT =
    62,924,800 B; GPU time 24 B x P (norms and fp32 cast) less KEPT x (6 - 4) B (a 16-bit copy
    instead of the cast), / 1e12."""
    c = build_ctx(_cfg())
    assert gpu_kept_share(c) == pytest.approx(KEPT / P)
    flows = _flows(_cfg())
    assert flows.boundary_d2h.nbytes == 268_472_320 - 125_849_600 == 142_622_720
    assert flows.boundary_kept_gpu_bytes == 62_924_800
    assert flows.boundary_norm_s == pytest.approx((24 * P - 2 * KEPT) / 1e12, rel=1e-12)


def test_gpu_sub_groups_bring_up_only_their_state() -> None:
    """The GPU update's gradient is on the GPU already: 12 B up per parameter (fp32 master,
    momentum, variance), not 16; with the performance model (no gap), whose choice comes at the
    step, the gradient goes down and up as before."""
    assert split_bytes(build_ctx(_cfg())).h2d_gpu == 12.0
    assert split_bytes(build_ctx(_cfg(None))).h2d_gpu == 16.0
    assert _flows(_cfg(None)).boundary_kept_gpu_bytes == 0


def test_kept_gradients_are_held_until_backward_ends() -> None:
    """Timeline, last iteration: the GPU level rises by 62,924,800 B after the norms and falls by
    it after the end-of-backward drain, where the boundary D2H (142,622,720 B at 1 GB/s) ends."""
    result = simulate(_cfg())
    spans = result.spans()
    last = spans[(spans.iteration == spans.iteration.max()) & (spans.kind == "grad_offload")].sort_values("start_s")
    norms = last[last.name.str.contains("gradient norms")].iloc[-1]
    d2h = last[last.resource == "d2h"].iloc[-1]
    assert d2h.bytes == 142_622_720
    assert d2h.end_s - d2h.start_s == pytest.approx(142_622_720 / 1e9, rel=1e-9)
    gpu = result.levels()
    gpu = gpu[gpu.tier == "gpu"].reset_index(drop=True)
    at_norms_end = gpu[(gpu.t_s - norms.end_s).abs() < 1e-9].bytes
    before = gpu[gpu.t_s < norms.end_s - 1e-9].bytes.iloc[-1]
    assert at_norms_end.iloc[-1] - before == 62_924_800
    at_end = [before, *gpu[(gpu.t_s - d2h.end_s).abs() < 1e-9].bytes.tolist()]
    falls = [a - b for a, b in itertools.pairwise(at_end)]
    assert 62_924_800 in falls  # freed at the drain's end (with the norms' and the bucket's bytes)
