"""DeepSpeed ZeRO-3 gathers per submodule (offsim/plan/zero3_fetch.py), and memory-centric tiling
(``strategy.zero3_tiles_per_linear``) splits each block Linear's fetch unit: hand-computed windows,
the engine's parameter peak, and the timeline left per layer."""

from __future__ import annotations

import pytest

import offsim.systems._part_fetch as part_fetch
from offsim import load_profile, load_strategy, load_workload, make_run_config, simulate
from offsim.config.ds_config import ds_config_from_strategy, reading_from_ds_config
from offsim.config.run import RunConfig
from offsim.fit_check import footprint
from offsim.plan.footprint import state_sizes
from offsim.plan.zero3_fetch import (
    Zero3FetchRule,
    fetch_trace,
    fetch_units,
    prefetch_params,
    retained_params,
    trace_peaks,
)
from offsim.simulation import make_executor
from offsim.validation import case_config, default_cases_path, load_cases

WINDOW = "gathered params window"


def _tiny_small_vocab_config(tiles: int, prefetch_depth: int = 0, reuse: float = 0.0) -> RunConfig:
    """``tiny`` (hidden 1024, FFN 4096, 4 blocks, no biases, untied) with a 1024-token vocabulary,
    so a block's FFN matrix (1024 x 4096 = 4,194,304) is the model's largest tensor (the
    embedding and the head are 1024 x 1024 = 1,048,576); ZeRO-Infinity with CPU parameters on one
    GPU (a partition group of one: one copy in flight)."""
    wl = load_workload("tiny")
    wl = wl.model_copy(update={"model": wl.model.model_copy(update={"vocab": 1024})})
    st = load_strategy("zero-infinity-cpu").model_copy(update={
        "prefetch_depth": prefetch_depth, "reuse_distance_params": reuse, "zero3_tiles_per_linear": tiles})
    return RunConfig(hardware=load_profile("tiny"), workload=wl, strategy=st)


def test_fetch_units_are_the_block_matrices_and_tiles_split_them() -> None:
    """tiny block: Wq, Wk, Wv, Wo 1024 x 1024 = 1,048,576 each, FC1 and FC2 1024 x 4096 =
    4,194,304 each, the two RMSNorms 2 x 1024 = 2048; tiles of 2 halve every matrix (524,288 and
    2,097,152), the norms stay one unit; the embedding is never tiled."""
    cfg = _tiny_small_vocab_config(tiles=1)
    model, layers = cfg.workload.model, state_sizes(cfg).layers
    block = layers[1]
    assert fetch_units(model, block) == [1_048_576] * 4 + [4_194_304] * 2 + [2048]
    assert fetch_units(model, block, 2) == [524_288] * 8 + [2_097_152] * 4 + [2048]
    assert sum(fetch_units(model, block, 3)) == block.params
    assert max(fetch_units(model, block, 3)) == 1_398_102  # ceil(4,194,304 / 3)
    assert fetch_units(model, layers[0], 2) == [1_048_576]


def test_prefetch_takes_until_the_bucket_is_reached_and_overshoots_by_one() -> None:
    """budget = min(max_live - current, bucket): current 60, max_live 150, bucket 50 -> 50; 40
    is taken (40 < 50), then 60 (the test comes before the add: 100), then the budget is met.
    A module already gathered (the current one) is skipped. Current 150 >= max_live: no budget."""
    rule = Zero3FetchRule(gather_copies=1, prefetch_bucket_params=50, max_live_params=150)
    following = [(0, (0, 0), 60), (1, (1, 0), 40), (1, (1, 1), 60), (2, (2, 0), 100)]
    assert prefetch_params((0, (0, 0), 60), following, rule) == 100
    assert prefetch_params((3, (3, 0), 150), [(4, (4, 0), 10)], rule) == 0
    # current 100: budget min(50, 50) = 50; 10, 30 (40 < 50), then 30: 70
    after = [(4, (4, k), n) for k, n in enumerate((10, 30, 30, 5))]
    assert prefetch_params((3, (3, 0), 100), after, rule) == 70


def test_layer_peaks_count_a_coalesced_gather_in_flight_twice() -> None:
    """Two layers of units [100] and [40, 60], no recompute; trace: 100, 40, 60 (forward), 60,
    40, 100 (backward); copies 2, bucket 50, max_live 150. A gather of several parameters costs
    twice in flight, of one parameter once (partition_parameters.py ``all_gather_coalesced``).
    Layer 0 as 100 (forward): budget min(50, 50) = 50, takes 40 then 60 (two parameters) ->
    100 + 2 x 100 = 300. Layer 1 as 40 (forward): budget 50, takes 60 alone (60 >= 50) ->
    40 + 60 = 100 (was 40 + 2 x 60 = 160); as 60 (forward): budget 50, the next 60 is itself
    (skipped), takes 40 then 100 -> 60 + 2 x 140 = 340. Without prefetch each module's own
    gather, one parameter, once: [100, 60] (was twice, [200, 120])."""
    rule = Zero3FetchRule(gather_copies=2, prefetch_bucket_params=50, max_live_params=150)
    trace = fetch_trace([[100], [40, 60]], [False, False])
    assert [u for _, _, u in trace] == [100, 40, 60, 60, 40, 100]
    assert trace_peaks(trace, 2, rule) == [300, 340]
    assert trace_peaks(trace[1:3], 2, rule) == [0, 100]  # 40 current takes 60 alone: 40 + 60
    no_prefetch = Zero3FetchRule(gather_copies=2, prefetch_bucket_params=0, max_live_params=150)
    assert trace_peaks(trace, 2, no_prefetch) == [100, 60]


def test_recompute_forward_precedes_each_checkpointed_backward() -> None:
    """A checkpointed block runs its modules forward again before its backward."""
    assert [u for _, _, u in fetch_trace([[1], [2, 3]], [False, True])] == [1, 2, 3, 2, 3, 3, 2, 1]


def test_tied_head_gathers_the_embedding_again() -> None:
    """Embedding [100], a block [40], a tied head [5] (its norm): the head gathers the embedding's
    weight first, identity (0, 0), charged to the head. No prefetch, each gather one parameter
    (once): the head's peak is 100 (5 untied); forward 100, 40, 100, 5, backward 5, 100, 40, 100."""
    rule = Zero3FetchRule(gather_copies=2, prefetch_bucket_params=0)
    trace = fetch_trace([[100], [40], [5]], [False, False, False], tied_head=True)
    assert [(layer, u) for layer, _, u in trace] == [(0, 100), (1, 40), (2, 100), (2, 5), (2, 5), (2, 100),
                                                     (1, 40), (0, 100)]
    assert trace_peaks(trace, 3, rule) == [100, 40, 100]
    assert trace_peaks(fetch_trace([[100], [40], [5]], [False] * 3), 3, rule) == [100, 40, 5]
    # with a bucket of 50, the head's norm (forward) current: the backward's norm is the same
    # parameter (skipped), then the tied weight is taken whole, 100 (the one-unit overshoot)
    bucket = Zero3FetchRule(gather_copies=1, prefetch_bucket_params=50, max_live_params=1e9)
    assert prefetch_params(trace[3], trace[4:], bucket) == 100


def test_retention_at_the_turn_follows_the_reuse_distance() -> None:
    """Blocks of 10 (largest unit 6), head 3, distance 30: the last block is kept (6 + 10 - 6 =
    10 < 30); the one before is not (6 + 20 + 10 - 6 = 30, not under 30)."""
    rule = Zero3FetchRule(reuse_distance_params=30)
    assert retained_params([10, 10, 10], 6, 3, rule) == 10
    assert retained_params([10, 10, 10], 6, 3, Zero3FetchRule(reuse_distance_params=0)) == 0


@pytest.mark.parametrize(("tiles", "window_bytes"), [(1, 8_388_608), (2, 4_194_304)])
def test_window_is_the_largest_linear_and_tiles_halve_it(tiles: int, window_bytes: int) -> None:
    """No prefetch (prefetch_depth 0: a zero bucket), no reuse distance, one GPU (one copy in
    flight): the window is the largest unit, one FFN matrix, 4,194,304 x 2 B = 8,388,608 B; with 2
    tiles per Linear 2,097,152 x 2 B = 4,194,304 B. The whole-layer rule held one block,
    12,584,960 x 2 B = 25,169,920 B. The engine's parameter peak is the same figure."""
    cfg = _tiny_small_vocab_config(tiles)
    assert footprint(cfg).breakdown["gpu"][WINDOW] == window_bytes
    executor = make_executor(cfg, state_sizes(cfg), None, None, None)
    executor.run(True)
    peaks = {str(owner): p["gpu"] for owner, p in executor.memory.owner_peak_bytes.items()}
    assert peaks["param_fetch"] == window_bytes


def test_whole_layer_rule_without_the_submodule_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the submodule rule off, the same configuration holds one whole block: 25,169,920 B."""
    monkeypatch.setattr(part_fetch, "on_zero3_submodule_fetch", lambda c: False)
    assert footprint(_tiny_small_vocab_config(1)).breakdown["gpu"][WINDOW] == 12_584_960 * 2


def test_timeline_stays_per_layer(monkeypatch: pytest.MonkeyPatch) -> None:
    """The rule changes memory only: Llama-2 7B with zero-infinity-cpu (prefetch one layer ahead,
    reuse distance 1e9) takes the same iteration time with and without it, and declares a smaller
    window with it."""
    cfg = make_run_config("rtx4090-pcie4-ws", "llama2-7b", "zero-infinity-cpu")
    on, on_window = simulate(cfg).metrics, footprint(cfg).breakdown["gpu"][WINDOW]
    monkeypatch.setattr(part_fetch, "on_zero3_submodule_fetch", lambda c: False)
    off, off_window = simulate(cfg).metrics, footprint(cfg).breakdown["gpu"][WINDOW]
    assert on.iteration_time_s == pytest.approx(off.iteration_time_s, rel=1e-12)
    assert on_window < off_window


def test_one_trillion_model_window_by_hand() -> None:
    """zi-1t-fits-one-dgx2 (hidden 25,600, FFN 102,400, 16 ranks: a gather of several
    parameters twice in flight, of one once; bucket 5e7, live cap 1e9, distance 1e9). Units of a
    block: Wq, Wk, Wv, Wo (655,360,000 each), FC1, FC2 (2,621,440,000), norms and biases.
    Wo current: budget min(1e9 - 655,360,000, 5e7) = 5e7, FC1 alone is taken whole (one
    parameter, once): 655,360,000 + 2,621,440,000 = 3,276,800,000 (was twice: 5,898,240,000).
    The largest: block 0's Wq current at the end of the backward takes the learned positions
    (26,214,400 < 5e7) and the embedding (1,287,782,400), two parameters in one coalesced
    gather, twice: 655,360,000 + 2 x 1,313,996,800 = 3,283,353,600. Nothing retained at the
    turn: the tied head gathers the embedding, 2 x 1,287,782,400 > 1e9. Window: 3,283,353,600 x
    2 B = 6,566,707,200 B (6.12 GiB; 10.99 GiB when every gather counted twice, and the
    whole-layer rule held three layers, 43.95 GiB)."""
    case = next(c for c in load_cases(default_cases_path()) if c.id == "zi-1t-fits-one-dgx2")
    cfg = case_config(case)
    assert footprint(cfg).breakdown["gpu"][WINDOW] == (655_360_000 + 2 * (26_214_400 + 1_287_782_400)) * 2
    assert footprint(cfg).breakdown["gpu"][WINDOW] == 6_566_707_200


def test_prefetch_bucket_is_a_strategy_input() -> None:
    """The 1024-vocab tiny, prefetch one layer ahead, bucket 1e6 elements, no reuse distance, one
    rank. FC1 (4,194,304) current: budget min(1e9 - 4,194,304, 1e6) = 1e6, the next unit FC2 is
    taken whole: 8,388,608 elements (FC2 current in forward takes the norms, 2048, and the next
    block's Wq, 1,048,576: 5,244,928; in backward it takes FC1: 8,388,608). Window 8,388,608 x 2 B
    = 16,777,216 B. With DeepSpeed's default 5e7 the bucket covers the whole tiny model and the
    whole-layer rule is the smaller: two blocks, 2 x 25,169,920 = 50,339,840 B."""
    cfg = _tiny_small_vocab_config(1, prefetch_depth=1)
    small = cfg.model_copy(update={"strategy": cfg.strategy.model_copy(update={"zero3_prefetch_bucket_params": 1e6})})
    assert footprint(small).breakdown["gpu"][WINDOW] == 16_777_216
    assert footprint(cfg).breakdown["gpu"][WINDOW] == 50_339_840


def test_ds_config_sets_the_bucket_and_the_live_cap() -> None:
    """stage3_prefetch_bucket_size and stage3_max_live_parameters reach the strategy, and are
    written back when a strategy is exported."""
    ds = {"zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"},
                                "offload_optimizer": {"device": "cpu"},
                                "stage3_prefetch_bucket_size": 1e6, "stage3_max_live_parameters": 3e8}}
    st = reading_from_ds_config(ds, "z3.json").strategy
    assert (st.zero3_prefetch_bucket_params, st.zero3_max_live_params) == (1e6, 3e8)
    zero = ds_config_from_strategy(st)["zero_optimization"]
    assert (zero["stage3_prefetch_bucket_size"], zero["stage3_max_live_parameters"]) == (1_000_000, 300_000_000)
