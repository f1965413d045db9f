"""The schedule a strategy compiles: its ops, their order and dependencies, checked by hand on
the tiny model; structural invariants over every shipped strategy and random small workloads
(Hypothesis); the ``offsim schedule`` command."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from offsim import RunConfig, load_workload, make_run_config
from offsim.api import resolve
from offsim.cli import app
from offsim.config.loading import shipped_files
from offsim.core.enums import Activity, CacheId, Link, OpKind, TensorKind, Tier
from offsim.mechanisms.grads import REDUCTION_STREAM
from offsim.schedule.analysis import accesses, check_acyclic, check_allocations, op_instances
from offsim.schedule.ops import Alloc, Block, Delay, Flow, Schedule
from offsim.systems._compile import OrderKind, unit_visits
from offsim.systems._registry import compile_strategy, compose


def _compile(cfg: RunConfig) -> Schedule:
    """The schedule of ``cfg`` with its searched values chosen (auto-swap's amount)."""
    return compile_strategy(resolve(cfg))


STRATEGIES = sorted(shipped_files("strategy"))


def _block(schedule: Schedule, prefix: str) -> Block:
    return next(b for b in schedule.blocks() if b.name.startswith(prefix))


def _layer_ops(block: Block, layer: int, activity_in: set[Activity]) -> list[str]:
    return [f"{op.body.kind}:{op.tag.activity}" for op in block.ops
            if op.tag.layer == layer and op.tag.activity in activity_in]


def test_zero3_offload_layer_forward_and_backward_by_hand() -> None:
    """ZeRO-3 with parameters and optimizer state in CPU memory (zero-infinity-cpu) on tiny:
    each layer's forward issues its parameters' demand, waits for them, holds its activations,
    runs the kernel and ends its use of the parameters. Gradients go as DeepSpeed ZeRO-3 reduces
    them, per reduce bucket (stage3.py ``reduce_independent_p_g_buckets_and_remove_grads`` ->
    ``__reduce_and_partition_ipg_grads`` -> ``partition_grads``; deepspeed_runtime.md §3): the
    whole tiny model, P = 67,118,080 elements, is under ``reduce_bucket_size`` 5e8, so it is one
    bucket, flushed by the epilogue after the last layer of backward (layer 0): no gradient op in
    layer 2's backward. At layer 0: a slot of the reduce throttle (3 in flight), the bucket's
    bytes (2 B x P, reading every layer's 16-bit gradient), then on the one reduction stream the
    16-bit partition down (dp 1: all of it, 2 B x P) and back up (2 B x P), the boundary's fp64
    norms of the partition (6343d29; stage3.py ``partition_grads`` -> ``_constant_buffered_norm2``)
    and the fp32 copy down (4 B x P); the bucket's event (free, slot back) after the fp32 copy; the
    join that writes every layer's optimizer gradient; the host's wait for the stream (end of
    backward). The norms are a GPU kernel on the reduction stream reading each element's 16-bit
    slice (2 B), writing and reading its fp64 copy (8 + 8 B) and, the release casting on the GPU,
    its fp32 cast (2 + 4 B) at tiny's 1000 GB/s HBM: P x 24 / 1e12 = 1.61083392 ms; with the
    parameters on the CPU they hold no GPU bytes (offsim/systems/_part_grads.py
    ``_boundary_gpu_work``)."""
    sc = _compile(make_run_config("tiny", "tiny", "zero-infinity-cpu"))
    mb = _block(sc, "micro-batch")
    fwd = [op for op in mb.ops if op.tag.layer == 2][:5]
    assert [(op.body.kind, op.stream) for op in fwd] == [
        (OpKind.ACCESS, "gpu"), (OpKind.READY, "gpu"), (OpKind.ALLOC, "gpu"), (OpKind.DELAY, "gpu"),
        (OpKind.DONE, "gpu")]
    bwd = [op for op in mb.ops if op.tag.layer == 2][5:]
    assert [(op.body.kind, op.tag.activity) for op in bwd] == [
        (OpKind.ACCESS, Activity.PARAM_FETCH), (OpKind.READY, Activity.PARAM_FETCH),
        (OpKind.ALLOC, Activity.ACT_FETCH), (OpKind.DELAY, Activity.BACKWARD),
        (OpKind.FREE, Activity.ACT_FETCH), (OpKind.FREE, Activity.ACT_FETCH), (OpKind.DONE, Activity.PARAM_FETCH)]
    grads = [op for op in mb.ops if op.tag.layer == 0 and op.tag.activity is Activity.GRAD_OFFLOAD]
    assert [op.body.kind for op in grads] == [OpKind.ACQUIRE, OpKind.ALLOC, OpKind.FLOW, OpKind.FLOW, OpKind.DELAY,
                                              OpKind.FLOW, OpKind.FREE, OpKind.RELEASE, OpKind.JOIN, OpKind.JOIN]
    acquire, alloc, down, up, norms, fp32, free, release, home, drain = grads
    assert acquire.stream == drain.stream == "gpu"
    assert alloc.after == (acquire.id,) and down.after == (alloc.id,) and up.after == (down.id,)
    assert norms.after == (up.id,) and fp32.after == (norms.id,)
    assert free.after == release.after == home.after == (fp32.id,)
    assert {r.unit for r in alloc.reads} == set(range(6))
    # one in-order reduction stream carries them all, in issue order (stage3.py RS, 623b9b1)
    assert down.stream == up.stream == norms.stream == fp32.stream == REDUCTION_STREAM
    assert norms.tag.label == "gradient norms (fp64)" and isinstance(norms.body, Delay)
    assert {w.unit for w in home.writes} == set(range(6)) and home.writes[0].kind is TensorKind.GRAD_OPT
    p = 67_118_080  # the tiny model's parameters (state_sizes(...).params_total)
    assert isinstance(alloc.body, Alloc) and alloc.body.nbytes == 2 * p
    flows = [(op.body.links, op.body.nbytes) for op in (down, up, fp32) if isinstance(op.body, Flow)]
    assert [links for links, _ in flows] == [(Link.D2H,), (Link.H2D,), (Link.D2H,)]
    assert [n for _, n in flows] == [2 * p, 2 * p, 4 * p]
    assert norms.body.seconds == pytest.approx(p * (2 + 8 + 8 + 2 + 4) / 1e12, rel=1e-12)  # 1.61083392 ms


def test_zero3_step_reads_every_gradient_and_the_next_fetch_waits_for_it() -> None:
    """The CPU step starts when every layer's gradient is home (a read of each), runs CPU Adam
    per sub-group between DeepSpeed's unscale and cast passes, and the compute stream waits for
    it. The 16-bit parameters live in host
    memory (ZeRO-3 offload_param: cpu), updated in place: nothing goes up; with them on the GPU
    (ZeRO-Offload) each sub-group's go up after its update."""
    sc = _compile(make_run_config("tiny", "tiny", "zero-infinity-cpu"))
    step = _block(sc, "step (first")
    start = next(op for op in step.ops if op.tag.label == "gradients home")
    assert {r.unit for r in start.reads} == set(range(6)) and start.stream == "cpu_step"
    adams = [op for op in step.ops if op.tag.activity is Activity.OPTIMIZER and op.body.kind is OpKind.FLOW]
    homes = [op for op in step.ops if op.tag.activity is Activity.PARAM_UPDATE]
    assert len(adams) >= 1 and not homes
    zo = _block(_compile(make_run_config("tiny", "tiny", "zero-offload")), "step (first")
    zo_adams = [op for op in zo.ops if op.tag.activity is Activity.OPTIMIZER and op.body.kind is OpKind.FLOW
                and op.body.links == ("cpu",)]
    passes = [op.tag.label.split(",")[0].split(" sub-group")[0] for op in zo.ops
              if op.body.kind is OpKind.FLOW and op.stream == "cpu_step"]
    assert passes == ["unscale gradients", "CPU Adam", "cast to 16-bit"] * len(zo_adams)  # DeepSpeed's order per group
    zo_homes = [op for op in zo.ops if op.tag.activity is Activity.PARAM_UPDATE]
    assert len(zo_homes) == len(zo_adams) >= 1 and all(h.body.links == ("h2d",) for h in zo_homes)
    last = step.ops[-1]
    assert last.stream == "gpu" and last.tag.label == "waits for the step"
    assert step.ops[-1].body.kind is OpKind.JOIN


def test_dpu_compute_waits_only_for_the_previous_step() -> None:
    sc = _compile(make_run_config("tiny", "tiny", "zero-offload-dpu"))
    step = _block(sc, "step (first")
    on_gpu = [op for op in step.ops if op.stream == "gpu"]
    assert [op.tag.label for op in on_gpu] == ["waits for the previous step"]


def test_instances_resolve_reads_to_the_writer() -> None:
    """In iteration 1 the step's first op waits for the instances that wrote every gradient
    in iteration 1, not in iteration 0 (on ZeRO-Offload's DeepSpeed ZeRO-2 path, 447c1e1, the
    writer is the end of each layer's copies, the boundary's fp32 D2H: no host accumulation)."""
    sc = _compile(make_run_config("tiny", "tiny", "zero-offload", iterations=2, warmup_iterations=1))
    ops = list(op_instances(sc))
    by_id = {i.id: i for i in ops}
    start = next(i for i in ops if i.iteration == 1 and i.op.tag.label == "gradients home")
    writers = [by_id[a] for a in start.after]
    assert writers and all(w.iteration == 1 and w.op.tag.activity is Activity.GRAD_OFFLOAD for w in writers)
    assert all(a < i.id for i in ops for a in i.after)


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize(("hardware", "workload"), [("tiny", "tiny"), ("rtx4090-pcie4-ws", "llama2-7b")])
def test_every_shipped_schedule_is_well_formed(hardware: str, workload: str, strategy: str) -> None:
    sc = _compile(make_run_config(hardware, workload, strategy))
    check_acyclic(sc)
    left = check_allocations(sc)
    _only_persistent(sc, left)


def _only_persistent(sc: Schedule, left: dict) -> None:  # type: ignore[type-arg]
    """What stays held: the init block's state and the units of persistent caches."""
    init = {(op.body.tier, op.body.tensor) for op in sc.blocks()[0].ops if isinstance(op.body, Alloc)}
    persistent = {(c.tier, op.body.tensor) for c in sc.caches if c.persistent
                  for p in c.fetch.values() for op in p.ops if isinstance(op.body, Alloc)}
    assert set(left) <= init | persistent, sorted(map(str, set(left) - init - persistent))[:5]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(strategy=st.sampled_from(STRATEGIES), layers=st.integers(1, 4), accumulation=st.integers(1, 4),
       iterations=st.integers(1, 4), checkpointing=st.booleans())
def test_schedules_are_acyclic_and_free_what_they_hold(strategy: str, layers: int, accumulation: int,
                                                        iterations: int, checkpointing: bool) -> None:
    wl = load_workload("tiny")
    wl = wl.model_copy(update={
        "model": wl.model.model_copy(update={"layers": layers}),
        "training": wl.training.model_copy(update={"grad_accumulation": accumulation,
                                                   "activation_checkpointing": checkpointing})})
    cfg = make_run_config("tiny", wl, strategy, iterations=iterations, warmup_iterations=iterations - 1)
    sc = _compile(cfg)
    check_acyclic(sc)
    _only_persistent(sc, check_allocations(sc))
    # (the delayed parameter update runs at least two more iterations than it warms up: cfg.iterations)
    system = compose(resolve(cfg))
    unit_major = system.order.kind is OrderKind.UNIT_MAJOR
    per_iteration = accumulation * (len(unit_visits(system)) if unit_major else 1)
    assert sum(1 for i in sc.instances() if i.block.name.startswith(("micro-batch", "unit "))) == \
        cfg.iterations * per_iteration
    cache = sc.cache(CacheId.GPU_PARAMS)
    if cache is not None:  # each layer is asked for twice per micro-batch (unit-major: per visit)
        n = layers + 2
        passes = 1 if unit_major else accumulation
        assert accesses(sc, CacheId.GPU_PARAMS, 0) == (list(range(n)) + list(reversed(range(n)))) * passes


def test_schedule_json_lists_instances_with_dependencies() -> None:
    result = CliRunner().invoke(app, ["schedule", "-H", "tiny", "-w", "tiny", "-s", "zero-infinity-nvme", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    ops = data["ops"]
    assert [o["id"] for o in ops] == list(range(len(ops)))
    assert all(a < o["id"] for o in ops for a in o["after"])
    assert {"id", "kind", "layer", "micro_batch", "after"} <= set(ops[0])
    flows = [o for o in ops if o["kind"] == "flow"]
    assert flows and all(o["bytes"] > 0 and o["resources"] for o in flows)
    kernels = [o for o in ops if o["kind"] == "delay" and o["activity"] == "forward" and o["layer"] == 1]
    assert kernels and kernels[0]["flops"] > 0
    caches = {c["id"]: c for c in data["caches"]}
    # no DRAM cache: a zero-capacity one counts each sub-group's read and write-back
    assert set(caches) == {"gpu_params", "dram_optimizer"} and caches["dram_optimizer"]["capacity_bytes"] == 0
    assert any(o["tier"] == Tier.NVME for o in ops if o["kind"] == "alloc")


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_schedule_command_for_every_strategy(strategy: str) -> None:
    result = CliRunner().invoke(app, ["schedule", "-H", "tiny", "-w", "tiny", "-s", strategy])
    assert result.exit_code == 0, result.output
    assert "micro-batch" in result.output and "x3" in result.output


def test_schedule_command_bad_input_is_one_message() -> None:
    result = CliRunner().invoke(app, ["schedule", "-H", "no-such-box", "-w", "tiny", "-s", "zero-offload"])
    assert result.exit_code == 2
    assert "no-such-box" in result.output and "Traceback" not in result.output


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_no_zero_byte_flows(strategy: str) -> None:
    """A mechanism emits no zero-byte flow (SGD keeps no optimizer state: tba-bert-12k; ZenFlow's
    gradient lands in the pinned buffer with a Join, not a 0-byte host accumulate flow)."""
    sc = _compile(make_run_config("tiny", "tiny", strategy))
    progs = [p for c in sc.caches for p in (*c.fetch.values(), *c.evict.values())]
    assert all(op.body.nbytes > 0 for b in [*sc.blocks(), *progs] for op in b.ops if isinstance(op.body, Flow))
