"""Deep Optimizer States (Maurya et al., Middleware 2024, arXiv 2410.21316) and DeepSpeed
ZeRO-Offload++ Twin-Flow: the optimizer step split between the GPU and the CPU.

Mechanism tests are hand-checkable (bytes scale with 1 - f, memory with f, the split model's
choices at its extremes); the headline test compares DOS with the vanilla DeepSpeed ZeRO-3
CPU-optimizer run of the DOS artifact's sample logs, with the citation beside the numbers.
"""

from __future__ import annotations

import pytest

from offsim import load_strategy, make_run_config, simulate
from offsim.config.strategy import Strategy
from offsim.metrics import RunMetrics
from offsim.plan.optimizer_split import SplitBytes, SplitRates, estimate_step_s, interleave, plan_split

HW = "a100-80gb-pcie4"  # EPYC 7543P host, AVX2 CPU-Adam, 512 GiB: as the DOS sample logs show
WL = "dos-7b"           # the sample logs' model, 5,948,837,888 parameters


def strategy(preset: str, **update) -> Strategy:
    st = load_strategy(preset)
    return Strategy.model_validate({**st.model_dump(), **update})


def run(strategy_: Strategy | str, hardware: str = HW, workload: str = WL) -> RunMetrics:
    m = simulate(make_run_config(hardware, workload, strategy_)).metrics
    assert m.feasible, m.infeasible_reason
    return m


def vanilla() -> Strategy:
    """The artifact's vanilla DeepSpeed run: the same ds_config with DOS's switches off
    (prefetch_optimizer 0, part_grads_async 0): blocking gradient flushes, CPU-only step, on the
    fork's DeepSpeed 0.13.3 (the log's ds_report), whose boundary copy is a blocking 16-bit D2H
    with the upcast on the CPU (deepspeed_runtime.md 14.9)."""
    return strategy("deep-optimizer-states", name="dos-vanilla-deepspeed", optimizer_split="fixed",
                    overlap_grad_offload=False, z3_fp32_grad_copy="cpu_upcast_blocking")


# ---------------------------------------------------------------- the split model (pure)
BYTES = SplitBytes(h2d_gpu=16.0, d2h_gpu=12.0, hbm_gpu=30.0, h2d_cpu=2.0, gpu_buffer=16.0)
RATES = SplitRates(cpu_params_per_s=1e9, h2d_bytes_per_s=16e9, d2h_bytes_per_s=16e9, hbm_bytes_per_s=1e12)


def test_cpu_only_estimate_is_the_cpu_time() -> None:
    """10 groups of 1e8 params at 1e9 params/s: 1 s on the CPU; their 2-byte params take 0.125 s H2D."""
    assert estimate_step_s(0, 10, 1e8, RATES, BYTES) == pytest.approx(1.0)


def test_split_model_extremes() -> None:
    """No GPU memory: nothing goes to the GPU. A CPU far faster than PCIe: nothing either. A
    CPU far slower: nearly everything, and the estimate is below the CPU-only one."""
    assert plan_split(10, 1e8, RATES, BYTES, free_gpu_bytes=0.0).gpu_groups == 0
    fast = SplitRates(1e13, 16e9, 16e9, 1e12)
    assert plan_split(10, 1e8, fast, BYTES, free_gpu_bytes=1e12).gpu_groups == 0
    slow = SplitRates(1e6, 16e9, 16e9, 1e12)
    plan = plan_split(10, 1e8, slow, BYTES, free_gpu_bytes=1e12)
    assert plan.gpu_groups >= 9 and plan.predicted_step_s < plan.cpu_only_step_s
    assert 1 <= plan.buffers <= 3


def test_split_model_balances_cpu_and_link() -> None:
    """CPU 1 s/group-set vs 1 ns/param over PCIe: a share x on the GPU costs (1-x) s on the CPU and
    (16x + 2(1-x)) / 16 s on H2D; they meet at x = 0.47, so about half the groups go to the GPU."""
    plan = plan_split(100, 1e7, RATES, BYTES, free_gpu_bytes=1e12)
    assert 40 <= plan.gpu_groups <= 50


def test_interleave_spreads_gpu_groups() -> None:
    assert interleave(list(range(10)), 5) == {0, 2, 4, 6, 8}
    assert interleave(list(range(10)), 0) == set()
    assert len(interleave(list(range(7)), 7)) == 7


# ---------------------------------------------------------------- Twin-Flow mechanism
def test_tiny_gpu_fraction_equals_cpu_only() -> None:
    """f -> 0 reduces to the plain CPU-offloaded optimizer (the f > 0 code path is continuous),
    and f = 0 given explicitly is the preset's default exactly."""
    # the base is the twin-flow system at f = 0: since 447c1e1 the zero-offload system moves
    # gradients as DeepSpeed's ZeRO-2 does (offsim/mechanisms/zero2_grads.py), twin-flow generically
    base = run(strategy("zero-offload", system="twin-flow"), "rtx4090-pcie4-ws", "llama2-7b")
    same = run(strategy("zero-offload", system="twin-flow", optimizer_gpu_fraction=0.0), "rtx4090-pcie4-ws",
               "llama2-7b")
    tiny = run(strategy("zero-offload", system="twin-flow", optimizer_gpu_fraction=1e-9), "rtx4090-pcie4-ws",
               "llama2-7b")
    assert same == base
    assert tiny.iteration_time_s == pytest.approx(base.iteration_time_s, rel=1e-6)
    assert tiny.traffic_bytes.d2h == pytest.approx(base.traffic_bytes.d2h, rel=1e-6)


#: the GPU share the Twin-Flow tests run at on HW/WL: the preset's 0.7 no longer fits there since
#: Twin-Flow takes DeepSpeed ZeRO-3's gradient path (z3hook: + the 1 GB IPG buffer and up to 3
#: reduce buckets of 1 GB in flight; needs 80.90 GiB of 79.14), 0.6 does (0.1 x 5.95e9 x 16 B less)
TWIN_F = 0.6


@pytest.mark.parametrize("f", [0.3, TWIN_F])
def test_twin_flow_pcie_bytes_shrink_by_one_minus_f(f: float) -> None:
    """Twin-Flow runs DeepSpeed ZeRO-3's gradient path (stage3.py ``partition_grads``;
    deepspeed_runtime.md §3, §11): every partition's 16-bit gradient makes the host round trip
    (2 B down, 2 B up per element, the GPU sub-groups' too), and only the CPU share 1 - f copies
    its fp32 gradient down at the boundary (4 B) and gets its updated 16-bit parameters back
    (2 B). Per element of the partition, one micro-batch: D2H 2 + 4 (1 - f) against 6 at f = 0,
    H2D 2 + 2 (1 - f) against 4 (before the round trip was composed, z3hook: (1 - f) x both)."""
    base = run(strategy("twin-flow", optimizer_gpu_fraction=0.0))
    tf = run(strategy("twin-flow", optimizer_gpu_fraction=f))
    assert tf.traffic_bytes.d2h == pytest.approx((2 + 4 * (1 - f)) / 6 * base.traffic_bytes.d2h, rel=1e-6)
    assert tf.traffic_bytes.h2d == pytest.approx((2 + 2 * (1 - f)) / 4 * base.traffic_bytes.h2d, rel=1e-6)


def test_twin_flow_gpu_memory_grows_by_f_times_state() -> None:
    """GPU peak grows by about f x (12 B fp32 master + moments + 4 B fp32 grad) per parameter."""
    f, params = TWIN_F, 5_948_837_888
    base = run(strategy("twin-flow", optimizer_gpu_fraction=0.0))
    tf = run(strategy("twin-flow", optimizer_gpu_fraction=f))
    assert tf.peak_bytes.gpu - base.peak_bytes.gpu == pytest.approx(f * params * 16, rel=0.05)
    assert tf.peak_bytes.host_pinned < base.peak_bytes.host_pinned


def test_twin_flow_shortens_the_step() -> None:
    """Twin-Flow (DeepSpeed blog): the GPU updates its share while the CPU updates the rest, so
    the step is shorter than the all-CPU step (direction; the blog's up-to-6x is end to end on
    8-GPU DGX nodes and is not asserted)."""
    base = run(strategy("twin-flow", optimizer_gpu_fraction=0.0))
    tf = run(strategy("twin-flow", optimizer_gpu_fraction=TWIN_F))
    assert tf.phases_s.optimizer < 0.5 * base.phases_s.optimizer
    assert tf.iteration_time_s < base.iteration_time_s


def test_twin_flow_ratio_in_whole_sub_groups_by_hand() -> None:
    """DeepSpeed's ratio (stage3.py _create_fp32_partitions): the first int((1 - ratio) * n)
    sub-groups on the GPU. Groups of 10, 20, 30, 40: ratio 0.3 -> int(2.8) = 2 groups, 30/100;
    ratio 0.1 -> 3 groups, 60/100; ratio 1.0 -> none."""
    from offsim.systems.twin_flow import gpu_share_of_ratio

    groups = [10, 20, 30, 40]
    assert gpu_share_of_ratio(groups, 0.3) == pytest.approx(0.3)
    assert gpu_share_of_ratio(groups, 0.1) == pytest.approx(0.6)
    assert gpu_share_of_ratio(groups, 1.0) == 0.0


def test_twin_flow_ratio_runs_as_its_share_set_by_hand() -> None:
    """system_options ratio 0.4 runs as optimizer_gpu_fraction set to its whole-sub-group share
    (dos-7b on one GPU, sub_group_size 1e9: 6 sub-groups, int(0.6 x 6) = 3 on the GPU; ratio 0.3's
    4 no longer fit, :data:`TWIN_F`); beside a
    hand-set fraction it is refused."""
    from offsim.errors import ConfigError
    from offsim.plan.footprint import deepspeed_sub_groups, param_partitions, state_sizes
    from offsim.systems.twin_flow import gpu_share_of_ratio

    by_ratio = strategy("twin-flow", optimizer_gpu_fraction=0.0, system_options={"ratio": 0.4})
    cfg = make_run_config(HW, WL, by_ratio)
    groups = deepspeed_sub_groups(param_partitions(cfg, state_sizes(cfg)), 1e9)
    assert len(groups) == 6
    share = gpu_share_of_ratio(groups, 0.4)
    assert share == pytest.approx(sum(groups[:3]) / sum(groups))
    a, b = run(by_ratio), run(strategy("twin-flow", optimizer_gpu_fraction=share))
    assert a.iteration_time_s == pytest.approx(b.iteration_time_s)
    assert a.peak_bytes.gpu == pytest.approx(b.peak_bytes.gpu)
    with pytest.raises(ConfigError, match="both set the GPU share"):
        simulate(make_run_config(HW, WL, strategy("twin-flow", system_options={"ratio": 0.3})))


def test_twin_flow_refuses_what_it_cannot_model() -> None:
    with pytest.raises(ValueError, match="optimizer_gpu_fraction"):
        strategy("zero-infinity-nvme", optimizer_gpu_fraction=0.5)


# ---------------------------------------------------------------- Deep Optimizer States
def test_dos_split_is_partial_and_no_slower_than_cpu_only() -> None:
    """The per-iteration split sends some but not all sub-groups to the GPU, and the step is no
    slower than the same configuration updating everything on the CPU."""
    dos = strategy("deep-optimizer-states")
    cpu_only = strategy("deep-optimizer-states", optimizer_split="fixed")
    result = simulate(make_run_config(HW, WL, dos))
    spans = result.spans()
    cfg = result.config
    steady = range(cfg.warmup_iterations, cfg.iterations)
    on_gpu = spans[spans.iteration.isin(steady) & spans.name.str.startswith("GPU Adam sub-group")]
    groups_on_gpu_per_iteration = len(on_gpu) / len(steady)  # the run-time split may vary by a group
    groups = -(-5_948_837_888 // int(1e7))  # ceil: sub_group_size 1e7
    assert 0 < groups_on_gpu_per_iteration < groups
    assert result.metrics.phases_s.optimizer <= run(cpu_only).phases_s.optimizer
    # the streamed state crosses PCIe both ways: 16 B/param in, 12 B/param out (traffic is the
    # average over the steady iterations, so is the count)
    assert result.metrics.traffic_bytes.d2h == pytest.approx(
        run(cpu_only).traffic_bytes.d2h + groups_on_gpu_per_iteration * 5_948_837_888 / groups * 12,
        rel=1e-6)


def test_dos_without_free_gpu_memory_stays_on_the_cpu() -> None:
    """With no GPU memory to spare the model sends nothing to the GPU (the split is memory-aware)."""
    hw = "rtx4090-pcie4-ws"
    wl = "llama2-7b"
    dos = run(strategy("deep-optimizer-states", zero_stage=2, prefetch_depth=0, reuse_distance_params=0.0,
                       sub_group_params=1e12), hw, wl)
    cpu = run(strategy("deep-optimizer-states", zero_stage=2, prefetch_depth=0, reuse_distance_params=0.0,
                       sub_group_params=1e12, optimizer_split="fixed"), hw, wl)
    assert dos.iteration_time_s == pytest.approx(cpu.iteration_time_s)


def test_dos_faster_than_vanilla_deepspeed() -> None:
    """Deep Optimizer States (arXiv 2410.21316) abstract: about 2.5x faster iterations than
    DeepSpeed's offloaded optimizer. Artifact sample logs (github.com/DataStates/artifacts,
    deep-optimizer-states/sample-logs/...-7B, published case dos-7b-1gpu-sample): vanilla
    ZeRO-3 ~9.5 s/iter (backward ~4.8 s with blocking gradient flushes, step ~3.94 s) vs DOS
    ~6.85 s/iter (backward ~1.55 s, step ~4.17 s): 1.39x. Generous range 1.2x to 3.0x covers
    both; the backward must shrink as in the log (4.8 -> 1.6 s). offsim, measured 2026-11-25:
    5.25 -> 3.88 s, 1.35x; after ZeRO-3's blocking pageable upload per sub-group
    (tests/test_step_upload.py): 6.16 -> 4.39 s, 1.40x."""
    van = run(vanilla())
    dos = run("deep-optimizer-states")
    speedup = van.iteration_time_s / dos.iteration_time_s
    assert 1.2 <= speedup <= 3.0


def test_dos_backward_shrinks_as_in_the_sample_log() -> None:
    """The sample logs' backward shrinks 4.8 -> 1.55 s (DOS/vanilla 0.33). offsim, measured
    2026-11-25: 6.31 -> 1.94 s (0.31), since vanilla's blocking 16-bit copy on the fork's 0.13.3
    faults in the new pageable temporary of every parameter of 32 MiB or more
    (tests/test_zero3_first_touch.py); before that 2.71 -> 1.91 s (0.70, a strict xfail). Both
    backwards sit above their logs (vanilla +32%, DOS +24%)."""
    van = run(vanilla())
    dos = run("deep-optimizer-states")
    assert dos.phases_s.backward < 0.6 * van.phases_s.backward


@pytest.mark.xfail(strict=True, reason=(
    "In the DOS sample log the hybrid step is not faster than vanilla's CPU step (4.17 vs 3.94 s); "
    "offsim's performance model sends part of the sub-groups to the GPU and shortens the step by 29% "
    "(2.35 vs 3.32 s on a100-80gb-pcie4, measured 2026-11-25 with ZeRO-3's blocking pageable upload per "
    "sub-group), because the streamed state adds PCIe "
    "throughput to the CPU's. What cost DOS the step time in the log (e.g. its prefetch gap, CPU-side "
    "copies into pinned buffers, or the bf16->fp32 gradient handling) is not in the artifact's logs or "
    "the paper at a level offsim can model. The sample log's own split, the artifact fork's prefetch_optimizer_gap "
    "2 (system_options), was not faster (3.57 vs 3.32 s) until its GPU sub-groups' gradients stayed on the GPU as the "
    "fork keeps them: 3.09 vs 3.32 s, and with the fork's own 130 sub-groups (system_options megatron_layout, "
    "e6a44ee) the "
    "gap-2 step is 3.70 vs 3.33 s, not faster, as in the log (tests/test_dos_fork.py)"))
def test_dos_step_not_faster_than_vanilla_as_in_the_sample_log() -> None:
    van = run(vanilla())
    dos = run("deep-optimizer-states")
    assert dos.phases_s.optimizer >= 0.95 * van.phases_s.optimizer


def test_vanilla_iteration_time_matches_the_sample_log() -> None:
    """The sample log's vanilla iteration is ~9.5 s; offsim, measured 2026-11-25 on
    a100-80gb-pcie4: 9.78 s. Its step is 3.32 s against the log's 3.96 (CPU Adam at the profile's
    DRAM-bound 3.21e9 params/s, 1.85 s, then each sub-group's blocking pageable upload, 0.96 s); its
    backward 6.31 s against 4.78 (+32%): the round trip, the blocking 16-bit flush with the CPU
    upcast and the first touch of its fresh temporaries at dask-cuda PR #98's 4 KiB-page rate
    (tests/test_zero3_first_touch.py; before that 6.16 s, a strict xfail). The artifact does not
    state its hardware, nor its kernel's transparent-huge-page setting, which sets that rate."""
    assert run(vanilla()).iteration_time_s == pytest.approx(9.5, rel=0.25)


# ---------------------------------------------------------------- the split in the schedule
def _dos_optimizer():
    from offsim.mechanisms.cpu_optimizer import CpuOptimizer
    from offsim.systems._registry import compose

    opt = compose(make_run_config(HW, WL, "deep-optimizer-states")).mechanisms["optimizer"]
    assert isinstance(opt, CpuOptimizer) and opt.split is not None
    return opt


def test_split_program_streams_the_chosen_groups_through_the_buffers() -> None:
    """Option (10 on the GPU, 2 buffers): ten round trips (alloc, H2D, GPU Adam, D2H, free), the
    j-th waiting for the (j-2)-th's free, and CPU Adam over the other sub-groups."""
    from offsim.core.enums import Activity, Tier
    from offsim.schedule.ops import Alloc, Delay, Free

    opt = _dos_optimizer()
    n = len(opt.groups)
    program = opt.split_program((0, False), (10, 2))
    allocs = [op for op in program.ops if isinstance(op.body, Alloc) and op.body.tier is Tier.GPU]
    frees = [op for op in program.ops if isinstance(op.body, Free) and op.body.tier is Tier.GPU]
    adams = [op for op in program.ops if isinstance(op.body, Delay) and op.stream == "gpu_opt"]
    cpu = [op for op in program.ops if op.tag.activity is Activity.OPTIMIZER and op.stream == "cpu_step"
           and op.tag.label.startswith("CPU Adam sub-group")]  # not the host passes around it
    assert len(allocs) == len(frees) == len(adams) == 10
    assert len(cpu) == n - 10
    assert {op.tag.group for op in adams}.isdisjoint({op.tag.group for op in cpu})
    for j in range(2, 10):
        assert allocs[j].after == (frees[j - 2].id,)


def test_split_executes_the_policys_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    """A policy that sends every sub-group to the GPU through one buffer: no CPU Adam span, one
    GPU Adam span per sub-group, and D2H carries every sub-group's 12 B/param of state."""
    import offsim.systems.deep_optimizer_states as dos

    class AllOnGpu:
        def __init__(self, n: int) -> None:
            self.n, self.seen = n, []

        def choose(self, iteration: int, gpu_free_bytes: float):
            return (self.n, 1)

        def observe(self, option, stream_s: float) -> None:
            self.seen.append(stream_s)

    n = len(_dos_optimizer().groups)
    policy = AllOnGpu(n)
    monkeypatch.setattr(dos, "split_policy", lambda cfg, sz: policy)
    result = simulate(make_run_config(HW, WL, "deep-optimizer-states"))
    spans = result.spans()
    last = spans[spans.iteration == spans["iteration"].max()]
    assert (last.name.str.startswith("GPU Adam sub-group")).sum() == n
    assert not last.name.str.startswith("CPU Adam").any()
    cpu_only = strategy("deep-optimizer-states", name="dos-cpu-only", optimizer_split="fixed")
    assert result.metrics.traffic_bytes.d2h == pytest.approx(
        run(cpu_only).traffic_bytes.d2h + 5_948_837_888 * 12, rel=1e-3)
    assert policy.seen == [0.0] * len(policy.seen) and policy.seen
