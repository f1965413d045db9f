"""Policies on hand-built views and access sequences, without the engine (pure, no SimPy).

Access sequences are replayed with fetch-on-demand by :func:`offsim.engine.cache.replay`; every
count below is worked out by hand in the test's docstring.
"""

from __future__ import annotations

import itertools
import math
from types import MappingProxyType

import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs

from offsim.config.strategy import Policies, Strategy
from offsim.engine.cache import Cache, replay
from offsim.errors import ConfigError, PolicyError
from offsim.plan.model import Layer
from offsim.policies import available, kinds
from offsim.policies.alternating import AlternatingOrder
from offsim.policies.base import Evict, MemoryView, PrefetchView
from offsim.policies.belady import Belady
from offsim.policies.bucket import BucketPrefetch
from offsim.policies.fifo import Fifo
from offsim.policies.lfu import Lfu
from offsim.policies.lookahead import LookaheadPrefetch
from offsim.policies.lru import Lru
from offsim.policies.mru import Mru
from offsim.policies.no_prefetch import NoPrefetch
from offsim.policies.offload import OffloadConfig
from offsim.policies.opt import Optimal, optimal_plan
from offsim.policies.per_block import PerBlockConfig
from offsim.policies.placement import PlacementActivations
from offsim.policies.reuse_distance import ReuseDistance
from offsim.policies.same_order import SameOrder
from offsim.policies.static import StaticResidency
from offsim.policies.window import WindowPrefetch
from tests.conftest import TEST_PROVENANCE

UNIT = dict.fromkeys(range(8), 1.0)


def _counts(policy, seq, sizes=UNIT, capacity=3.0) -> tuple[int, int, list[tuple[int, ...]]]:
    c = replay(policy, seq, sizes, capacity)
    return c.hits, c.misses, [s.victims for s in c.served]


def _bytes(policy, seq, sizes, capacity) -> float:
    return replay(policy, seq, sizes, capacity).bytes_fetched


# ---------------------------------------------------------------- eviction on hand-built sequences
SEQ = [0, 1, 2, 0, 3, 0, 4, 1]


def test_lru_counts() -> None:
    """Capacity 3: 0 1 2 miss; 0 hit; 3 evicts 1 (least recent); 0 hit; 4 evicts 2; 1 evicts 3."""
    assert _counts(Lru(), SEQ) == (2, 6, [(), (), (), (), (1,), (), (2,), (3,)])


def test_fifo_counts() -> None:
    """3 evicts 0 (first in) although 0 was just used; then 0 evicts 1, 4 evicts 2, 1 evicts 3."""
    assert _counts(Fifo(), SEQ) == (1, 7, [(), (), (), (), (0,), (1,), (2,), (3,)])


def test_mru_counts() -> None:
    """3 evicts 0 (used last); 0 evicts 3; 4 evicts 0; 1 is still there: a hit."""
    assert _counts(Mru(), SEQ) == (2, 6, [(), (), (), (), (0,), (3,), (0,), ()])


def test_lfu_counts() -> None:
    """0 0 0 1 2 then 3: 0 has 3 uses, 1 and 2 one each; the older of those (1) goes, so the last
    0 hits (LRU would have dropped 0, the least recent)."""
    seq = [0, 0, 0, 1, 2, 3, 0]
    assert _counts(Lfu(), seq)[:2] == (3, 4)
    assert _counts(Lru(), seq)[:2] == (2, 5)


def test_belady_counts() -> None:
    """3 evicts 2 (never used again); 4 evicts 0 (dead; ties go to the lowest id); 1 hits."""
    assert _counts(Belady(), SEQ) == (3, 5, [(), (), (), (), (2,), (), (0,), ()])


def test_mru_beats_lru_on_a_loop_larger_than_the_cache() -> None:
    """A loop of 4 through 3 slots: LRU always evicts the next one needed (0 hits); MRU keeps
    0 and 1 for the second pass, and 3 after evicting 1 (3 hits)."""
    seq = [0, 1, 2, 3, 0, 1, 2, 3]
    assert _counts(Lru(), seq)[0] == 0
    assert _counts(Mru(), seq)[0] == 3


def test_belady_is_not_optimal_in_bytes_with_sizes() -> None:
    """Sizes 2, 1, 1 (tensors 2, 1, 0) in a budget of 3, sequence 2 1 0 1 2. Belady evicts 2 for 0
    (2 is used furthest ahead) and pays 2 bytes again at the end: 2+1+1+2 = 6. MRU evicts 1,
    re-fetches it (1 byte) and keeps 2: 2+1+1+1 = 5, which is OPT."""
    sizes, seq = {0: 1.0, 1: 1.0, 2: 2.0}, [2, 1, 0, 1, 2]
    assert _bytes(Belady(), seq, sizes, 3.0) == 6.0
    assert _bytes(Mru(), seq, sizes, 3.0) == 5.0
    assert optimal_plan(seq, sizes, 3.0).total_bytes == 5.0
    assert _bytes(Optimal(), seq, sizes, 3.0) == 5.0


def test_static_keeps_its_tensors() -> None:
    """Keeping 0 under LRU: 3 evicts 1 (not 0), 4 evicts 2, and the last 0 hits."""
    policy = StaticResidency(frozenset({0}), Lru())
    hits, misses, victims = _counts(policy, [0, 1, 2, 3, 4, 0])
    assert (hits, misses) == (1, 5)
    assert all(0 not in v for v in victims)


def test_reuse_distance_releases() -> None:
    """Layers of 1 byte in the order 0 1 2 2 1 0 (forward then backward). With a threshold of
    1 byte, 0 (3 other bytes before its reuse) is released, 1 (1 byte: layer 2) kept, 2 (0
    bytes) kept; in backward nothing is used again, so everything goes."""
    seq = [0, 1, 2, 2, 1, 0]
    c = replay(ReuseDistance(1.0), seq, UNIT)
    assert [s.hit for s in c.served] == [False, False, False, True, True, False]
    assert c.bytes_evicted == 4.0  # 0 after forward; 2, 1 and 0 after their last use


# ---------------------------------------------------------------- OPT
def _exhaustive(seq, sizes, cap) -> float:
    """Fewest bytes over every schedule: any subset may be dropped at each miss."""
    states = {frozenset(): 0.0}
    for t in seq:
        new: dict[frozenset[int], float] = {}
        for held, cost in states.items():
            if t in held:
                options = [(held, cost)]
            elif sizes[t] > cap:
                options = [(held, cost + sizes[t])]
            else:
                options = [((held - frozenset(v)) | {t}, cost + sizes[t])
                           for r in range(len(held) + 1) for v in itertools.combinations(held, r)]
            for h, c in options:
                if sum(sizes[x] for x in h) <= cap + 1e-9 and c < new.get(h, math.inf):
                    new[h] = c
        states = new
    return min(states.values())


@hs.composite
def problems(draw, uniform: bool = False):
    n = draw(hs.integers(2, 5))
    sizes = dict.fromkeys(range(n), 1.0)
    if not uniform:
        for t in draw(hs.lists(hs.integers(0, n - 1), max_size=2, unique=True)):
            sizes[t] = draw(hs.sampled_from([0.5, 1.5, 2.0, 3.0]))
    seq = draw(hs.lists(hs.integers(0, n - 1), min_size=1, max_size=12))
    cap = draw(hs.floats(max(sizes.values()), sum(sizes.values())))
    return seq, sizes, cap


@settings(max_examples=150, deadline=None)
@given(problems())
def test_opt_is_the_exhaustive_optimum(problem) -> None:
    """The enumeration over minority-size tensors equals a search over every cache content."""
    seq, sizes, cap = problem
    plan = optimal_plan(seq, sizes, cap)
    assert plan.exact
    assert plan.total_bytes == pytest.approx(_exhaustive(seq, sizes, cap))


@settings(max_examples=100, deadline=None)
@given(problems())
def test_opt_never_fetches_more_than_any_policy(problem) -> None:
    seq, sizes, cap = problem
    opt = optimal_plan(seq, sizes, cap).total_bytes
    for policy in (Lru(), Fifo(), Mru(), Lfu(), Belady(), StaticResidency(frozenset({0}), Lru())):
        try:
            fetched = _bytes(policy, seq, sizes, cap)
        except PolicyError:  # the static policy may keep too much for the budget
            continue
        assert opt <= fetched + 1e-9
    assert _bytes(Optimal(), seq, sizes, cap) == pytest.approx(opt)


@settings(max_examples=100, deadline=None)
@given(problems(uniform=True))
def test_belady_is_opt_with_one_size(problem) -> None:
    seq, sizes, cap = problem
    assert _bytes(Belady(), seq, sizes, cap) == optimal_plan(seq, sizes, cap).total_bytes


# ---------------------------------------------------------------- the cache's checks
class _Fixed:
    """A test policy that always names the same victims."""

    def __init__(self, victims: list[int]) -> None:
        self.name = "fixed-test"
        self.out = [Evict(v) for v in victims]

    def victims(self, view, need_bytes):
        return self.out

    def releases(self, view):
        return ()


def _cache(policy) -> Cache:
    return Cache("gpu_params", policy, [0, 1, 2], UNIT, 2.0, lambda p: f"op {p} (forward block{p})")


@pytest.mark.parametrize(("victims", "message"), [
    ([1], "evicts tensor 1, which is in use"),
    ([2], "evicts tensor 2, which is not resident"),
    ([0, 0], "names a tensor twice"),
    ([], "evicts too little"),
])
def test_illegal_victims_are_reported(victims, message) -> None:
    """Tensor 1 is pinned (issued, not finished) when tensor 2 needs room; the error names the
    policy and the op."""
    cache = _cache(_Fixed(victims))
    cache.serve(0)
    cache.done(0)
    cache.serve(1)
    with pytest.raises(PolicyError, match=message) as err:
        cache.serve(2)
    assert "'fixed-test'" in str(err.value)
    assert "op 2 (forward block2)" in str(err.value)


def test_a_prefetch_without_room_waits() -> None:
    """The same illegal-by-omission answer on a prefetch is not an error: the fetch waits."""
    cache = _cache(_Fixed([]))
    cache.serve(0)
    cache.done(0)
    cache.serve(1)
    assert cache.serve(2, due=False) is None
    assert set(cache.resident) == {0, 1}


# ---------------------------------------------------------------- prefetch
def _pview(position: int, issued: int, *, capacity=math.inf, free=math.inf, resident=(),
           pinned=0.0) -> PrefetchView:
    seq = (0, 1, 2, 3, 3, 2, 1, 0)
    sizes = MappingProxyType({0: 1.0, 1: 2.0, 2: 2.0, 3: 1.0})
    return PrefetchView(position, issued, seq, sizes, frozenset(resident), pinned, capacity, free, 1.0)


def test_lookahead_and_none() -> None:
    assert [f.position for f in LookaheadPrefetch(2).fetches(_pview(1, 2))] == [2, 3]
    assert [f.position for f in LookaheadPrefetch(2).fetches(_pview(6, 7))] == [7]  # the sequence ends
    assert list(NoPrefetch().fetches(_pview(1, 2))) == []


def test_bucket_counts_bytes_ahead() -> None:
    """Bucket of 3 params (1 byte each) before op 1 (layer 1 resident and pinned, 2 bytes):
    layers 2 (2 bytes) and 3 (1 byte) fill it; ops 4, 5, 6 reuse layers 3, 2, 1 (free); op 7
    (layer 0, 1 byte, no longer resident) would overflow it. A bucket below layer 2's size
    prefetches nothing."""
    view = _pview(1, 2, resident={1}, pinned=2.0)
    assert [f.position for f in BucketPrefetch(3.0, 1e9).fetches(view)] == [2, 3, 4, 5, 6]
    assert [f.position for f in BucketPrefetch(1.9, 1e9).fetches(view)] == []


def test_window_fills_the_budget() -> None:
    """Budget 6 bytes with 2 pinned: layers 2 (2) and 3 (1) fit, ops 4-5 repeat them, op 6 is
    layer 1, already resident; then layer 0 (1 byte) fits too (2+2+1+1 = 6)."""
    view = _pview(1, 2, capacity=6.0, resident={1}, pinned=2.0)
    assert [f.position for f in WindowPrefetch(0.0, 64).fetches(view)] == [2, 3, 4, 5, 6, 7]
    view = _pview(1, 2, capacity=5.0, resident={1}, pinned=2.0)
    assert [f.position for f in WindowPrefetch(0.0, 64).fetches(view)] == [2, 3, 4, 5, 6]


# ---------------------------------------------------------------- activations and order
def _layers(blocks: int) -> list[Layer]:
    names = ["embed", *[f"block{i}" for i in range(blocks)], "head"]
    return [Layer(i, n, 10, 1.0, 1.0, 2.0, 100.0, 10.0) for i, n in enumerate(names)]


def test_placement_keeps_the_last_layers() -> None:
    """6 layers, prefetch depth 1: layers 0..3 offload (backward reaches them 2+ layers later),
    4 and 5 stay; checkpointing applies to blocks only."""
    plan = PlacementActivations(True, "cpu", 1).plan(_layers(4))
    assert [d.tier for d in plan] == ["cpu"] * 4 + ["gpu"] * 2
    assert [d.recompute for d in plan] == [False, True, True, True, True, False]


def test_per_block_and_offload() -> None:
    plan = PerBlockConfig(offload=2, recompute=1, tier="nvme").build(_ctx()).plan(_layers(4))
    assert [(d.tier, d.recompute) for d in plan] == [
        ("gpu", False), ("nvme", False), ("nvme", False), ("gpu", True), ("gpu", False), ("gpu", False)]
    plan = OffloadConfig(kind="offload-nvme", keep_last=0).build(_ctx()).plan(_layers(2))
    assert [d.tier for d in plan] == ["nvme", "nvme", "nvme", "gpu"]
    with pytest.raises(ConfigError, match="exceeds the 4 blocks"):
        PerBlockConfig(offload=3, recompute=2).build(_ctx()).plan(_layers(4))


def test_per_block_checkpoints_wait_in_their_tier() -> None:
    """checkpoint_tier: the recomputed blocks' inputs wait in host memory (Fuyou's save_on_cpu,
    DeepSpeed's cpu_checkpointing); swapped and kept blocks are unchanged."""
    plan = PerBlockConfig(offload=1, recompute=2, tier="nvme", checkpoint_tier="cpu").build(_ctx()).plan(_layers(4))
    assert [(d.tier, d.recompute) for d in plan] == [
        ("gpu", False), ("nvme", False), ("cpu", True), ("cpu", True), ("gpu", False), ("gpu", False)]


def _ctx():
    from offsim.policies.base import BuildContext

    return BuildContext(n_tensors=6, prefetch_depth=1)


def test_orders() -> None:
    assert list(SameOrder().order(3, 4)) == [0, 1, 2, 3]
    assert list(AlternatingOrder().order(0, 4)) == [0, 1, 2, 3]
    assert list(AlternatingOrder().order(1, 4)) == [3, 2, 1, 0]


# ---------------------------------------------------------------- configuration
def test_unknown_kind_lists_the_valid_ones() -> None:
    with pytest.raises(ValueError, match="'lru', 'fifo', 'mru', 'lfu', 'belady', 'belady-size', 'opt', 'static'"):
        Strategy.model_validate({"name": "x", "provenance": TEST_PROVENANCE.model_dump(),
                                 "policies": {"eviction": {"kind": "lruu"}}})


def test_defaults_and_registry() -> None:
    p = Policies()
    assert (p.eviction.kind, p.prefetch.kind, p.activations.kind, p.optimizer_order.kind) == (
        "reuse-distance", "lookahead", "placement", "same")
    assert p.gpu_param_buffer_gib is None and p.dram_cache_gib == 0.0
    assert set(available()) == {"eviction", "prefetch", "activations", "optimizer_order"}
    assert kinds("prefetch") == ["lookahead", "none", "bucket", "window"]


def test_view_is_read_only() -> None:
    cache = _cache(Lru())
    cache.serve(0)
    view: MemoryView = cache.view(0)
    with pytest.raises(TypeError):
        view.entries[5] = view.entries[0]  # type: ignore[index]
    with pytest.raises(AttributeError):
        view.position = 3  # type: ignore[misc]
