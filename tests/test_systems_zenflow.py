"""DeepSpeed ZenFlow (Lan et al., arXiv 2505.12242; DeepSpeed ``deepspeed/runtime/zenflow/`` at
``edaa722126``): top-k gradient columns updated on the GPU every step, the rest accumulated over a
window of ``update_interval`` steps and applied by a CPU worker process while the GPU runs the next
window. Plans against DeepSpeed's boundary rules, a hand-computed timeline of the asynchronous
window on the tiny fixtures, traffic and memory against the code path as read, then the headline
against ``zero-offload`` on ``a100-80gb-pcie4`` (citation beside each factor)."""

from __future__ import annotations

import json
from itertools import pairwise
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs
from typer.testing import CliRunner

from offsim import load_profile, load_strategy, make_run_config, simulate
from offsim.cli import app
from offsim.errors import ConfigError
from offsim.plan.footprint import state_sizes
from offsim.results import RunResult
from offsim.systems.zenflow import Options, step_plans

ADAM = "CPU Adam (worker process)"


def zenflow(**options: object) -> object:
    """The shipped strategy with ``options`` over its system options."""
    st = load_strategy("zenflow")
    return st.model_copy(update={"system_options": {**st.system_options, **options}})


def slow_cpu_tiny(params_per_s: float = 1e8) -> object:
    """The tiny machine with a CPU Adam of ``params_per_s`` (a measured figure: the worker's
    share scales with its cores), so the CPU step outlasts a window of GPU work."""
    hw = load_profile("tiny")
    return hw.model_copy(update={"cpu": hw.cpu.model_copy(update={"optimizer_params_per_s": params_per_s})})


def run(hardware: object, workload: object, strategy: object, iterations: int, warmup: int) -> RunResult:
    r = simulate(make_run_config(hardware, workload, strategy, iterations=iterations, warmup_iterations=warmup))
    assert r.metrics.feasible, r.metrics.infeasible_reason
    return r


def spans(r: RunResult, name: str) -> list:
    return sorted((s for s in r.recorder.spans if s.name == name), key=lambda s: s.start_s)


# ------------------------------------------------------------------ plans (DeepSpeed's rules)
def test_plans_follow_deepspeeds_boundaries_with_overlap() -> None:
    """u = 4, no reselection: a boundary every 4th step (``is_zenflow_update_boundary``:
    (step + 1) % u == 0); the running sum goes up on every step but a window's first; the first
    boundary has no previous CPU step to wait for; the last step submits nothing (its update
    belongs to steps after the run); the selection happens once, at step 0."""
    plans = step_plans(Options(update_interval=4, overlap_step=True), 10)
    rows = ["".join("1" if f else "." for f in (p.boundary, p.sums_up, p.waits, p.submits, p.synchronous, p.selects))
            for p in plans]
    #        boundary, sums up, waits, submits, synchronous, selects
    assert rows == [".....1", ".1....", ".1....", "11.1..", "......", ".1....", ".1....", "1111..", "......",
                    ".1...."]
    assert all(p.selective for p in plans) and not any(p.resyncs for p in plans)


def test_reselection_adds_boundaries_and_resyncs_the_master() -> None:
    """select_strategy step, interval 3, u 2: a select boundary is also an update boundary
    ((step + 1) % 3 == 0), the columns are chosen at steps 0, 3, 6, and the backward of steps 3
    and 6 starts by copying the GPU weights into the master (``backward_prologue``; step 0 skips it)."""
    plans = step_plans(Options(update_interval=2, select_strategy="step", select_interval=3, overlap_step=True), 8)
    assert [k for k, p in enumerate(plans) if p.boundary] == [1, 2, 3, 5, 7]
    assert [k for k, p in enumerate(plans) if p.selects] == [0, 3, 6]
    assert [k for k, p in enumerate(plans) if p.resyncs] == [2, 5]


def test_warm_up_rounds_are_synchronous_full_updates() -> None:
    """``full_warm_up_rounds`` 3, u 2: steps 0-1 are boundaries by (step + 1) < 3 and step 2 by
    (step + 1 - 3) % 2 == 0; all three are warm-up rounds (step < 3): synchronous, without the
    selective step. The windows then count from the warm-up's end (boundaries 4, 6), and the
    first overlapped boundary has no worker step to wait for."""
    plans = step_plans(Options(update_interval=2, overlap_step=True, full_warm_up_rounds=3), 8)
    assert [(p.boundary, p.synchronous, p.selective) for p in plans[:4]] == [(True, True, False)] * 3 + [
        (False, False, True)]
    assert [k for k, p in enumerate(plans) if p.boundary] == [0, 1, 2, 4, 6]
    assert [k for k, p in enumerate(plans) if p.waits] == [6]


@pytest.mark.parametrize(("options", "named"), [
    ({"update_interval": "auto"}, "update_interval must be an integer"),
    ({"select_strategy": "step", "select_interval": "auto"}, "needs an integer select_interval"),
    ({"select_strategy": "step", "select_interval": 2}, "select_interval >= update_interval"),
])
def test_options_deepspeed_refuses_or_offsim_cannot_model_are_refused(options: dict, named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        simulate(make_run_config("tiny", "tiny", zenflow(**options)))


@given(u=hs.integers(1, 5), select=hs.integers(0, 12), warm=hs.integers(0, 4), extra=hs.integers(0, 12))
def test_plan_invariants(u: int, select: int, warm: int, extra: int) -> None:
    """Any window, reselection interval and warm-up: a window opens after every boundary (the
    running sum goes up on every other step); every overlapped boundary but the first waits for
    the worker step before it; only the last step may leave its window unsubmitted; boundaries
    after the warm-up are at most u steps apart."""
    s = 0 if select < u else select
    o = Options(update_interval=u, select_strategy="step", select_interval=s or 10**6, overlap_step=True,
                full_warm_up_rounds=warm)
    plans = step_plans(o, warm + u + extra)
    for k, p in enumerate(plans):
        assert p.sums_up == (k > 0 and not plans[k - 1].boundary)
        assert p.submits == (p.boundary and (p.synchronous or k < len(plans) - 1))
    overlapped = [k for k, p in enumerate(plans) if p.boundary and not p.synchronous]
    assert [k for k, p in enumerate(plans) if p.waits] == overlapped[1:]
    after = [k for k in overlapped if k >= warm]
    assert all(b - a <= u for a, b in zip([warm - 1, *after], after, strict=False))


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(u=hs.integers(1, 4), extra=hs.integers(0, 5), overlap=hs.booleans())
def test_every_submitted_step_runs_and_each_wait_follows_it(u: int, extra: int, overlap: bool) -> None:
    """Simulated on tiny with a slow CPU: one worker Adam per submitted boundary, in order; the
    wait of each overlapped boundary ends when the worker step submitted before it ends."""
    iterations = u + 1 + extra
    r = run(slow_cpu_tiny(), "tiny", zenflow(update_interval=u, overlap_step=overlap), iterations, 1)
    # the run measures whole windows after the first (ZenFlowStep.measure_window raises the count)
    assert (r.config.warmup_iterations, r.config.steady_iterations % u, r.config.tail_iterations) == (u, 0, 1)
    plans = step_plans(Options(update_interval=u, overlap_step=overlap), r.config.iterations)
    adam = spans(r, ADAM)
    assert [s.iteration for s in adam] == [k for k, p in enumerate(plans) if p.submits]
    assert all(a.end_s <= b.start_s + 1e-12 for a, b in pairwise(adam))
    waits = spans(r, "waits for the previous window's CPU step")
    assert len(waits) == sum(p.waits for p in plans)
    for w in waits:
        before = [a for a in adam if a.iteration < w.iteration]
        assert w.end_s == pytest.approx(max(w.start_s, before[-1].end_s), abs=1e-12)


# ------------------------------------------------------------------ the asynchronous window, by hand
def test_window_timeline_on_tiny_by_hand() -> None:
    """Tiny model (P = 67,118,080 parameters, one rank), tiny machine with CPU Adam at 1e8
    params/s (4 cores: ceil(0.5 x 4) = 2 kept for training, the worker gets 2: 5e7 params/s),
    u = 2, 6 steps. Once the CPU step outlasts a window of GPU work the chain is, per window:

    ====================  ===============================  ==========================
    op                    bytes                             seconds
    ====================  ===============================  ==========================
    CPU Adam (worker)     P x 32 B DRAM, CPU at 5e7 p/s     P / 5e7      = 1.3423616
    stale_param cast      P x (4 + 2) B at 100 GB/s DRAM    6 P / 1e11   = 0.0040271
    parameters up         P x 2 B pageable at 0.5 GB/s      2 P / 5e8    = 0.2684723
    unscale               P x 8 B at 100 GB/s DRAM          8 P / 1e11   = 0.0053694
    ====================  ===============================  ==========================

    The boundary of step 3 waits for the CPU step step 1 submitted, then cast, upload, unscale,
    and submits its own: the second CPU step starts cast + up + unscale after the first ends.
    The GPU runs steps 2 and 3 while the first CPU step runs (step 2's forward starts as it does).
    Steady steps 2-5 (and step 6 after them, so that step 5 submits its CPU step as every
    boundary does): each window's chain is Adam + cast + up + unscale, so 2 (Adam + cast + up +
    unscale) over 4 steps."""
    p = 67_118_080
    assert state_sizes(make_run_config("tiny", "tiny", "zenflow")).params_total == p
    adam_s, cast_s, up_s, unscale_s = p / 5e7, 6 * p / 1e11, 2 * p / 5e8, 8 * p / 1e11
    r = run(slow_cpu_tiny(), "tiny", zenflow(update_interval=2), iterations=6, warmup=2)
    adam = spans(r, ADAM)
    assert r.config.iterations == 7  # one step after the measured windows (ZenFlowStep.measure_window)
    assert [s.iteration for s in adam] == [1, 3, 5]
    assert [s.end_s - s.start_s for s in adam] == pytest.approx([adam_s] * 3, rel=1e-9)
    assert [s.end_s - s.start_s for s in spans(r, "stale_param cast to 16-bit on the host")] == pytest.approx(
        [cast_s] * 2, rel=1e-9)
    assert [s.end_s - s.start_s for s in spans(r, "parameters up")] == pytest.approx([up_s] * 2, rel=1e-9)
    assert adam[1].start_s - adam[0].end_s == pytest.approx(cast_s + up_s + unscale_s, rel=1e-9)
    forward2 = next(s for s in r.recorder.spans if s.iteration == 2 and s.kind == "forward")
    backward3 = [s for s in r.recorder.spans if s.iteration == 3 and s.kind == "backward"]
    assert forward2.start_s == pytest.approx(adam[0].start_s, abs=1e-12)
    assert max(s.end_s for s in backward3) < adam[0].end_s  # a whole window of GPU work under the CPU step
    wait = spans(r, "waits for the previous window's CPU step")
    assert [s.iteration for s in wait] == [3, 5] and wait[0].end_s == pytest.approx(adam[0].end_s, abs=1e-12)
    assert r.metrics.iteration_time_s == pytest.approx(2 * (adam_s + cast_s + up_s + unscale_s) / 4, rel=1e-9)


def test_without_overlap_the_step_waits_for_every_cpu_step() -> None:
    """``overlap_step`` false (DeepSpeed's default): ZeRO-Offload once every u steps, CPU Adam on
    all the rank's cores (1e8 params/s): each boundary waits the whole P / 1e8 s, and the GPU runs
    nothing meanwhile."""
    p = 67_118_080
    r = run(slow_cpu_tiny(), "tiny", zenflow(update_interval=2, overlap_step=False), iterations=6, warmup=2)
    adam = spans(r, ADAM)
    assert [s.iteration for s in adam] == [1, 3, 5]
    assert [s.end_s - s.start_s for s in adam] == pytest.approx([p / 1e8] * 3, rel=1e-9)
    for a in adam:
        assert not [s for s in r.recorder.spans if s.resource == "gpu" and a.start_s < s.start_s < a.end_s]


# ------------------------------------------------------------------ traffic and memory
def test_pcie_bytes_per_window_are_the_code_paths() -> None:
    """Per element of the partition over a window of u steps the stage-1/2 code as read moves
    (2u + 4) B D2H and (2(u - 1) + 2) B H2D (new_systems.md §1, "Bytes"): per step with u = 4,
    3 B down and 2 B up, over 8 steady steps (two whole windows)."""
    p = 67_118_080
    r = run("tiny", "tiny", zenflow(), iterations=12, warmup=4)
    assert r.metrics.traffic_bytes.d2h == pytest.approx((2 * 4 + 4) / 4 * p, rel=1e-9)
    assert r.metrics.traffic_bytes.h2d == pytest.approx((2 * 3 + 2) / 4 * p, rel=1e-9)


def test_with_a_one_step_window_only_the_fp32_gradient_goes_down() -> None:
    """u = 1: every step is a window's only step, so DeepSpeed copies no b16 gradient
    (``copy_grads_in_partition``: no accumulation for a lone backward), only the fp32 one (4 B
    down), and the parameters come up every step (2 B); no host pass accumulates the gradient."""
    p = 67_118_080
    r = run("tiny", "tiny", zenflow(update_interval=1), iterations=5, warmup=1)
    assert r.metrics.traffic_bytes.d2h == pytest.approx(4 * p, rel=1e-9)
    assert r.metrics.traffic_bytes.h2d == pytest.approx(2 * p, rel=1e-9)
    assert not [s for s in r.recorder.spans if s.kind == "grad_accumulate" and s.bytes > 0 and s.resource != "h2d"]


def test_selected_columns_state_on_the_gpu_and_the_double_buffers_on_the_host() -> None:
    """Beyond ZeRO-Offload, ZenFlow holds on the GPU the selected columns' b16 gradients and two
    b16 moments (k P x 6 B), and on the host a second fp32 gradient buffer (4 B), the b16
    accumulation buffer (2 B), ``stale_param`` (4 B) and the worker's second moment set (8 B) per
    element (new_systems.md §1 Memory). With ``offload`` the moments move to pinned host memory."""
    p, k = 67_118_080, 0.05
    # ZeRO-Offload's knobs on the generic gradient path ZenFlow's system composes: the standard
    # composition, as twin-flow composes it at GPU share 0 (twin_flow.compose); the zero-offload
    # system moves gradients as DeepSpeed's ZeRO-2 does since 447c1e1 (its IPG buffers are not ZenFlow's)
    generic = load_strategy("zero-offload").model_copy(update={"system": "twin-flow"})
    base = run("tiny", "tiny", generic, iterations=3, warmup=1).metrics.peak_bytes
    zf = run("tiny", "tiny", "zenflow", iterations=3, warmup=1).metrics.peak_bytes
    off = run("tiny", "tiny", zenflow(offload=True), iterations=3, warmup=1).metrics.peak_bytes
    assert zf.gpu - base.gpu == pytest.approx(k * p * 6, abs=2)
    assert zf.host - base.host == pytest.approx(p * (4 + 2 + 4 + 8), abs=8)
    assert zf.host_pinned - base.host_pinned == pytest.approx(p * (4 + 2), abs=8)
    assert zf.gpu - off.gpu == pytest.approx(k * p * 4, abs=2)
    assert off.host_pinned - zf.host_pinned == pytest.approx(k * p * 4, abs=2)


# ------------------------------------------------------------------ headline
#: one A100 80GB PCIe and one H100 SXM5 (the blog places its stall figures on A100 and H100 nodes; the
#: paper's testbed behind 5x is not confirmed, new_systems.md "Not confirmed"): shipped profiles
TESTBEDS = ("a100-80gb-pcie4", "h100-sxm5-gen5")


@pytest.fixture(scope="module", params=TESTBEDS)
def headline(request: pytest.FixtureRequest) -> tuple[RunResult, RunResult]:
    """llama2-7b (seq 4096, micro-batch 1) on one GPU, 12 steps of which the last 8 (two whole
    windows of u = 4) are measured, the tutorial's configuration (topk 0.05, u 4, overlap_step)
    against ZeRO-Offload."""
    hw = request.param
    return (run(hw, "llama2-7b", "zero-offload", iterations=12, warmup=4),
            run(hw, "llama2-7b", "zenflow", iterations=12, warmup=4))


def idle_s(r: RunResult) -> float:
    """GPU idle per step (offsim's stall_s counts only waits a schedule names; ZeRO-Offload's
    step is not named one, so both are compared on the GPU's idle time)."""
    m = r.metrics
    return m.iteration_time_s * (1 - m.gpu_busy_fraction)


def test_headline_speedup_over_zero_offload(headline: tuple[RunResult, RunResult]) -> None:
    """"Up to 5x end-to-end speedup" over ZeRO-Offload (arXiv 2505.12242, abstract). The paper's
    testbed behind 5x is not confirmed (new_systems.md, Not confirmed). Direction, and within a
    factor 2.5 of 5x: >= 2x (reached 2.73x on the A100, 2.98x on the H100)."""
    zo, zf = headline
    speedup = zo.metrics.iteration_time_s / zf.metrics.iteration_time_s
    assert 2.0 <= speedup <= 5.0 * 1.25


def test_headline_stalls_cut(headline: tuple[RunResult, RunResult]) -> None:
    """"Reduces GPU stalls by over 85%" (arXiv 2505.12242, abstract): GPU idle per step cut by
    at least 70% (the residual within 2x of the paper's 15%); reached 85.4% (A100), 85.1% (H100)."""
    zo, zf = headline
    assert 1 - idle_s(zf) / idle_s(zo) >= 0.70


@pytest.mark.xfail(strict=True, reason=(
    "2x lower PCIe traffic (arXiv 2505.12242 abstract; paper/blog: 1.13x model size per step against 2x) "
    "counts only the unselected gradients down and the parameters up once per window; offsim models "
    "DeepSpeed's stage-1/2 code as read (new_systems.md §1 Bytes): the running sum goes back up every "
    "step to be accumulated on the GPU and the window's gradient comes down again as fp32, 5 B per element "
    "per step with u = 4 against ZeRO-Offload's 4 (reached 1.25x more, not 2x less); the host-side "
    "accumulation the paper describes is not a path DeepSpeed's code takes"))
def test_headline_pcie_traffic_halved(headline: tuple[RunResult, RunResult]) -> None:
    zo, zf = headline
    pcie = lambda r: r.metrics.traffic_bytes.h2d + r.metrics.traffic_bytes.d2h  # noqa: E731
    assert pcie(zo) / pcie(zf) >= 2.0 / 1.5


# ------------------------------------------------------------------ CLI: compare and sweep
runner = CliRunner()


def test_in_compare_strategies(tmp_path: Path) -> None:
    csv = tmp_path / "s.csv"
    result = runner.invoke(app, ["compare", "-H", "tiny", "-w", "tiny", "--strategies", "zero-offload,zenflow",
                                 "--iterations", "6", "--csv", str(csv), "--html", str(tmp_path / "s.html")])
    assert result.exit_code == 0, result.output
    table = pd.read_csv(csv)
    assert list(table["variant"]) == ["zero-offload", "zenflow"] and table["feasible"].all()


def test_in_a_sweep(tmp_path: Path) -> None:
    grid = tmp_path / "zf.yaml"
    grid.write_text("schema_version: 1\nname: zf\ndescription: zenflow against zero-offload\n"
                    "base: {hardware: tiny, workload: tiny, strategy: zenflow, iterations: 6, warmup_iterations: 2}\n"
                    "grid:\n  pcie_gen: [3, 4]\n  strategy: [zero-offload, zenflow]\n")
    result = runner.invoke(app, ["sweep", str(grid), "--workers", "1", "--json"])
    assert result.exit_code == 0, result.output
    points = json.loads(result.output)["points"]
    assert len(points) == 4 and all(p["status"] == "ok" and p["feasible"] for p in points)
    time = {(p["pcie_gen"], p["strategy"]): p["iteration_time_s"] for p in points}
    assert all(time[(gen, "zenflow")] < time[(gen, "zero-offload")] for gen in (3, 4))
