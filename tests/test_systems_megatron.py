"""Megatron-Core CPU offload (``system: megatron-offload``, ``offsim/systems/megatron_offload.py``):
the HybridDeviceOptimizer step by hand on the tiny machine, the fraction's invariants, the memory
of each share, activation offload of the first blocks, the sweep over the fraction, and the
headline against the same run without offload on two nodes of the H100 profile."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs
from typer.testing import CliRunner

from offsim import load_profile, load_strategy, load_workload, make_run_config, simulate
from offsim.cli import app
from offsim.errors import ConfigError
from offsim.plan.cpu_adam import ADAM_DRAM_EFFICIENCY
from offsim.plan.footprint import state_sizes
from offsim.results import RunResult
from offsim.systems import megatron_offload as mo
from offsim.systems._parts import build_ctx

GB = 1e9
UNIT = 2**22  # elements of one optimizer tensor in the hand-computed tests


def strategy(**options: object) -> object:
    """The shipped strategy with ``options`` (system_options) replacing its own."""
    st = load_strategy("megatron-offload")
    return st.model_copy(update={"system_options": {**st.system_options, **options}})


def run(hardware: object, workload: object, st: object) -> RunResult:
    r = simulate(make_run_config(hardware, workload, st))
    assert r.metrics.feasible, r.metrics.infeasible_reason
    return r


def tiny_params() -> int:
    return state_sizes(make_run_config("tiny", "tiny", strategy())).params_total


# ---------------------------------------------------------------- the step by hand (tiny: round rates)
def test_serial_step_is_d2h_then_adamw_then_cast_and_pageable_h2d() -> None:
    """f = 1, no overlap, on ``tiny`` (pinned D2H 1 GB/s, pageable H2D 0.5 GB/s, memcpy 10 GB/s,
    DRAM 100 GB/s; no GPU share). Everything in series, per fp32 element: the gradient D2H
    4 B / 1 GB/s, torch AdamW 28 B / (100 GB/s x 0.548) (DRAM-bound at the efficiency every torch
    CPU step is priced at, ``offsim.plan.torch_cpu``; 4 threads x 25 GB/s do not bind), the cast
    6 B / 10 GB/s (memcpy), the bf16 H2D 2 B / 0.5 GB/s: 9.11 ns per element."""
    p = tiny_params()
    r = run("tiny", "tiny", strategy(optimizer_offload_fraction=1.0, overlap_cpu_optimizer_d2h_h2d=False,
                                     tensor_params=UNIT))
    per_element_s = 4 / GB + 28 / (100 * GB * ADAM_DRAM_EFFICIENCY) + 6 / (10 * GB) + 2 / (0.5 * GB)
    assert r.metrics.phases_s.optimizer == pytest.approx(p * per_element_s, rel=1e-9)
    t = r.metrics.traffic_bytes
    assert (t.d2h, t.h2d, t.dram_copy) == (4 * p, 2 * p, 6 * p)


def test_overlap_hides_all_but_the_first_tensors_d2h() -> None:
    """With ``overlap_cpu_optimizer_d2h_h2d`` the D2H of tensor i+1 runs during the host's work on
    tensor i (5.11 ns per element, longer than the D2H's 4 ns), so the step is the first tensor's
    D2H plus the host's work on all. rel 1e-3: the concurrent D2H takes 1 of the 100 GB/s of DRAM
    from AdamW while they overlap (at most 1% of AdamW's 0.51 of 5.11 ns)."""
    p = tiny_params()
    r = run("tiny", "tiny", strategy(optimizer_offload_fraction=1.0, overlap_cpu_optimizer_d2h_h2d=True,
                                     tensor_params=UNIT))
    host_s = 28 / (100 * GB * ADAM_DRAM_EFFICIENCY) + 6 / (10 * GB) + 2 / (0.5 * GB)
    assert r.metrics.phases_s.optimizer == pytest.approx(UNIT * 4 / GB + p * host_s, rel=1e-3)


def test_the_fraction_is_rounded_up_to_whole_tensors() -> None:
    """``_get_sub_optimizer_param_groups`` moves whole tensors until the threshold is reached."""
    cfg = make_run_config("tiny", "tiny", strategy())
    c = build_ctx(cfg)
    local = c.sz.local_params
    opts = mo.Options(optimizer_offload_fraction=0.3, tensor_params=UNIT)
    assert mo.cpu_share_params(c, opts) == pytest.approx(-(-0.3 * local // UNIT) * UNIT)
    assert mo.cpu_share_params(c, mo.Options(optimizer_offload_fraction=1.0, tensor_params=UNIT)) == local
    assert mo.cpu_share_params(c, mo.Options(optimizer_offload_fraction=0.0)) == 0.0
    tensors = mo.cpu_tensors(c, opts)
    assert sum(t.params for t in tensors) == pytest.approx(mo.cpu_share_params(c, opts))
    assert all(t.params == UNIT for t in tensors)


def test_memory_of_each_share_per_element() -> None:
    """Per element moved to the CPU (new_systems.md §2a): the GPU frees 12 B (fp32 master and two
    moments); host memory gains 8 B pinned (master, gradient copy) and 8 B pageable (moments)."""
    p = tiny_params()
    on_gpu = run("tiny", "tiny", strategy(optimizer_offload_fraction=0.0)).metrics.peak_bytes
    on_cpu = run("tiny", "tiny", strategy(optimizer_offload_fraction=1.0)).metrics.peak_bytes
    assert on_gpu.gpu - on_cpu.gpu == pytest.approx(12 * p, abs=1)
    assert on_cpu.host_pinned - on_gpu.host_pinned == pytest.approx(8 * p, abs=1)
    staging = 2 * UNIT  # one tensor's pageable bf16 cast at a time (the default tensor is 1024 x 4096)
    assert on_cpu.host - on_cpu.host_pinned == pytest.approx(8 * p + staging, abs=1)


def test_unpinned_copies_move_to_pageable_memory() -> None:
    """``--no-pin-cpu-grads --no-pin-cpu-params``: the 8 B/element leave pinned memory."""
    r = run("tiny", "tiny", strategy(pin_cpu_grads=False, pin_cpu_params=False))
    assert r.metrics.peak_bytes.host_pinned == 0


@settings(max_examples=12, deadline=None)
@given(a=hs.floats(0.0, 1.0), b=hs.floats(0.0, 1.0), overlap=hs.booleans())
def test_more_on_the_cpu_is_never_faster_and_never_holds_more_gpu_memory(a: float, b: float, overlap: bool) -> None:
    """Monotone in the fraction, with or without the overlap (the curve users tune by)."""
    lo, hi = sorted((a, b))
    ml = run("tiny", "tiny", strategy(optimizer_offload_fraction=lo, overlap_cpu_optimizer_d2h_h2d=overlap)).metrics
    mh = run("tiny", "tiny", strategy(optimizer_offload_fraction=hi, overlap_cpu_optimizer_d2h_h2d=overlap)).metrics
    assert mh.iteration_time_s >= ml.iteration_time_s * (1 - 1e-12)
    assert mh.peak_bytes.gpu <= ml.peak_bytes.gpu


# ---------------------------------------------------------------- activation offload
def test_first_blocks_activations_go_to_host_and_back() -> None:
    """``cpu_offloading_num_layers`` 2 on tiny (no checkpointing): the first two blocks' saved
    activations go D2H in forward and H2D in backward; the optimizer's traffic is unchanged."""
    base = run("tiny", "tiny", strategy()).metrics
    off = run("tiny", "tiny", strategy(activation_offload_layers=2)).metrics
    cfg = make_run_config("tiny", "tiny", strategy())
    blocks = [lay for lay in state_sizes(cfg).layers if lay.is_block][:2]
    kept = sum(round(lay.kept_bytes(False)) for lay in blocks)
    assert off.traffic_bytes.d2h - base.traffic_bytes.d2h == kept
    assert off.traffic_bytes.h2d - base.traffic_bytes.h2d == kept
    assert off.peak_bytes.gpu < base.peak_bytes.gpu


def test_more_offloaded_layers_than_blocks_or_with_recompute_is_refused() -> None:
    with pytest.raises(ConfigError, match="activation_offload_layers 9 is more than the 4 transformer blocks"):
        simulate(make_run_config("tiny", "tiny", strategy(activation_offload_layers=9)))
    recompute = strategy(activation_offload_layers=1).model_copy(update={"activation_checkpointing": True})
    with pytest.raises(ConfigError, match="Megatron refuses CPU offloading with recomputation"):
        simulate(make_run_config("tiny", "tiny", recompute))


def test_a_misspelt_option_names_the_system_and_field() -> None:
    st = strategy(offload_fraction=0.5)
    with pytest.raises(ConfigError, match=r"system 'megatron-offload'.*offload_fraction"):
        simulate(make_run_config("tiny", "tiny", st))


# ---------------------------------------------------------------- sweep over the fraction
def test_sweep_over_the_fraction(tmp_path) -> None:
    """``offsim sweep`` takes the fraction as a dotted axis under system_options."""
    spec = tmp_path / "fraction.yaml"
    spec.write_text("schema_version: 1\nname: megatron-fraction\n"
                    "base: {hardware: tiny, workload: tiny, strategy: megatron-offload}\n"
                    "grid:\n  strategy.system_options.optimizer_offload_fraction: [0.0, 0.5, 1.0]\n")
    out = CliRunner().invoke(app, ["sweep", str(spec), "--workers", "1", "--json"])
    assert out.exit_code == 0, out.output
    points = sorted(json.loads(out.stdout)["points"],
                    key=lambda p: p["strategy.system_options.optimizer_offload_fraction"])
    times = [p["iteration_time_s"] for p in points]
    assert len(points) == 3 and times == sorted(times) and times[0] < times[-1]


def test_compare_runs_it_beside_its_baseline() -> None:
    """``offsim compare --strategies``: the system beside the no-offload baseline."""
    out = CliRunner().invoke(app, ["compare", "-H", "tiny", "-w", "tiny", "--strategies", "megatron-offload,gpu-only",
                                   "--quiet"])
    assert out.exit_code == 0, out.output
    assert "`gpu-only` is fastest" in out.output and "faster than `megatron-offload`" in out.output


# ---------------------------------------------------------------- the headline
def two_h100_nodes() -> object:
    """The Megatron-Bridge testbed, two H100 nodes: the shipped DGX-H100-class profile with
    ``nodes: 2`` (its per-node figures unchanged)."""
    hw = load_profile("h100-sxm5-gen5")
    return hw.model_copy(update={"topology": hw.topology.model_copy(update={"nodes": 2})})


def qwen3_on_16_gpus() -> object:
    """Qwen3-30B-A3B on 16 GPUs. The published run is TP2 PP2 EP4; offsim models neither pipeline
    nor expert parallelism, so the stand-in splits every block 8 ways (tensor_parallel 8, about the
    same ~3.8e9 parameters per GPU as TP2 x PP2 x EP4) with the distributed optimizer over
    data_parallel 2. Batch: the workload's own (one 4096-token micro-batch per rank)."""
    wl = load_workload("qwen3-30b-a3b")
    return wl.model_copy(update={"training": wl.training.model_copy(update={"tensor_parallel": 8,
                                                                           "data_parallel": 2})})


#: Megatron-Bridge docs/training/cpu-offloading.md (NVIDIA-NeMo/Megatron-Bridge @ 067f987df0; new_systems.md
#: §2 "Headline"): optimizer offload makes a step 1.9x to 4.2x slower than the same run without it,
#: linearly in the fraction, and saves GPU memory linearly in it (Qwen3-30B-A3B, two H100 nodes).
PUBLISHED_SLOWDOWN = (1.9, 4.2)
#: Tolerance: a factor of 2 around the largest published slowdown, which belongs to the largest
#: fraction ("linearly in the fraction"; the fractions and batch of the published runs are not in
#: the headline, their per-fraction tables are reserved for independent checking, and the slowdown
#: scales with forward/backward time per step). This stand-in reaches 5.09x at f = 1 (1.21x above 4.2).
FACTOR = 2.0


def test_headline_slowdown_and_memory_over_the_fraction() -> None:
    hw, wl = two_h100_nodes(), qwen3_on_16_gpus()
    fractions = (0.0, 0.25, 0.5, 0.75, 1.0)
    ms = [run(hw, wl, strategy(optimizer_offload_fraction=f)).metrics for f in fractions]
    times, gpu = [m.iteration_time_s for m in ms], [m.peak_bytes.gpu for m in ms]
    assert times == sorted(times) and gpu == sorted(gpu, reverse=True)
    slowdown = times[-1] / times[0]
    largest = PUBLISHED_SLOWDOWN[1]
    assert largest / FACTOR <= slowdown <= largest * FACTOR, slowdown
    saved = [gpu[0] - g for g in gpu]
    extra = [t - times[0] for t in times]
    for f, s, e in zip(fractions, saved, extra, strict=True):  # "linearly in the fraction"
        assert s == pytest.approx(f * saved[-1], rel=0.02, abs=2**30 * 0.01)
        assert e == pytest.approx(f * extra[-1], rel=0.05, abs=1e-3)
