"""DeepSpeed ZeRO-3 offload's host gradient items by release (strategy.z3_host_grads,
offsim.plan.deepspeed_versions.Z3HostGrads) and the IPG bucket buffer kept from start-up
(z3_grad_flush same_flush), each in the footprint and in the timeline.

Counted by hand on tiny (one rank, so a rank's gradient partitions are every parameter):
8,388,608 (embedding) + 4 x 12,584,960 (blocks) + 8,389,632 (head and its norm) = 67,118,080
elements; 16-bit: 134,236,160 B. reduce_bucket_params 2e7: an IPG buffer of 2e7 x 2 B =
40,000,000 B. Pageable host memory (pin_memory false) so no pinned rounding enters the counts.
"""

from __future__ import annotations

from offsim import simulate
from offsim.config.loading import load_strategy
from offsim.config.run import RunConfig, make_run_config
from offsim.config.strategy import Strategy
from offsim.fit_check import footprint
from offsim.mechanisms.grads import Grads
from offsim.plan import footprint as fp
from offsim.systems._registry import compose

ELEMENTS = 67_118_080
FLAT_BYTES = 2 * ELEMENTS  # 134,236,160
IPG_BYTES = 40_000_000
ON_GPU = {"params": "gpu", "grads": "cpu", "optimizer_states": "cpu", "activations": "gpu"}


def _cfg(gas: int = 1, fp16: bool = False, **update: object) -> RunConfig:
    update.setdefault("placement", ON_GPU)
    update.setdefault("reduce_bucket_params", 2e7)
    update.setdefault("pin_memory", False)
    st = Strategy.model_validate({**load_strategy("zero-infinity-cpu").model_dump(), **update})
    cfg = make_run_config("tiny", "tiny", st)
    wl = cfg.workload
    training = wl.training.model_copy(update={"grad_accumulation": gas})
    precision = wl.precision.model_copy(update={"compute": "fp16", "params": "fp16", "grads": "fp16"}) \
        if fp16 else wl.precision
    return cfg.model_copy(update={"workload": wl.model_copy(update={"training": training, "precision": precision})})


def _grads(cfg: RunConfig) -> Grads:
    g = compose(cfg).mechanisms["grads"]
    assert isinstance(g, Grads)
    return g


def test_partitions_counted_by_hand() -> None:
    cfg = _cfg()
    assert sum(fp.param_partitions(cfg, fp.state_sizes(cfg))) == ELEMENTS


def test_host_gradient_buffer_by_release() -> None:
    """v0.6.0+: grad_partitions_flat_buffer, 134,236,160 B, whatever the accumulation; v0.3.12-
    v0.5.10 (partition_previous_reduced_grads): grads_in_partition only with
    gradient_accumulation_steps > 1 (torch.half: 134,236,160 B), none at one micro-batch."""
    for mode in ("flat_gpu_check", "flat_host_check"):
        for gas in (1, 2):
            cfg = _cfg(gas, z3_host_grads=mode)
            assert fp.host_grad_partition_bytes(cfg, fp.state_sizes(cfg)) == FLAT_BYTES
    legacy1, legacy2 = _cfg(1, z3_host_grads="legacy"), _cfg(2, z3_host_grads="legacy")
    assert fp.host_grad_partition_bytes(legacy1, fp.state_sizes(legacy1)) == 0
    assert fp.host_grad_partition_bytes(legacy2, fp.state_sizes(legacy2)) == FLAT_BYTES
    steps = fp.deepspeed_host_init(legacy1, fp.state_sizes(legacy1))
    assert not any("gradient partitions" in s.what or "grads_in_partition" in s.what for s in steps)
    steps = fp.deepspeed_host_init(legacy2, fp.state_sizes(legacy2))
    assert [s.nbytes for s in steps if "grads_in_partition" in s.what] == [FLAT_BYTES]


def test_overflow_check_host_temporaries_only_from_v0_9_4() -> None:
    """fp16: has_overflow's isinf / isnan over the host buffer (v0.9.4+, #3622) hold a 16-bit copy
    and a 1-byte mask: 67,118,080 x 3 = 201,354,240 B; v0.6.0-v0.9.3 (per GPU partition) and
    v0.3.x (gpu_sum) none; bf16 skips the check in every release."""
    expect = {"flat_host_check": 3 * ELEMENTS, "flat_gpu_check": 0, "legacy": 0}
    for mode, nbytes in expect.items():
        cfg = _cfg(fp16=True, z3_host_grads=mode)
        assert fp.overflow_check_bytes(cfg, fp.state_sizes(cfg)) == nbytes, mode
    cfg = _cfg(z3_host_grads="flat_host_check")
    assert fp.overflow_check_bytes(cfg, fp.state_sizes(cfg)) == 0


def test_no_round_trip_at_one_micro_batch_before_v0_6() -> None:
    """legacy, one micro-batch: a reduced partition goes straight to the fp32 gradient, so the
    buckets have no 16-bit D2H into the host buffer and no H2D back; with accumulation they do
    (async_accumulate_grad_in_cpu_via_gpu), and every v0.6.0+ release does at one micro-batch."""
    for cfg, trip in ((_cfg(1, z3_host_grads="legacy"), False), (_cfg(2, z3_host_grads="legacy"), True),
                      (_cfg(1, z3_host_grads="flat_gpu_check"), True)):
        for b in _grads(cfg).buckets:
            assert (b.flows.d2h is not None) is trip and (b.flows.roundtrip_h2d is not None) is trip
            assert b.flows.boundary_d2h is not None


def test_timeline_drops_the_round_trip_bytes() -> None:
    """The iteration's PCIe traffic, legacy vs v0.6.0+ at one micro-batch: 134,236,160 B fewer
    each way (the 16-bit D2H and the H2D of every partition element)."""
    new = simulate(_cfg(z3_host_grads="flat_gpu_check")).metrics.traffic_bytes
    old = simulate(_cfg(z3_host_grads="legacy")).metrics.traffic_bytes
    assert new.d2h - old.d2h == FLAT_BYTES
    assert new.h2d - old.h2d == FLAT_BYTES


def test_footprint_and_engine_agree_on_host_memory() -> None:
    """Host need per rank: fp32 gradients 67,118,080 x 4 = 268,472,320, fp32 master 268,472,320,
    moments x 8 = 536,944,640 B, and at start-up initialize_optimizer_states' fp32 gradient buffer
    of the one sub-group (268,472,320 B, dropped). v0.6.0+ keeps the 134,236,160 B flat buffer
    after it, so the start-up peak's transient above the steady state is 134,236,160; legacy
    keeps none, transient 268,472,320: 1,342,361,600 B both ways (the buffer is under the
    start-up transient here), as the engine's host peak says."""
    for mode, flat in (("flat_gpu_check", FLAT_BYTES), ("legacy", 0)):
        cfg = _cfg(z3_host_grads=mode)
        host = footprint(cfg).breakdown["host"]
        assert host.get("16-bit gradient partitions (grad_partitions_flat_buffer)", 0) == flat
        assert host["transient peak at start-up (pin_memory() copies, scratch)"] == 2 * FLAT_BYTES - flat
        assert footprint(cfg).need_bytes["host"] == simulate(cfg).metrics.peak_bytes.host == 1_342_361_600


def test_ipg_buffer_is_a_startup_item_with_same_flush() -> None:
    """same_flush (v0.6.0+, _setup_for_real_optimizer): the buffer is a static GPU item of
    40,000,000 B and Grads declares none; next_flush (v0.3.12-v0.5.10): Grads holds its buffer
    (one without overlap_comm: 2e7 x 2 B torch.half = 40,000,000 B) through each backward."""
    cfg = _cfg()
    static = compose(cfg).mechanisms["static"]
    assert [i.nbytes for i in static.items if i.what.startswith("IPG")] == [IPG_BYTES]  # type: ignore[attr-defined]
    assert _grads(cfg).ipg_bytes == 0
    old = _cfg(z3_grad_flush="next_flush", overlap_grad_offload=False)
    assert _grads(old).ipg_bytes == IPG_BYTES
    assert not any(i.what.startswith("IPG") for i in compose(old).mechanisms["static"].items)  # type: ignore[attr-defined]


def _gpu_at_mid_forward(cfg: RunConfig) -> float:
    result = simulate(cfg)
    spans = result.spans()
    last = spans[spans.iteration == spans.iteration.max()]
    fwd = last[last.kind == "forward"].iloc[0]
    gpu = result.levels()
    gpu = gpu[gpu.tier == "gpu"]
    return float(gpu[gpu.t_s <= (fwd.start_s + fwd.end_s) / 2].bytes.iloc[-1])


def test_forward_holds_the_startup_buffer() -> None:
    """In the last iteration's first forward layer no gradient buffer is alive in either mode
    (flushes waited, all freed at the epilogue), so same_flush's level is higher by exactly the
    kept IPG buffer, 40,000,000 B; before, the schedule held it only through backward."""
    same = _gpu_at_mid_forward(_cfg(overlap_grad_offload=False))
    nxt = _gpu_at_mid_forward(_cfg(z3_grad_flush="next_flush", overlap_grad_offload=False))
    assert same - nxt == IPG_BYTES


def test_engine_peak_within_the_footprint() -> None:
    """The footprint stays an upper bound of the schedule's GPU and host peaks in each mode."""
    for update in ({}, {"z3_host_grads": "legacy"}, {"z3_grad_flush": "next_flush"}):
        for gas in (1, 2):
            cfg = _cfg(gas, **update)  # type: ignore[arg-type]
            peak, need = simulate(cfg).metrics.peak_bytes, footprint(cfg).need_bytes
            assert peak.gpu <= need["gpu"] and peak.host <= need["host"], (update, gas)


def test_overflow_scan_time_only_from_v0_9_4() -> None:
    """The step's host isinf/isnan pass over the flat host buffer (stage3.py ``has_overflow`` over
    ``grad_partitions_flat_buffer``, #3622) exists only in flat_host_check; before, the check
    sums on the GPU, so no host pass is charged (``_part_optimizer.overflow_scan``)."""
    from offsim.systems._ctx import build_ctx
    from offsim.systems._part_optimizer import overflow_scan
    for mode, charged in (("legacy", False), ("flat_gpu_check", False), ("flat_host_check", True)):
        cfg = _cfg(fp16=True, z3_host_grads=mode)
        assert (overflow_scan(build_ctx(cfg)) is not None) is charged, mode
