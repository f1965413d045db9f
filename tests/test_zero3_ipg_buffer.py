"""DeepSpeed ZeRO-3's gradient GPU live set: the IPG bucket buffer(s) and the full gradients of
the reduce buckets in flight (stage3.py; offsim.plan.deepspeed_versions.Z3GradFlush).

Counted by hand on tiny (one rank, bf16: 2 B per gradient element) at reduce_bucket_params 2e7.
tiny's layers: 0 the embedding (8,388,608), 1-4 blocks of 12,584,960 (q, k, v, o 1,048,576 each,
fc1 and fc2 4,194,304 each, two norms of 1,024), 5 the head (8,388,608 + its norm 1,024). In
backward the buckets are (offsim.systems._part_grads.grad_buckets):
  b0: head 8,389,632 + block 4's 11,534,336          = 19,923,968 elements = 39,847,936 B
  b1: block 4's 1,050,624 + block 3 + block 2's 4,194,304 = 17,829,888    = 35,659,776 B
  b2: block 2's 8,390,656 + block 1's 11,534,336     = 19,924,992          = 39,849,984 B
  b3: block 1's 1,050,624 + the embedding 8,388,608   =  9,439,232          = 18,878,464 B
Each bucket's first gradient (its head, produced before the previous flush, whose hook it
triggers): b1 a 1,048,576 tensor (2,097,152 B), b2 block 2's fc2 (8,388,608 B), b3 2,097,152 B.
"""

from __future__ import annotations

from offsim import simulate
from offsim.config.loading import load_strategy
from offsim.config.run import RunConfig, make_run_config
from offsim.config.strategy import Strategy
from offsim.fit_check import footprint
from offsim.mechanisms.grads import Grads
from offsim.plan.deepspeed_versions import Z3GradFlush
from offsim.systems._registry import compose

R = 2e7
BUCKETS = (39_847_936, 35_659_776, 39_849_984, 18_878_464)
HEADS = (0, 2_097_152, 8_388_608, 2_097_152)
IPG = "IPG bucket buffer(s)"
HELD = "gradient buffers before offload"
ON_GPU = {"params": "gpu", "grads": "cpu", "optimizer_states": "cpu", "activations": "gpu"}


def _cfg(hardware: str = "tiny", dp: int = 1, **update: object) -> RunConfig:
    update.setdefault("placement", ON_GPU)
    update.setdefault("reduce_bucket_params", R)
    st = Strategy.model_validate({**load_strategy("zero-infinity-cpu").model_dump(), **update})
    cfg = make_run_config(hardware, "tiny", st)
    training = cfg.workload.training.model_copy(update={"data_parallel": dp})
    return cfg.model_copy(update={"workload": cfg.workload.model_copy(update={"training": training})})


def _grads(cfg: RunConfig) -> Grads:
    g = compose(cfg).mechanisms["grads"]
    assert isinstance(g, Grads)
    return g


def _needs(cfg: RunConfig) -> dict[str, float]:
    return {n.what: n.nbytes for n in _grads(cfg).footprint()}


def test_buckets_and_heads_as_counted_by_hand() -> None:
    g = _grads(_cfg())
    assert tuple(b.flows.buffer_bytes for b in g.buckets) == BUCKETS
    assert tuple(b.head_bytes for b in g.buckets) == HEADS


def test_current_release_keeps_one_buffer_in_the_model_dtype() -> None:
    """v0.6.0+ (_setup_for_real_optimizer): reduce_bucket_size x 2 B = 40,000,000 B, whatever
    overlap_comm says, a start-up static item (kept), not a need of Grads (tests/test_zero3_host_by_release.py)."""
    for cfg in (_cfg(), _cfg(overlap_grad_offload=False)):
        static = compose(cfg).mechanisms["static"]
        assert [i.nbytes for i in static.items if i.what.startswith("IPG")] == [40_000_000]  # type: ignore[attr-defined]
        assert IPG not in _needs(cfg)


def test_older_releases_make_two_half_buffers_with_overlap_comm() -> None:
    """v0.3.12-v0.5.10 (backward): torch.half x reduce_bucket_size, a second with overlap_comm."""
    assert _needs(_cfg(z3_grad_flush="next_flush"))[IPG] == 80_000_000
    assert _needs(_cfg(z3_grad_flush="next_flush", overlap_grad_offload=False))[IPG] == 40_000_000


def test_three_buckets_in_flight_and_the_next_head() -> None:
    """overlap_comm, non_blocking pinned boundary copy: up to 3 reductions in flight. The worst
    window: b0 + b1 + b2 + b3's head = 39,847,936 + 35,659,776 + 39,849,984 + 2,097,152 =
    117,454,848 B (b1 + b2 + b3 = 114,388,224 B)."""
    g = _grads(_cfg())
    assert g.buckets_alive == 3 and g.flush is Z3GradFlush.SAME_FLUSH
    assert _needs(_cfg())[HELD] == 117_454_848


def test_waited_flushes_hold_one_bucket_and_the_next_head() -> None:
    """Without overlap_comm the host waits for every flush: one bucket and the next one's head,
    at most b1 + b2's head = 35,659,776 + 8,388,608 = 44,048,384 B (b0 + 2,097,152 = 41,945,088;
    b2 + 2,097,152 = 41,947,136). The same with a blocking boundary copy at one micro-batch per
    step."""
    assert _grads(_cfg(overlap_grad_offload=False)).buckets_alive == 1
    assert _needs(_cfg(overlap_grad_offload=False))[HELD] == 44_048_384
    blocking = _cfg(z3_fp32_grad_copy="gpu_upcast_blocking")
    assert _grads(blocking).buckets_alive == 1
    assert _needs(blocking)[HELD] == 44_048_384


def test_in_place_all_reduce_holds_no_bucket_when_flushes_are_waited() -> None:
    """reduce_scatter false: each bucket (all within 2e7 elements) is all-reduced in place in the
    IPG buffer, no concatenation; with every flush waited the reduction stream is idle when
    gradients arrive, so none waits for its copy: nothing held besides the buffer. Not waited,
    the copies queue behind earlier reductions: the whole window again."""
    assert _needs(_cfg(overlap_grad_offload=False, reduce_scatter=False))[HELD] == 0
    assert _needs(_cfg(reduce_scatter=False))[HELD] == 117_454_848


def test_in_place_all_reduce_moves_twice_a_reduce_scatter() -> None:
    """Two ranks: a reduce-scatter of b0 moves (dp - 1) / dp x 39,847,936 = 19,923,968 B per
    rank; the in-place all-reduce twice that, 39,847,936 B."""
    rs = _grads(_cfg("dgx2-v100", dp=2)).buckets[0].flows.reduce
    ar = _grads(_cfg("dgx2-v100", dp=2, reduce_scatter=False)).buckets[0].flows.reduce
    assert rs is not None and ar is not None
    assert (rs.nbytes, ar.nbytes) == (19_923_968, 39_847_936)


def test_older_releases_hold_only_gradients_larger_than_the_bucket() -> None:
    """next_flush at reduce_bucket_params 5e6: only the head's and the embedding's 8,388,608-element
    weights exceed the bucket (extra_large_param_to_reduce); each is a bucket of its own, held
    (16,777,216 B) until the next flush partitions it. The embedding's bucket is the last, its
    weight produced before the flush before it (its head). Two buckets at once and the next
    head: at most 16,777,216 B, for the head's weight with the small buckets after it and for
    the embedding's. IPG: 2 x 5e6 x 2 B."""
    cfg = _cfg(z3_grad_flush="next_flush", reduce_bucket_params=5e6)
    g = _grads(cfg)
    assert g.buckets_alive == 2
    held = [b.flows.buffer_bytes for b in g.buckets]
    assert held[0] == held[-1] == 16_777_216 and sum(held) == 2 * 16_777_216
    assert g.buckets[-1].head_bytes == 16_777_216
    assert _needs(cfg)[HELD] == 16_777_216
    assert _needs(cfg)[IPG] == 20_000_000


def _gpu_rises(cfg: RunConfig) -> list[float]:
    """The GPU level's rises in the last iteration, in order."""
    result = simulate(cfg)
    assert result.metrics.feasible, result.metrics.infeasible_reason
    lv = result.levels()
    spans = result.spans()
    start = spans[spans.iteration == spans.iteration.max()].start_s.min()
    gpu = lv[lv.tier == "gpu"].reset_index(drop=True)
    rises = gpu.bytes.diff()
    return [float(d) for t, d in zip(gpu.t_s, rises, strict=True) if t >= start - 1e-12 and d > 0]


def test_timeline_allocates_the_buffer_and_each_flush_as_counted() -> None:
    """Timeline, flushes waited (no overlap_comm): at b0's flush b0 and b1's head (39,847,936 +
    2,097,152); at b1's flush the rest of b1 (35,659,776 - 2,097,152 = 33,562,624) and b2's head
    (8,388,608). The IPG buffer (40,000,000 B) is allocated at start-up, not in the iteration
    (tests/test_zero3_host_by_release.py)."""
    rises = _gpu_rises(_cfg(overlap_grad_offload=False))
    for b in (39_847_936, 2_097_152, 33_562_624, 8_388_608):
        assert b in rises


def test_engine_peak_within_the_fit_checks_footprint() -> None:
    """The footprint is an upper bound of what the schedule holds, in each mode."""
    for update in ({}, {"overlap_grad_offload": False}, {"reduce_scatter": False},
                   {"z3_grad_flush": "next_flush", "reduce_bucket_params": 5e6}):
        cfg = _cfg(**update)  # type: ignore[arg-type]
        result = simulate(cfg)
        assert result.metrics.peak_bytes.gpu <= footprint(cfg).need_bytes["gpu"], update


def test_next_flush_frees_a_bucket_at_the_next_flush() -> None:
    """next_flush at reduce_bucket_params 5e6, flushes waited: the head's weight (bucket 0,
    16,777,216 B, flushed after the head's backward) stays allocated until bucket 1's flush after
    block 3's backward (partition_previous_reduced_grads), so the GPU holds it while block 3's
    backward runs; same_flush frees it when its own copies end, before block 3's backward, and
    holds there only bucket 1's head instead (the final norm's gradient, 1,024 x 2 = 2,048 B).
    The IPG buffer is 10,000,000 B in both. Difference at mid-backward of block 3:
    16,777,216 - 2,048 = 16,775,168 B."""
    def held_in_block3_backward(flush: str) -> float:
        cfg = _cfg(z3_grad_flush=flush, reduce_bucket_params=5e6, overlap_grad_offload=False)
        result = simulate(cfg)
        spans = result.spans()
        last = spans[spans.iteration == spans.iteration.max()]
        bwd = last[(last.kind == "backward") & (last.layer == 4)].iloc[0]
        gpu = result.levels()
        gpu = gpu[gpu.tier == "gpu"]
        return float(gpu[gpu.t_s <= (bwd.start_s + bwd.end_s) / 2].bytes.iloc[-1])
    diff = held_in_block3_backward("next_flush") - held_in_block3_backward("same_flush")
    assert diff == 16_775_168
