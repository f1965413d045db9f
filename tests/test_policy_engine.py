"""Policies inside whole simulations on the `tiny` profile: hand-counted fetches, properties of
OPT and of prefetch depth (Hypothesis), the DRAM optimizer cache, and illegal decisions."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs

from offsim import load_profile, load_strategy, load_workload, simulate
from offsim.config.run import RunConfig
from offsim.errors import PolicyError
from offsim.plan.footprint import state_sizes
from offsim.policies.base import Evict
from offsim.policies.lru import LruConfig

SETTINGS = settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
CACHING = ["lru", "fifo", "mru", "lfu", "belady", "opt"]


def _strategy(name: str = "zero-infinity-cpu", policies: dict | None = None, **fields):
    st = load_strategy(name)
    pol = st.policies.model_validate({**st.policies.model_dump(), **(policies or {})})
    return st.model_copy(update={"policies": pol, **fields})


def _workload(layers: int = 4, hidden: int = 1024, vocab: int = 8192, ga: int = 1):
    wl = load_workload("tiny")
    model = wl.model.model_copy(update={"layers": layers, "hidden": hidden, "ffn_hidden": 4 * hidden,
                                        "heads": hidden // 128, "vocab": vocab})
    training = wl.training.model_copy(update={"grad_accumulation": ga})
    return wl.model_copy(update={"model": model, "training": training})


def _run(st, wl=None, iterations: int = 3):
    cfg = RunConfig(hardware=load_profile("tiny"), workload=wl or _workload(), strategy=st,
                    iterations=iterations, warmup_iterations=1)
    result = simulate(cfg)
    assert result.feasible, result.metrics.infeasible_reason
    return result


def _layer_bytes(wl) -> list[float]:
    cfg = RunConfig(hardware=load_profile("tiny"), workload=wl, strategy=load_strategy("zero-infinity-cpu"))
    sz = state_sizes(cfg)
    return [lay.params * sz.param_bytes / sz.params_total for lay in sz.layers]


def _missed(result, iteration: int = 1) -> list[int]:
    return [e.tensor for e in result.recorder.cache_events
            if e.cache == "gpu_params" and e.iteration == iteration and e.kind == "miss"]


# ---------------------------------------------------------------- hand-counted
def test_default_rule_counts() -> None:
    """tiny has 6 layers (embed, 4 blocks, head). With no prefetch and a reuse distance of 0,
    forward fetches all 6; the head's backward follows its forward at once (reuse distance 0),
    so it stays; backward re-fetches the other 5: 11 misses, 1 hit per iteration."""
    r = _run(_strategy(policies={"prefetch": {"kind": "none"}}, reuse_distance_params=0.0))
    c = r.metrics.cache["gpu_params"]
    assert (c.hits, c.misses) == (1, 11)
    sizes = _layer_bytes(_workload())
    assert c.bytes_fetched == pytest.approx(2 * sum(sizes) - sizes[-1])
    assert _missed(r) == [0, 1, 2, 3, 4, 5, 4, 3, 2, 1, 0]


@pytest.mark.parametrize("keep", [1, 2, 3])
def test_keep_last_k_saves_the_turn_refetch(keep: int) -> None:
    """Keeping the last K layers resident: the first K backward ops find their layer on the GPU
    (no re-fetch) and every later one re-fetches, so backward fetches exactly layers N-K-1..0.
    DeepSpeed's rule already keeps the head (its reuse distance is 0), so against it the bytes
    saved are exactly those of the K-1 layers before the head."""
    wl = _workload()
    sizes = _layer_bytes(wl)
    n = len(sizes)
    base = _run(_strategy(policies={"prefetch": {"kind": "none"}}, reuse_distance_params=0.0), wl)
    kept = _run(_strategy(policies={"prefetch": {"kind": "none"},
                                    "eviction": {"kind": "static", "keep_last": keep}},
                          reuse_distance_params=0.0), wl)
    assert _missed(kept) == list(range(n)) + list(range(n - keep - 1, -1, -1))
    saved = base.metrics.cache["gpu_params"].bytes_fetched - kept.metrics.cache["gpu_params"].bytes_fetched
    assert saved == pytest.approx(sum(sizes[n - keep:n - 1]))
    assert base.metrics.traffic_bytes.h2d - kept.metrics.traffic_bytes.h2d == pytest.approx(saved)


def test_dram_cache_order() -> None:
    """zero-infinity-nvme on tiny with 7 sub-groups of ~115 MB and a 0.4 GiB DRAM cache (3 of
    them). Same order + LRU: each step evicts exactly the groups it needs next: no hits.
    Alternating order: the 3 groups updated last are the first ones needed: 3 hits per step,
    which is OPT (regret 0)."""
    wl = _workload()
    common = {"dram_cache_gib": 0.4}
    same = _run(_strategy("zero-infinity-nvme", {**common, "dram_eviction": {"kind": "lru"}},
                          sub_group_params=1e7), wl, iterations=4)
    alt = _run(_strategy("zero-infinity-nvme", {**common, "dram_eviction": {"kind": "lru"},
                                                "optimizer_order": {"kind": "alternating"}},
                         sub_group_params=1e7), wl, iterations=4)
    s, a = same.metrics.cache["dram_optimizer"], alt.metrics.cache["dram_optimizer"]
    assert (s.hits, s.misses) == (0, 7)
    assert (a.hits, a.misses) == (3, 4)
    assert a.bytes_over_offline_plan == 0 and s.bytes_over_offline_plan > 0
    assert a.bytes_written_back == pytest.approx(a.bytes_fetched)  # steady state: one out per one in
    assert alt.metrics.traffic_bytes.nvme_read < same.metrics.traffic_bytes.nvme_read
    assert alt.metrics.iteration_time_s < same.metrics.iteration_time_s


def test_no_dram_cache_every_group_misses() -> None:
    """DeepSpeed's behaviour: each sub-group is read and written every step."""
    c = _run(_strategy("zero-infinity-nvme", sub_group_params=1e7)).metrics.cache["dram_optimizer"]
    assert (c.hits, c.misses, c.bytes_over_offline_plan) == (0, 7, 0)
    assert c.bytes_fetched == c.bytes_written_back > 0


# ---------------------------------------------------------------- properties
@hs.composite
def shapes(draw):
    return _workload(layers=draw(hs.integers(1, 5)), hidden=draw(hs.sampled_from([256, 512, 1024])),
                     vocab=draw(hs.sampled_from([2048, 8192, 32768])), ga=draw(hs.integers(1, 2)))


@SETTINGS
@given(wl=shapes(), fraction=hs.floats(0.0, 1.0), depth=hs.integers(0, 2))
def test_opt_never_moves_more_bytes(wl, fraction: float, depth: int) -> None:
    """Over random shapes, budgets and prefetch depths, every policy sees the same OPT figure
    (the fewest bytes any schedule can fetch for this access sequence in this budget) and
    fetches at least that much. Fetching on demand, the ``opt`` policy attains it; with
    prefetch, the layers held for issued ops can keep it from following the plan, so it is
    compared with the bound only."""
    sizes = _layer_bytes(wl)
    budget = max(sizes) * (depth + 1) + fraction * sum(sizes)
    results = {}
    for kind in CACHING:
        st = _strategy(policies={"eviction": {"kind": kind}, "gpu_param_buffer_gib": budget / 2**30,
                                 "prefetch": {"kind": "lookahead", "depth": depth}})
        results[kind] = _run(st, wl, iterations=2).metrics.cache["gpu_params"]
    bound = results["opt"].offline_plan_bytes_fetched
    for kind, c in results.items():
        assert c.offline_plan_bytes_fetched == pytest.approx(bound), kind
        assert c.bytes_fetched >= bound * (1 - 1e-9), kind
        assert c.bytes_over_offline_plan >= 0, kind
    if depth == 0:
        assert results["opt"].bytes_fetched == pytest.approx(bound)
        assert results["opt"].bytes_over_offline_plan == 0


@SETTINGS
@given(wl=shapes())
def test_enough_memory_every_policy_moves_the_same_bytes(wl) -> None:
    """A budget that holds every layer: each is fetched once per iteration, whatever the policy."""
    total = sum(_layer_bytes(wl))
    h2d = set()
    for kind in [*CACHING, "static"]:
        st = _strategy(policies={"eviction": {"kind": kind}, "gpu_param_buffer_gib": 1.01 * total / 2**30})
        r = _run(st, wl, iterations=2)
        assert r.metrics.cache["gpu_params"].bytes_fetched == pytest.approx(total), kind
        h2d.add(round(r.metrics.traffic_bytes.h2d))
    assert len(h2d) == 1


@SETTINGS
@given(wl=shapes())
def test_depth_zero_exposes_every_transfer(wl) -> None:
    """Without prefetch the GPU waits for each parameter fetch from its first byte to its last:
    the stall equals the fetch time, layer by layer."""
    r = _run(_strategy(policies={"prefetch": {"kind": "none"}}), wl, iterations=2)
    steady = [s for s in r.recorder.spans if s.iteration == 1]
    fetches = {(s.phase, s.layer): s.end_s - s.start_s for s in steady if s.kind == "param_fetch"}
    stalls = {(s.phase, s.layer): s.end_s - s.start_s for s in steady
              if s.resource == "gpu_stall" and s.name.endswith("waits for params")}
    assert fetches and stalls.keys() == fetches.keys()
    for key, seconds in fetches.items():
        assert stalls[key] == pytest.approx(seconds)
    assert r.metrics.cache["gpu_params"].stall_s == pytest.approx(sum(fetches.values()))


@SETTINGS
@given(wl=shapes())
def test_deeper_prefetch_never_adds_stall(wl) -> None:
    """With memory to spare (tiny's 16 GiB GPU), each extra op of lookahead leaves the GPU
    waiting for parameters no longer."""
    stalls = [_run(_strategy(policies={"prefetch": {"kind": "lookahead", "depth": d}}), wl,
                   iterations=2).metrics.cache["gpu_params"].stall_s for d in range(4)]
    assert stalls[0] > 0
    for shallow, deep in itertools.pairwise(stalls):
        assert deep <= shallow + 1e-9


# ---------------------------------------------------------------- illegal decisions
class _EvictsTheCurrentLayer:
    name = "evicts-in-use"

    def victims(self, view, need_bytes):
        return [Evict(t) for t in sorted(view.pinned)]

    def releases(self, view):
        return ()


def test_evicting_a_layer_in_use_is_reported(monkeypatch) -> None:
    monkeypatch.setattr(LruConfig, "build", lambda self, ctx: _EvictsTheCurrentLayer())
    sizes = _layer_bytes(_workload())
    st = _strategy(policies={"eviction": {"kind": "lru"}, "gpu_param_buffer_gib": 2.5 * max(sizes) / 2**30})
    with pytest.raises(PolicyError, match=r"'evicts-in-use' at op \d+ \(forward block\d, micro-batch 0, "
                                          r"iteration 0\): evicts tensor \d, which is in use"):
        simulate(RunConfig(hardware=load_profile("tiny"), workload=_workload(), strategy=st))


def test_keeping_too_much_is_reported() -> None:
    """Keeping 4 of 6 layers in a budget of about 3 leaves no room for the rest: the static
    policy evicts too little, named with the op."""
    sizes = _layer_bytes(_workload())
    st = _strategy(policies={"eviction": {"kind": "static", "keep_first": 4},
                             "gpu_param_buffer_gib": 3 * max(sizes) / 2**30})
    with pytest.raises(PolicyError, match=r"static\(first=4\).*at op \d+ .*evicts too little"):
        simulate(RunConfig(hardware=load_profile("tiny"), workload=_workload(), strategy=st))


def test_out_of_order_prefetch_is_reported(monkeypatch) -> None:
    from offsim.policies.base import Fetch
    from offsim.policies.lookahead import LookaheadConfig

    class Skips:
        name = "skips-ahead"

        def fetches(self, view):
            return [Fetch(view.issued + 1)]

    monkeypatch.setattr(LookaheadConfig, "build", lambda self, ctx: Skips())
    with pytest.raises(PolicyError, match=r"'skips-ahead' before op 0: asks for op 2, .* the next is op 1"):
        _run(_strategy())


def test_a_bad_order_and_a_bad_activation_plan_are_reported(monkeypatch) -> None:
    from offsim.policies.base import ActivationDecision
    from offsim.policies.keep import KeepConfig
    from offsim.policies.same_order import SameOrderConfig

    class Repeats:
        name = "repeats"

        def order(self, iteration, n_groups):
            return [0] * n_groups

    monkeypatch.setattr(SameOrderConfig, "build", lambda self, ctx: Repeats())
    with pytest.raises(PolicyError, match=r"'repeats' at iteration 0: \[0, 0.*not a permutation"):
        _run(_strategy("zero-infinity-nvme", sub_group_params=1e7))

    class RecomputesAll:
        name = "recomputes-all"

        def plan(self, layers):
            return [ActivationDecision(lay.index, True, "gpu") for lay in layers]

    monkeypatch.setattr(KeepConfig, "build", lambda self, ctx: RecomputesAll())
    with pytest.raises(PolicyError, match=r"'recomputes-all' at layer embed: recompute applies"):
        _run(_strategy(policies={"activations": {"kind": "keep"}}))


def test_hardware_flops_count_the_recompute_a_policy_chose() -> None:
    """hardware TFLOPS = (model FLOPs + the forward FLOPs of every block the engine recomputed) /
    iteration time. tiny's workload without checkpointing, with a per-block policy recomputing 2
    of its 4 blocks: the extra is 2 block forwards per micro-batch."""
    from offsim.plan.model import build_layers, model_flop_per_iteration

    wl = _workload(layers=4)
    wl = wl.model_copy(update={"training": wl.training.model_copy(update={"activation_checkpointing": False})})
    st = _strategy("zero-offload", policies={"activations": {"kind": "per-block", "recompute": 2}},
                   activation_checkpointing=False)
    m = _run(st, wl).metrics
    block_fwd_flop = build_layers(wl, load_profile("tiny").gpu)[1].fwd_flop
    extra = 2 * block_fwd_flop * wl.training.grad_accumulation
    expected = (model_flop_per_iteration(wl) + extra) / m.iteration_time_s / 1e12
    assert m.hardware_tflops_per_gpu == pytest.approx(expected, rel=1e-9)
    assert m.hardware_tflops_per_gpu > m.tflops_per_gpu


def test_checkpoints_on_the_host_leave_the_gpu_and_come_back() -> None:
    """tiny, 4 blocks all recomputed, checkpoints on the host: each block's 16-bit input (2sbh
    bytes) goes D2H in forward and H2D in backward, for the blocks outside the last one, and
    the GPU peak falls by the checkpoints it no longer holds."""
    wl = _workload(layers=4)
    on_gpu = _strategy("zero-offload", policies={"activations": {"kind": "per-block", "recompute": 4}})
    on_cpu = _strategy("zero-offload", policies={"activations": {"kind": "per-block", "recompute": 4,
                                                                 "checkpoint_tier": "cpu"}})
    a, b = _run(on_gpu, wl).metrics, _run(on_cpu, wl).metrics
    t = wl.training
    ckpt_bytes = 2.0 * t.seq_len * t.micro_batch * wl.model.hidden
    moved = 4 * ckpt_bytes * t.grad_accumulation
    assert b.traffic_bytes.d2h - a.traffic_bytes.d2h == pytest.approx(moved)
    assert b.traffic_bytes.h2d - a.traffic_bytes.h2d == pytest.approx(moved)
    assert b.peak_bytes.gpu < a.peak_bytes.gpu
    assert b.peak_bytes.host_pinned > a.peak_bytes.host_pinned
