"""The time bound read off a compiled schedule (:mod:`offsim.schedule.bound`, architecture.md §9).

Three kinds: a hand-computed bound on a hand-built schedule (also executed, so the engine is seen
at or above it), the least work of caches from their specs alone, and a Hypothesis invariant:
the bound never exceeds the simulated steady iteration time of any shipped strategy on random
small models.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs

from offsim import load_profile, load_strategy, simulate
from offsim.config.loading import shipped_files
from offsim.config.run import RunConfig
from offsim.core.enums import Activity, CacheId, Link, MechanismId, Phase, Res, StreamKind, TensorKind, Tier
from offsim.engine.execute import Executor, Machine
from offsim.engine.hooks import CachePolicy
from offsim.errors import OffsimError
from offsim.plan.time_bound import time_lower_bound
from offsim.policies.lru import Lru
from offsim.schedule.bound import COPY_ENGINES, GPU_CHAIN, GPU_COMPUTE, RES_NAMES, schedule_bound
from offsim.schedule.ops import (
    Access,
    Alloc,
    Block,
    CacheSpec,
    Delay,
    Done,
    Flow,
    Flush,
    Free,
    Join,
    Op,
    Ready,
    Repeat,
    Schedule,
    StreamSpec,
    Tag,
    TensorRef,
)
from offsim.trace import Recorder
from tests.conftest import small_tiny_workloads

TAG = Tag(Activity.FORWARD, MechanismId.COMPUTE, Phase.FORWARD)
FETCH = Tag(Activity.PARAM_FETCH, MechanismId.PARAM_FETCH, Phase.FORWARD)
STREAMS = (StreamSpec("gpu", StreamKind.GPU_COMPUTE, records_stalls=True), StreamSpec("h2d_q", StreamKind.COPY,
           in_order=False), StreamSpec("cpu_step", StreamKind.CPU))
#: bytes/s of H2D, DRAM; CPU Adam params/s (coefficients below are per byte)
CAPACITY = {"h2d": 4.0, "dram": 100.0, "cpu": 1.5}


def _h2d(nbytes: int, cap_bytes_per_s: float = 2.0) -> Flow:
    return Flow(nbytes, ((Res.H2D, 1.0), (Res.DRAM, 1.0)), cap_bytes_per_s, (Link.H2D,), copy_engine=True)


def _hand_schedule(iterations: int = 3, gpu_waits: bool = False) -> Schedule:
    """Per iteration: 3 micro-batches of a 1 s kernel and an 8-byte copy (H2D capped at 2 B/s,
    a copy engine), then a step: 30 DRAM bytes of CPU Adam (0.5 of a parameter per byte on
    ``cpu``, 2 DRAM bytes per byte) on the CPU thread; with ``gpu_waits`` the GPU stream waits
    for the step (DeepSpeed's step without the delayed parameter update)."""
    mb = Block("mb", (Op(0, Delay(1.0), TAG, "gpu"), Op(1, _h2d(8), FETCH, "h2d_q")))
    adam = Flow(30, ((Res.CPU, 0.5), (Res.DRAM, 2.0)), 1e30, (Link.CPU,))
    wait = (Op(1, Join(), TAG, "gpu", after=(0,)),) if gpu_waits else ()
    step = Block("step", (Op(0, adam, TAG, "cpu_step"), *wait))
    period = (Repeat("micro_batch", 3, (mb,)), step)
    return Schedule((Block("init", ()), Repeat("iteration", iterations, period)), STREAMS)


def test_hand_computed_bound() -> None:
    """GPU compute: 3 x 1 s. PCIe H2D: 3 x 8 B / 4 B/s = 6 s. Each copy alone runs at its cap
    (2 B/s < 4 and 100): 4 s, so the copy queue is busy 12 s and the two copy engines 6 s.
    Host DRAM: (3 x 8 + 30 x 2) B / 100 B/s = 0.84 s. CPU optimizer: 30 x 0.5 / 1.5 = 10 s,
    and the CPU thread as long (its rate is min(1.5 / 0.5, 100 / 2) = 3 B/s). The copy queue binds."""
    b = schedule_bound(_hand_schedule(), CAPACITY, copy_engines=2)
    assert b.terms_s == pytest.approx({GPU_COMPUTE: 3.0, RES_NAMES[Res.H2D]: 6.0, "copy queue 'h2d_q'": 12.0,
                                       COPY_ENGINES: 6.0, RES_NAMES[Res.DRAM]: 0.84, RES_NAMES[Res.CPU]: 10.0,
                                       "CPU thread 'cpu_step'": 10.0}, rel=1e-12)
    assert (b.binding, b.seconds) == ("copy queue 'h2d_q'", pytest.approx(12.0))


def test_the_engine_runs_the_hand_schedule_no_faster_than_the_bound() -> None:
    """Executed, the same schedule's iterations after the first last at least the bound on
    average. Nothing waits for the copies, so the GPU stream starts an iteration every 3 s while
    the copy queue, busy from the start, drains all 12 copies at 48 s: the last iteration ends
    then, and the three after the first average (48 - 3 + 1) / 3 = 15.33 s (the step's 10 s
    lies beside the copies)."""
    rec = Recorder()
    Executor(_hand_schedule(4), Machine(dict(CAPACITY), 1.0, 2, {}), {}, rec).run(steady_shortcut=False)
    starts = [*rec.iteration_starts_s, rec.end_s]
    mean_s = (starts[-1] - starts[1]) / (len(starts) - 2)
    bound_s = schedule_bound(_hand_schedule(4), CAPACITY, copy_engines=2, iterations=[1, 2, 3]).seconds
    assert bound_s <= mean_s * (1 + 1e-12)
    assert mean_s == pytest.approx(46.0 / 3, rel=1e-9)


def test_the_gpu_chain_counts_what_the_stream_waits_for() -> None:
    """The GPU stream waits for the step each iteration: its chain is 3 x 1 s of kernels, then the
    step's 10 s (nothing of the step can start before the GPU stream's earlier ops end: the
    stream is the program counter), 13 s, above the copy queue's 12 s. Executed, iterations 1-3
    start 13 s apart and the last ends at 52 s (its step), its copies at 51 s: 13 s each."""
    b = schedule_bound(_hand_schedule(gpu_waits=True), CAPACITY, copy_engines=2)
    assert (b.binding, b.seconds) == (GPU_CHAIN, pytest.approx(13.0))
    assert b.terms_s[GPU_COMPUTE] == pytest.approx(3.0)
    rec = Recorder()
    Executor(_hand_schedule(4, gpu_waits=True), Machine(dict(CAPACITY), 1.0, 2, {}), {}, rec).run(
        steady_shortcut=False)
    starts = [*rec.iteration_starts_s, rec.end_s]
    assert (starts[-1] - starts[1]) / 3 == pytest.approx(13.0, rel=1e-9)


# ---------------------------------------------------------------- caches
def _fetch(unit: int, nbytes: int) -> Block:
    t = TensorRef(TensorKind.PARAM16, unit)
    return Block(f"fetch {unit}", (Op(0, Alloc(Tier.GPU, nbytes, t), FETCH), Op(1, _h2d(nbytes, 1e30), FETCH,
                                                                                  "h2d_q", after=(0,))))


def _evict(unit: int, nbytes: int) -> Block:
    d2h = Flow(nbytes, ((Res.D2H, 1.0),), 1e30, (Link.D2H,))
    return Block(f"evict {unit}", (Op(0, d2h, FETCH), Op(1, Free(Tier.GPU, TensorRef(TensorKind.PARAM16, unit)),
                                                         FETCH, after=(0,))))


def _cache_schedule(spec: CacheSpec, flush: bool, micro_batches: int = 2) -> Schedule:
    """Each micro-batch asks for units 0, 1, 0 (3, 5 and 3 bytes); the step flushes or not."""
    ops = tuple(Op(i, body, FETCH, "gpu") for i, body in enumerate(
        [body for u in (0, 1, 0) for body in (Access(spec.id, u), Ready(spec.id, u), Done(spec.id, u))]))
    step = Block("step", (Op(0, Flush(spec.id), FETCH, "gpu"),) if flush else ())
    period = (Repeat("micro_batch", micro_batches, (Block("mb", ops),)), step)
    return Schedule((Repeat("iteration", 2, period),), STREAMS, caches=(spec,))


SIZES = {0: 3, 1: 5}


def _spec(capacity: int | None, persistent: bool, evict: bool = True, writes_back: bool = False) -> CacheSpec:
    return CacheSpec(CacheId.GPU_PARAMS, Tier.GPU, capacity, SIZES, {u: _fetch(u, n) for u, n in SIZES.items()},
                     {u: _evict(u, n) for u, n in SIZES.items()} if evict else {}, persistent, writes_back)


def _h2d_d2h_bytes(schedule: Schedule) -> tuple[float, float]:
    b = schedule_bound(schedule, {"h2d": 1.0, "d2h": 1.0, "dram": 1e9}, 1, iterations=[1])
    return b.terms_s.get(RES_NAMES[Res.H2D], 0.0), b.terms_s.get(RES_NAMES[Res.D2H], 0.0)


def test_a_flushed_cache_fetches_each_unit_once_per_iteration() -> None:
    """Empty at each iteration's start: units 0 and 1 come in once (8 bytes), whatever the
    micro-batches, and leave once at the flush (8 bytes)."""
    assert _h2d_d2h_bytes(_cache_schedule(_spec(None, persistent=False), flush=True)) == (8.0, 8.0)


def test_a_cache_its_users_free_fetches_per_micro_batch() -> None:
    """No evict programs and not persistent (activations brought back): every micro-batch's
    units come in again: 2 x 8 bytes, nothing written back."""
    assert _h2d_d2h_bytes(_cache_schedule(_spec(None, persistent=False, evict=False), flush=False)) == (16.0, 0.0)


@pytest.mark.parametrize(("capacity", "h2d", "d2h"), [(None, 0.0, 0.0), (8, 0.0, 0.0), (5, 3.0, 0.0), (4, 5.0, 5.0),
                                                   (3, 5.0, 5.0), (2, 8.0, 8.0)])
def test_a_persistent_cache_misses_at_least_what_it_cannot_hold(capacity: int | None, h2d: float, d2h: float) -> None:
    """Holding C bytes at an iteration's start, it fetches at least 8 - C bytes of its cacheable
    units (1 H2D byte per byte) and evicts at least 8 - 2C (1 D2H byte per byte). A unit larger
    than C bypasses it: in, and out since it writes back, every iteration (C = 4 and 3: unit 1's
    5 bytes, unit 0 then fits; C = 2: both)."""
    spec = _spec(capacity, persistent=True, writes_back=True)
    # the cache's budget counts with the engine's slack (1e-9 relative and in bytes)
    assert _h2d_d2h_bytes(_cache_schedule(spec, flush=False)) == pytest.approx((h2d, d2h), abs=1e-8)


def test_the_persistent_cache_bound_holds_on_the_engine() -> None:
    """A 5-byte persistent cache under LRU, run: the steady iterations' H2D bytes are at least
    the bound's (3 bytes: 8 served, 5 held)."""
    spec = _spec(5, persistent=True, writes_back=True)
    schedule = _cache_schedule(spec, flush=False)
    rec = Recorder()
    policy = CachePolicy(Lru())
    memory = dict.fromkeys(("gpu", "host_pinned", "host", "nvme", "pfs"), 1e12)
    machine = Machine({"h2d": 1.0, "d2h": 1.0, "dram": 1e9}, 1.0, 1, memory)
    Executor(schedule, machine, {spec.id: policy}, rec).run(steady_shortcut=False)
    moved = sum(s.bytes for s in rec.spans if s.iteration == 1 and s.resource == "h2d")
    least = _h2d_d2h_bytes(schedule)[0]
    assert least == pytest.approx(3.0, abs=1e-8)  # the engine's budget slack (1e-9)
    assert moved >= least


# ---------------------------------------------------------------- every shipped strategy
@hs.composite
def configs(draw: hs.DrawFn) -> RunConfig:
    """A random small model and batch on tiny, under any shipped strategy."""
    workload = draw(small_tiny_workloads(3))
    st = load_strategy(draw(hs.sampled_from(sorted(shipped_files("strategy")))))
    st = st.model_copy(update={"prefetch_depth": draw(hs.integers(0, 3))})
    return RunConfig(hardware=load_profile("tiny"), workload=workload, strategy=st,
                     iterations=draw(hs.integers(3, 4)), warmup_iterations=1)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(configs())
def test_the_bound_never_exceeds_the_simulated_time(cfg: RunConfig) -> None:
    try:
        result = simulate(cfg)
    except OffsimError:
        return  # a combination a system refuses
    if not result.feasible:
        return
    bound = time_lower_bound(result.config)
    assert bound.seconds <= result.metrics.iteration_time_s * (1 + 1e-9), (bound, result.metrics.iteration_time_s)
