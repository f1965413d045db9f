"""The host-dispatch chain (offsim/mechanisms/host_dispatch.py): the GPU runs a unit only after
the host has issued it; DeepSpeed ZeRO-3's per-submodule hooks are host work
(strategy.zero3_submodule_host_s). Hand-computed."""

from __future__ import annotations

import pytest

from offsim import make_run_config, simulate
from offsim.config.run import RunConfig
from offsim.mechanisms.compute import Compute
from offsim.mechanisms.host_dispatch import (
    DispatchUnit,
    HostDispatched,
    break_even_submodule_host_s,
    dispatch_chain,
)
from offsim.plan import footprint as fp
from offsim.systems._ctx import Variants, build_ctx
from offsim.systems._part_fetch import compute, layer_submodules


def _with_host(strategy: str, host_s: float) -> RunConfig:
    cfg = make_run_config("tiny", "tiny", strategy)
    return cfg.model_copy(update={"strategy": cfg.strategy.model_copy(update={"zero3_submodule_host_s": host_s})})


def test_chain_host_bound_is_the_host_sum_plus_the_last_kernel():
    # host 2 s, GPU 1 s per unit: host ends 2, 4, 6; GPU ends 3, 5, 7; the GPU waits 2 + 1 + 1 = 4 s
    chain = dispatch_chain([DispatchUnit(2.0, 1.0)] * 3)
    assert chain.time_s == 7.0
    assert chain.gpu_wait_s == 4.0
    assert chain.launch_bound_share == pytest.approx(4 / 7)


def test_chain_compute_bound_is_the_first_issue_plus_the_kernels():
    # host 1 s, GPU 3 s per unit: the host runs ahead; 1 + 3 x 3 = 10 s
    chain = dispatch_chain([DispatchUnit(1.0, 3.0)] * 3)
    assert chain.time_s == 10.0
    assert chain.gpu_wait_s == 1.0


def test_chain_mixed():
    # host ends 1, 5, 6; GPU: max(0, 1) + 5 = 6, max(6, 5) + 1 = 7, max(7, 6) + 1 = 8
    chain = dispatch_chain([DispatchUnit(1.0, 5.0), DispatchUnit(4.0, 1.0), DispatchUnit(1.0, 1.0)])
    assert chain.time_s == 8.0
    assert chain.host_s == 6.0
    assert chain.gpu_s == 7.0


def test_break_even_per_submodule_host_time():
    # GPU 1 s per unit, 2 submodules each at h: T(h) = max(2h + 3, 4h + 2, 6h + 1); T = 7 at h = 1
    assert break_even_submodule_host_s([1.0] * 3, [2] * 3, 7.0) == pytest.approx(1.0, rel=1e-9)
    # the kernels alone take 3 s: any pass of at most 3 s needs no host time
    assert break_even_submodule_host_s([1.0] * 3, [2] * 3, 3.0) == 0.0


def test_tiny_forward_is_the_host_issue_when_the_host_dominates():
    """tiny (4 blocks, standard MLP, 4 attention matrices, an LM head) under Deep Optimizer States
    (DeepSpeed ZeRO-3, parameters on the GPU) at 1 s per submodule: the embedding 1 submodule,
    each block 1 + 2 norms + attention + 4 projections + MLP + 2 projections = 11, the head 2:
    47 s of host issue, then the head's forward kernel; no block's kernels (14 ms) outlast the
    next layer's issue (11 s)."""
    cfg = _with_host("deep-optimizer-states", 1.0)
    c = build_ctx(cfg, None, Variants(deepspeed_grads=True))
    assert layer_submodules(c) == (1, 11, 11, 11, 11, 2)
    head_s = fp.state_sizes(cfg).layers[-1].fwd_s
    forward_s = simulate(cfg).metrics.phases_s.forward
    assert forward_s == pytest.approx(47.0 + head_s, rel=1e-12)


def test_dos_7b_forward_host_one_layer_ahead_matches_the_chain():
    """dos-7b on a100-80gb-pcie4 (32 blocks of 4.37 ms forward kernels, 12 submodules each) at
    0.1 ms per submodule (1.2 ms a block, under every block's kernels): the GPU waits only for
    the embedding's and the first block's issue, as :func:`dispatch_chain` of the same layers."""
    base = make_run_config("a100-80gb-pcie4", "dos-7b", "deep-optimizer-states")
    cfg = base.model_copy(update={"strategy": base.strategy.model_copy(
        update={"zero3_submodule_host_s": 1e-4, "optimizer_split": "fixed"})})
    c = build_ctx(cfg, None, Variants(deepspeed_grads=True))
    chain = dispatch_chain([DispatchUnit(n * 1e-4, lay.fwd_s) for n, lay in zip(layer_submodules(c), c.layers,
                                                                                  strict=True)])
    assert chain.time_s == pytest.approx((1 + 12) * 1e-4 + sum(lay.fwd_s for lay in c.layers[1:]), rel=1e-12)
    assert simulate(cfg).metrics.phases_s.forward == pytest.approx(chain.time_s, rel=1e-9)


def test_off_by_default_and_only_on_deepspeed_zero3():
    assert isinstance(compute(build_ctx(_with_host("deep-optimizer-states", 0.0), None,
                                        Variants(deepspeed_grads=True))), Compute)
    assert isinstance(compute(build_ctx(_with_host("deep-optimizer-states", 1e-3), None,
                                        Variants(deepspeed_grads=True))), HostDispatched)
    # ZeRO-Offload (stage 2) has no per-submodule parameter hooks: the field is ignored
    off = _with_host("zero-offload", 1.0)
    assert simulate(off).metrics.phases_s.forward == simulate(_with_host("zero-offload", 0.0)).metrics.phases_s.forward
