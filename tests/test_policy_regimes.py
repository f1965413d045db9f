"""Where the forward/backward zig-zag makes LRU optimal, and where it does not (issue 19).

The engine-level tests use real ``compare`` runs: Llama-2 13B, ``zero-infinity-nvme`` on
``rtx4090-pcie4-ws``, the issue's configuration. Each test states its expectation in terms that
can be checked by hand: tensor sizes, budgets and how many re-fetches happen. The bound is exact
in every row here (``bound_exact``), so "at the bound" means "optimal for fetch on demand".

The GPU parameter buffer's misses cross two links, NVMe then H2D. One re-fetch of a tensor of
``s`` bytes therefore costs ``2 s`` bytes over all links.
"""

from __future__ import annotations

import pytest

from offsim.cache_stats import access_sequence
from offsim.compare import GPU_PARAMS, policy_variants, run_variants
from offsim.config.loading import load_strategy, load_workload
from offsim.engine.cache import replay
from offsim.metrics import steady_iterations
from offsim.policies.bounds import bound, build_problem
from offsim.policies.lru import Lru

HW, WL, ST = "rtx4090-pcie4-ws", "llama2-13b", "zero-infinity-nvme"
LINKS_PER_MISS = 2  # NVMe read, then H2D


def _gpu_sizes(result) -> tuple[list[int], dict[int, float]]:
    steady = steady_iterations(result.config, result.recorder)[0]
    return access_sequence(result.recorder, GPU_PARAMS, steady[:1])


def test_zigzag_lru_is_optimal_unless_the_embedding_fits_the_room_left() -> None:
    """Forward embedding, 40 blocks, head; backward head, blocks, embedding. At the turn LRU holds
    the head and the ``k = floor((C - head) / block)`` blocks used last, and those are exactly the
    hits any schedule can have among the blocks. The optimum can also keep the embedding (used
    first and last) for the whole iteration, in the room ``C - head - k * block`` the blocks leave,
    if it fits; LRU evicted it first. So LRU is at the bound when that room is smaller than the
    embedding. Otherwise LRU is one embedding re-fetch above it (2 x 327.68 MB).

    Measured: LRU is at the bound at 4, 8, 10 and 14 GiB (rooms of 161, 15, 259 and 113 MB) and
    655.36 MB above it at 6, 12 and 16 GiB (rooms of 405, 503 and 358 MB)."""
    budgets = [4.0, 6.0, 8.0, 10.0, 12.0, 14.0, 16.0]
    table, results = run_variants(HW, WL, policy_variants(load_strategy(ST), "lru", budgets, None))
    sequence, sizes = _gpu_sizes(results[0])
    embedding, block, head = sizes[sequence[0]], sizes[sequence[1]], sizes[sequence[len(sequence) // 2 - 1]]
    assert sequence == [*range(42), *reversed(range(42))]  # one zig-zag, no gradient accumulation
    assert embedding == 327_680_000 and block == 634_408_960
    fitting = []
    for (_, row), result in zip(table.iterrows(), results, strict=True):
        capacity = result.metrics.cache[GPU_PARAMS].capacity_bytes
        room = capacity - head - (capacity - head) // block * block
        fitting.append(room >= embedding)
        expected = LINKS_PER_MISS * embedding if room >= embedding else 0.0
        assert row["bound_exact"]
        assert row[f"regret_{GPU_PARAMS}_bytes"] == pytest.approx(expected, abs=1.0), row["cache_gib"]
    assert fitting == [False, True, False, False, True, False, True]


def test_gradient_accumulation_keeps_the_zigzag() -> None:
    """Two micro-batches: the first backward ends at layer 0, where the second forward starts,
    so the sequence is a zig-zag with a second turn at the embedding. Gradient accumulation does
    not break LRU by itself: at 8 GiB it is at the bound, as with one micro-batch. At 12 GiB the
    room left beside the blocks holds the odd-sized tensors across the turns. The optimum saves
    two re-fetches of the embedding and one of the head (2 x (2 x 327.68 + 327.69) MB), and LRU
    makes them all."""
    wl = load_workload(WL)
    wl = wl.model_copy(update={"training": wl.training.model_copy(update={"grad_accumulation": 2})})
    table, results = run_variants(HW, wl, policy_variants(load_strategy(ST), "lru", [8.0, 12.0], None))
    sequence, sizes = _gpu_sizes(results[0])
    zigzag = [*range(42), *reversed(range(42))]
    assert sequence == zigzag + zigzag
    embedding, head = sizes[0], sizes[41]
    assert table["bound_exact"].all()
    regret = list(table[f"regret_{GPU_PARAMS}_bytes"])
    assert regret[0] == 0.0
    assert regret[1] == pytest.approx(LINKS_PER_MISS * (2 * embedding + head), abs=1.0)


def test_optimizer_order_same_is_a_loop_that_defeats_lru_and_alternating_is_a_zigzag() -> None:
    """DRAM cache of 40 GiB over NVMe optimizer state: 14 sub-groups of 11.16 GB each (fp32
    master weights and two moments of 13B parameters). The cache holds 3 of them.

    * The ``same`` order reads 0..13 in every step. That is a loop longer than the cache, so LRU
      never hits (0 hits, 14 misses per step).
    * The optimum keeps 3 sub-groups resident across the steps. That saves their read and their
      write-back: 2 x 3 x 11.16 GB = 66.94 GB per iteration. MRU does exactly this.
    * The ``alternating`` order reads 0..13 then 13..0, a zig-zag, and puts LRU at the bound."""
    variants = policy_variants(load_strategy(ST), "lru,mru,lru+alternating", "auto", 40.0)
    table, results = run_variants(HW, WL, variants)
    table = table.set_index("variant")
    dram = results[0].metrics.cache["dram_optimizer"]
    sub_group = dram.bytes_fetched / dram.misses
    assert (dram.hits, dram.misses) == (0.0, 14.0)
    assert 3 * sub_group <= 40 * 2**30 < 4 * sub_group
    assert table["bound_exact"].all()
    assert table.loc["lru", "regret_dram_optimizer_bytes"] == pytest.approx(2 * 3 * sub_group, rel=1e-9)
    assert table.loc["mru", "regret_dram_optimizer_bytes"] == 0.0
    assert table.loc["lru+alternating", "regret_dram_optimizer_bytes"] == 0.0


def test_activations_sharing_the_buffer_make_lru_lose_on_a_zigzag() -> None:
    """Not expressible at engine level: offloaded activations are not in a cache that the
    eviction policies manage (the engine moves them by the activation policy). On a bare
    sequence: three layers' parameters p0..p2 and activations a0..a2 share one buffer of 3
    slots (all tensors 1 byte). Forward p0 a0 p1 a1 p2 a2, backward p2 a2 p1 a1 p0 a0.

    Evicting a parameter costs one re-fetch (1). Evicting an activation costs writing it out
    and reading it back (2). The zig-zag is the one LRU is optimal on with parameters alone
    (``test_policy_bounds.py``), but LRU does not look at cost. The bound (exact: an interval
    matrix with whole-tensor rooms) keeps the activations. The first access of every tensor
    (3 x 1 + 3 x 2 = 9) is paid by every schedule, so both sides include it.

    * 3 slots: LRU pays 15 and the optimum 13.
    * 4 slots: LRU pays 12 and the optimum 11.
    * 2 slots: both pay 15 (no room to choose)."""
    params, acts = [0, 1, 2], [10, 11, 12]
    seq = [t for k in range(3) for t in (params[k], acts[k])]
    seq += [t for k in reversed(range(3)) for t in (params[k], acts[k])]
    sizes = dict.fromkeys(params + acts, 1.0)
    cost = {t: (2.0 if t in acts else 1.0) for t in sizes}
    for slots, lru_cost, optimum in ((2.0, 15.0, 15.0), (3.0, 15.0, 13.0), (4.0, 12.0, 11.0)):
        served = replay(Lru(), seq, sizes, slots).served
        assert sum(cost[s.tensor] for s in served if not s.hit) == lru_cost
        b = bound(build_problem(seq, sizes, slots, read_bytes=cost))
        assert b.exact and b.lower_bytes == pytest.approx(optimum)
    # parameters alone on a zig-zag: LRU is at the bound
    p_only = [0, 1, 2, 2, 1, 0]
    assert replay(Lru(), p_only, dict.fromkeys(params, 1.0), 2.0).bytes_fetched == pytest.approx(
        bound(build_problem(p_only, dict.fromkeys(params, 1.0), 2.0)).lower_bytes)
