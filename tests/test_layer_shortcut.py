"""The layer-periodic shortcut (:mod:`offsim.engine.layers`, issue 16): runs with it on and off
record the same spans, levels, cache events, phases, peaks and events, bit for bit.

A hand-built block of 8 layers, each ``Alloc`` activation (100 B, kept), ``Alloc`` workspace
(1,000 B), a 0.25 s kernel writing the activation, ``Free`` workspace, all on the stream that
records stalls: by hand, the run ends at 8 x 0.25 = 2.0 s, the GPU peaks at 8 x 100 + 1,000 =
1,800 B (the last layer's workspace over the 8 activations), each layer's kernel spans
[0.25 k, 0.25 (k + 1)], and the GPU level changes 3 times a layer (24 samples, the first change
reporting all 5 tiers: 28). The shortcut compares the boundaries of runs 1 and 2 and skips
8 - 2 (kept) - 2 = 4 runs.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs

from offsim import load_profile, load_strategy, make_run_config
from offsim.api import resolve
from offsim.cache_stats import cache_stats
from offsim.config.run import RunConfig
from offsim.core.enums import Activity, MechanismId, Phase, StreamKind, TensorKind, Tier
from offsim.engine import layers
from offsim.engine.execute import Executor, Machine
from offsim.errors import InfeasibleError
from offsim.fit_check import check_fit
from offsim.metrics import steady_iterations
from offsim.plan.footprint import state_sizes
from offsim.schedule.ops import Alloc, Block, Delay, Free, Op, Repeat, Schedule, StreamSpec, Tag, TensorRef
from offsim.simulation import make_executor
from offsim.trace import Recorder
from tests.conftest import small_tiny_workloads
from tests.test_steady_state import STRATEGIES

LAYERS = 8
KERNEL_S = 0.25
ACT_BYTES, WS_BYTES = 100, 1_000


def _layer_ops(layer: int, first: int, stream: str) -> list[Op]:
    tag = Tag(Activity.FORWARD, MechanismId.COMPUTE, Phase.FORWARD, layer=layer)
    act, ws = TensorRef(TensorKind.ACTIVATION, layer), TensorRef(TensorKind.WORKSPACE, layer)
    return [Op(first, Alloc(Tier.GPU, ACT_BYTES, act), tag, stream="gpu"),
            Op(first + 1, Alloc(Tier.GPU, WS_BYTES, ws), tag, stream="gpu"),
            Op(first + 2, Delay(KERNEL_S), tag, stream=stream, writes=(act,)),
            Op(first + 3, Free(Tier.GPU, ws), tag, stream="gpu")]


def _schedule(kernel_stream: str = "gpu") -> Schedule:
    ops: list[Op] = []
    for layer in range(LAYERS):
        ops += _layer_ops(layer, len(ops), kernel_stream)
    return Schedule((Repeat("iteration", 1, (Block("forward", tuple(ops)),)),),
                    streams=(StreamSpec("gpu", StreamKind.GPU_COMPUTE, records_stalls=True),
                             StreamSpec("side", StreamKind.GPU_COMPUTE)),
                    unit_names=tuple(f"L{k}" for k in range(LAYERS)))


def _hand_run(schedule: Schedule, shortcut: bool, gpu_bytes: float = 1e9) -> tuple[Recorder, Executor]:
    memory = {"gpu": gpu_bytes, "host_pinned": 1e9, "host": 1e9, "nvme": 1e9, "pfs": 1e9}
    ex = Executor(schedule, Machine({}, 1.0, 1, memory), {}, Recorder())
    ex.run(layer_shortcut=shortcut)
    return ex.rec, ex


def _records(rec: Recorder) -> tuple[Any, ...]:
    return (list(rec.spans), list(rec.levels), list(rec.cache_events), rec.phases, rec.iteration_starts_s, rec.end_s)


def test_a_hand_built_stretch_skips_four_layers_and_records_the_full_run() -> None:
    full, ex_full = _hand_run(_schedule(), False)
    short, ex = _hand_run(_schedule(), True)
    assert ex_full.layer_runs_skipped == 0
    assert ex.layer_runs_skipped == LAYERS - layers.KEPT_RUNS - 2
    assert _records(short) == _records(full)  # bit for bit
    assert ex.events == ex_full.events
    assert ex.memory.peak_bytes == ex_full.memory.peak_bytes
    assert ex.memory.owner_peak_bytes == ex_full.memory.owner_peak_bytes
    # the hand computation
    assert short.end_s == LAYERS * KERNEL_S
    assert ex.memory.peak_bytes["gpu"] == LAYERS * ACT_BYTES + WS_BYTES
    kernels = [(s.name, s.layer, s.start_s, s.end_s) for s in short.spans]
    assert kernels == [(f"L{k} forward", k, KERNEL_S * k, KERNEL_S * (k + 1)) for k in range(LAYERS)]
    assert len(short.levels) == 3 * LAYERS + 4
    assert [lv.bytes for lv in short.levels if lv.tier == "gpu"][-3:] == [
        LAYERS * ACT_BYTES, LAYERS * ACT_BYTES + WS_BYTES, LAYERS * ACT_BYTES]


def test_a_kernel_on_another_stream_is_no_stretch() -> None:
    """The stretch's ops must all run on the stream that records stalls: none here, nothing skipped."""
    full, _ = _hand_run(_schedule("side"), False)
    short, ex = _hand_run(_schedule("side"), True)
    assert ex.layer_runs_skipped == 0
    assert _records(short) == _records(full)


def test_a_skipped_layer_that_would_overflow_is_simulated() -> None:
    """GPU capacity 1,500 B: layer 5's workspace takes the level to 6 x 100 + 1,000 = 1,600 B.
    The full run raises there; the shortcut applies the skipped runs' allocations to the ledger
    in order, so it raises the same error (same op, time and level)."""
    with pytest.raises(InfeasibleError) as full:
        _hand_run(_schedule(), False, gpu_bytes=1_500)
    with pytest.raises(InfeasibleError) as short:
        _hand_run(_schedule(), True, gpu_bytes=1_500)
    assert str(short.value) == str(full.value)
    assert "t=1.2500" in str(full.value)  # layer 5 starts at 5 x 0.25 s


def _run(cfg: RunConfig, shortcut: bool) -> tuple[Any, ...] | None:
    """Records, peaks, owner peaks, events, cache statistics and skipped runs (None: infeasible)."""
    try:
        cfg = resolve(cfg)
        sz = state_sizes(cfg)
        check_fit(cfg, sz)
        ex = make_executor(cfg, sz)
        events = ex.run(layer_shortcut=shortcut)
    except InfeasibleError as exc:
        return (str(exc),)
    rec = ex.rec
    stats = {k: v.model_dump() for k, v in cache_stats(rec, steady_iterations(cfg, rec)[0]).items()}
    return (_records(rec), dict(ex.memory.peak_bytes), ex.memory.owner_peak_bytes, events, stats,
            ex.layer_runs_skipped)


def test_zero_offload_skips_forward_layers() -> None:
    """ZeRO-Offload's forward (activation, workspace, kernel, free on the compute stream) is a
    stretch: a 12-layer model skips 12 - 2 - 2 = 8 layers a micro-batch."""
    wl = _tiny_with_layers(12)
    on = _run(RunConfig(hardware=load_profile("tiny"), workload=wl, strategy=load_strategy("zero-offload"),
                        iterations=2), True)
    off = _run(RunConfig(hardware=load_profile("tiny"), workload=wl, strategy=load_strategy("zero-offload"),
                         iterations=2), False)
    assert on is not None and off is not None
    assert on[-1] > 0 and on[-1] % 8 == 0
    assert on[:-1] == off[:-1]


def _tiny_with_layers(n: int) -> Any:
    wl = make_run_config("tiny", "tiny", "zero-offload").workload
    return wl.model_copy(update={"model": wl.model.model_copy(update={"layers": n})})


@hs.composite
def configs(draw: Any) -> RunConfig:
    """A random small model (its layers raised to 5-16, so that stretches form), accumulation
    steps and iterations, on tiny, with a shipped strategy."""
    wl = draw(small_tiny_workloads(3))
    wl = wl.model_copy(update={"model": wl.model.model_copy(update={"layers": draw(hs.integers(5, 16))})})
    strategy = load_strategy(draw(hs.sampled_from(STRATEGIES)))
    return RunConfig(hardware=load_profile("tiny"), workload=wl, strategy=strategy,
                     iterations=draw(hs.integers(2, 5)), warmup_iterations=draw(hs.integers(0, 1)))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(configs())
def test_random_models_shortcut_on_equals_off(cfg: RunConfig) -> None:
    """Over drawn models, iterations and accumulation steps: every record, peak, owner peak,
    cache count and the events equal with the shortcut on and off (bit for bit, so within the
    acceptance's 1e-9)."""
    on, off = _run(cfg, True), _run(cfg, False)
    assert on is not None and off is not None
    assert on[:-1] == off[:-1]
