"""Host memory of the MLP-Offload fork (DataStates/DeepSpeed, branch dist_nvme_opt, DeepSpeed 0.13.3),
as the DataStates/artifacts MLP-Offload 70B logs show it: one pinned swap-buffer pool per storage
path, the DRAM cache inside those buffers, the 16-bit gradients in ONE pinned flat tensor made from a
written ``torch.zeros`` source. Hand-computed figures on polaris-a100-grand with Llama-2 7B."""

from __future__ import annotations

import math

import pytest

from offsim import load_profile, load_strategy, load_workload, make_run_config
from offsim.config.run import RunConfig
from offsim.errors import ConfigError
from offsim.fit_check import footprint
from offsim.plan.footprint import deepspeed_sub_groups, param_partitions, state_sizes
from offsim.plan.startup import startup_peak
from offsim.systems._part_static import SWAP_BUFFERS, cached_subgroups_per_path
from offsim.systems.mlp_offload import fork_cache_bytes, with_ratio_share

HW = "polaris-a100-grand"
GRADS = "grads (optimizer format)"
FORK_BUFFERS = f"{SWAP_BUFFERS}, less the DRAM cache they hold"
CACHE = "DRAM cache of optimizer state"
STARTUP = "transient peak at start-up (pin_memory() copies, scratch)"


def pow2(nbytes: float) -> float:
    """PyTorch's caching host allocator: a pinned request rounded up to a power of two."""
    return float(2 ** math.ceil(math.log2(nbytes)))


def config(hw: str | object = HW, **update) -> RunConfig:
    """The shipped mlp-offload strategy (pin_memory, caching allocator, delayed_grad_conversion,
    dist_opt_ratio 3) with parameters on the GPU as in the artifact, ``update`` on top."""
    st = load_strategy("mlp-offload")
    base = {"placement": st.placement.model_copy(update={"params": "gpu"})}
    return make_run_config(hw, load_workload("llama2-7b"), st.model_copy(update={**base, **update}))


def fork_cache(cfg: RunConfig, buffer_count: int) -> RunConfig:
    st = cfg.strategy
    pol = st.policies.model_copy(update={"dram_cache_gib": 0.0})
    opts = {**st.system_options, "cache_in_swap_buffers": True}
    return cfg.model_copy(update={"strategy": st.model_copy(update={
        "optimizer_buffer_count": buffer_count, "policies": pol, "system_options": opts})})


def largest_group(cfg: RunConfig) -> int:
    sz = state_sizes(cfg)
    return max(deepspeed_sub_groups(param_partitions(cfg, sz), cfg.strategy.sub_group_params))


@pytest.mark.parametrize(("buffer_count", "cached"), [(25, 5), (32, 7), (16, 3), (8, 1), (4, 0), (3, 0)])
def test_cached_subgroups_per_path(buffer_count: int, cached: int) -> None:
    """stage3.py ``_configure_tensor_swapping``: ``dist_opt_buffer_count = buffer_count // 4 - 1``
    (p, m, v, g per cached sub-group; the rest for the pipeline); the 70B log's 25 gives 5."""
    assert cached_subgroups_per_path(buffer_count) == cached


def test_16bit_grads_are_one_pinned_tensor_pinned_by_copy() -> None:
    """grad_partitions_flat_buffer (stage3.py ``_setup_for_real_optimizer``): ONE torch.zeros of the
    rank's partition, pinned: rounded up once to a power of two, and its pageable source resident
    beside the pinned copy, the largest transient of the set-up."""
    cfg = config()
    sz = state_sizes(cfg)
    g = sz.params_total / sz.grad_part * 2.0  # bf16 gradients, whole model on one rank (dp 1)
    assert sz.host_grad_bytes_per_param == 2.0
    fp = footprint(cfg, sz)
    assert fp.breakdown["host_pinned"][GRADS] == pow2(g)  # 13.5e9 B -> 16 GiB, not rounded per sub-group
    assert pow2(g) == 16 * 2**30
    assert fp.breakdown["host"][STARTUP] == pytest.approx(g, abs=1.0)  # the written source, 12.55 GiB


def test_startup_peak_counts_the_gradient_source() -> None:
    """The start-up report (offsim fit) holds the same source beside the built buffers."""
    cfg = config()
    sz = state_sizes(cfg)
    peak = startup_peak(cfg, sz, footprint(cfg, sz))
    g = sz.params_total * 2.0
    assert peak.items["host"]["pageable source of grad_partitions_flat_buffer (_setup_for_real_optimizer)"] == (
        pytest.approx(g))


def test_swap_buffers_one_pool_per_path_holding_the_cache() -> None:
    """Two paths (NVMe;PFS, dist_opt_ratio 3): two SwapBufferManagers of buffer_count buffers of the
    largest sub-group in fp32, each rounded to a power of two; the DRAM cache is 2 x (25 // 4 - 1)
    sub-groups of fp32 master and moments (12 B) inside them, counted once."""
    cfg = fork_cache(config(), 25)
    big = largest_group(cfg)
    fp = footprint(cfg)
    pinned = fp.breakdown["host_pinned"]
    cache = 2 * 5 * big * 12.0
    assert fork_cache_bytes(with_ratio_share(cfg, None), state_sizes(cfg)) == cache  # 2 paths once the ratio is read
    assert fork_cache_bytes(cfg, state_sizes(cfg)) == cache / 2  # before it: no PFS share, one path
    assert pinned[CACHE] == pytest.approx(cache, abs=1.0)
    total = 2 * 25 * pow2(big * 4.0)
    assert pinned[FORK_BUFFERS] + pinned[CACHE] == pytest.approx(total, abs=2.0)
    assert SWAP_BUFFERS not in pinned  # the generic single pool is replaced


def test_one_path_without_a_pfs() -> None:
    """No PFS in the profile: one swapper, buffer_count buffers, 1 x 3 cached sub-groups at 16."""
    hw = load_profile(HW).model_copy(update={"pfs": None})
    cfg = fork_cache(config(hw), 16)
    big = largest_group(cfg)
    pinned = footprint(cfg).breakdown["host_pinned"]
    assert pinned[CACHE] == pytest.approx(3 * big * 12.0, abs=1.0)
    assert pinned[FORK_BUFFERS] + pinned[CACHE] == pytest.approx(16 * pow2(big * 4.0), abs=2.0)


def test_a_hand_set_cache_is_kept_and_never_below_zero() -> None:
    """Without the option the strategy's dram_cache_gib (35.8) stands; 2 x 4 buffers of 1 GiB cannot
    hold it, so the buffers add nothing beyond the cache (the fork would cache nothing at 4)."""
    cfg = config()
    pinned = footprint(cfg).breakdown["host_pinned"]
    assert pinned[CACHE] == pytest.approx(35.8 * 2**30, rel=1e-9)
    assert FORK_BUFFERS not in pinned


def test_the_option_refuses_a_hand_set_cache() -> None:
    cfg = fork_cache(config(), 25)
    st = cfg.strategy
    bad = st.model_copy(update={"policies": st.policies.model_copy(update={"dram_cache_gib": 10.0})})
    with pytest.raises(ConfigError, match="cache_in_swap_buffers"):
        footprint(cfg.model_copy(update={"strategy": bad}))


def test_locked_swap_buffers_are_not_rounded() -> None:
    """``nvme_swap_buffers: locked`` (DeepSpeed v0.19.4+, exact-size mlock): 2 x 25 buffers of the
    largest sub-group's exact fp32 bytes."""
    cfg = fork_cache(config(nvme_swap_buffers="locked"), 25)
    big = largest_group(cfg)
    pinned = footprint(cfg).breakdown["host_pinned"]
    assert pinned[FORK_BUFFERS] + pinned[CACHE] == pytest.approx(2 * 25 * big * 4.0, abs=2.0)
