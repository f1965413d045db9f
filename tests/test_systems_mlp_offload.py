"""MLP-Offload (Maurya et al., SC 2025, arXiv 2509.02480): optimizer state striped over node-local
NVMe and a parallel file system, one transfer per path per rank, alternating sub-group order over a
DRAM cache, 16-bit gradients converted to fp32 at update time. Mechanism tests on the
polaris-a100-grand profile, then the headline against zero-infinity-nvme (citation beside it)."""

from __future__ import annotations

import math

import pytest

from offsim import load_profile, load_strategy, load_workload, make_run_config, simulate
from offsim.errors import ConfigError
from offsim.plan.footprint import deepspeed_sub_groups, param_partitions, state_sizes
from offsim.results import RunResult
from offsim.systems.mlp_offload import pfs_share_of_ratio

HW = "polaris-a100-grand"
OPT_IO = ("optimizer_swap_in", "optimizer_swap_out")


def variant(name: str, **training) -> object:
    wl = load_workload(name)
    return wl.model_copy(update={"training": wl.training.model_copy(update=training)})


def run(hardware, workload, strategy) -> RunResult:
    r = simulate(make_run_config(hardware, workload, strategy))
    assert r.metrics.feasible, r.metrics.infeasible_reason
    return r


def io_bound(**update) -> object:
    """ZeRO-Infinity optimizer on NVMe, params on the GPU, reads/writes pipelined with the update:
    the CPU step is bound by storage I/O on this profile. Under the mlp-offload system, whose
    options (striping, the I/O cap) are off unless ``update`` sets them."""
    st = load_strategy("zero-infinity-nvme")
    base = {"placement": st.placement.model_copy(update={"params": "gpu", "grads": "cpu"}), "system": "mlp-offload",
            "optimizer_swap_pipeline": True, "sub_group_params": 2.5e8}
    return st.model_copy(update={**base, **update})


def opt_spans(r: RunResult, resources: tuple[str, ...]) -> list:
    return [s for s in r.recorder.spans if s.kind in OPT_IO and s.resource in resources]


WL_SMALL = variant("llama2-7b", seq_len=2048)


def test_pfs_share_zero_equals_plain_nvme() -> None:
    """No PFS share and no cap: the PFS block and the new fields change nothing."""
    with_pfs = run(HW, WL_SMALL, io_bound(pfs_share=0.0))
    no_pfs_hw = load_profile(HW).model_copy(update={"pfs": None})
    plain = run(no_pfs_hw, WL_SMALL, io_bound())
    assert with_pfs.metrics.iteration_time_s == plain.metrics.iteration_time_s
    assert with_pfs.metrics.traffic_bytes == plain.metrics.traffic_bytes
    assert not opt_spans(with_pfs, ("pfs_read", "pfs_write"))


def test_striping_shortens_an_io_bound_step_by_the_added_bandwidth() -> None:
    """A share s of each transfer on the PFS: the step's I/O time shrinks toward
    1 / (1 + B_pfs / B_nvme) when s matches the paths' rates (both paths at once)."""
    hw = load_profile(HW)
    nv, pfs = hw.nvme, hw.pfs
    b_nvme = 1 / (1 / nv.read_bytes_per_s + 1 / nv.write_bytes_per_s)  # reads and writes share the array
    b_pfs = 1 / (1 / pfs.read_bytes_per_s + 1 / pfs.write_bytes_per_s)
    share = b_pfs / (b_pfs + b_nvme)
    one = run(HW, WL_SMALL, io_bound()).metrics
    two = run(HW, WL_SMALL, io_bound(pfs_share=share)).metrics
    assert one.traffic_bytes.nvme_read > 0
    assert two.traffic_bytes.nvme_read == pytest.approx(one.traffic_bytes.nvme_read * (1 - share), rel=1e-6)
    ideal = (b_nvme + b_pfs) / b_nvme
    speedup = one.phases_s.optimizer / two.phases_s.optimizer
    assert 0.75 * ideal <= speedup <= 1.05 * ideal


@pytest.mark.parametrize("cap", [1, 2])
def test_io_concurrency_cap_is_respected(cap: int) -> None:
    """At most ``io_concurrency`` optimizer-state transfers in flight per path per rank."""
    r = run(HW, WL_SMALL, io_bound(pfs_share=0.3, io_concurrency=cap))
    for path in (("nvme_read", "nvme_write"), ("pfs_read", "pfs_write")):
        spans = opt_spans(r, path)
        assert spans
        events = sorted([(s.start_s, 1) for s in spans] + [(s.end_s, -1) for s in spans])
        level = peak = 0
        for _, d in events:
            level += d
            peak = max(peak, level)
        assert peak <= cap


def test_uncapped_pipeline_overlaps_reads_and_writes() -> None:
    """Without the cap the pipelined swap has reads and writes in flight together (the cap bites)."""
    r = run(HW, WL_SMALL, io_bound())
    reads = opt_spans(r, ("nvme_read",))
    writes = opt_spans(r, ("nvme_write",))
    assert any(w.start_s < rd.end_s and rd.start_s < w.end_s for w in writes for rd in reads)


def test_delayed_grad_conversion_halves_grad_bytes_on_storage() -> None:
    """16-bit gradients stored instead of fp32: half the gradient bytes written to NVMe."""
    st = load_strategy("zero-infinity-nvme")
    fp32 = run(HW, WL_SMALL, st).recorder.spans
    delayed = st.model_copy(update={"delayed_grad_conversion": True, "system": "mlp-offload"})
    bf16 = run(HW, WL_SMALL, delayed).recorder.spans

    def grad_bytes(spans: list) -> float:
        return sum(s.bytes for s in spans if s.kind == "grad_offload" and s.resource == "nvme_write")

    assert grad_bytes(fp32) > 0
    assert grad_bytes(bf16) == pytest.approx(grad_bytes(fp32) / 2, rel=1e-9)


def artifact_70b() -> object:
    """The artifact's 70B (launch-expt.sh set_model_size 70 on the dos-7b Megatron-DeepSpeed line:
    80 x 8192, FFN 28672, 64 heads, vocabulary 50304; 68.6e9 parameters in offsim's count) at dp 4.
    Not Llama-2 70B (68.98e9): with MLP-Offload's 16-bit gradients in ONE pinned flat tensor
    (DataStates/DeepSpeed dist_nvme_opt stage3.py _setup_for_real_optimizer) its 17.24e9 x 2 B =
    32.12 GiB per rank rounds up to 64 GiB and, with its 32.12 GiB pageable source, the shipped
    strategy's 35.8 GiB DRAM cache and the parameter swap buffers, needs 541.7 GiB per node against
    460.8 usable; the artifact's 31.95 GiB rounds to 32 GiB (the logs' node grows by 4 x 36.5 GiB
    at that call)."""
    wl = load_workload("dos-7b")
    d = wl.model_dump()
    d["model"].update(layers=80, hidden=8192, ffn_hidden=28672, heads=64)
    d["training"]["data_parallel"] = 4
    return type(wl).model_validate(d)


WL_70B = artifact_70b()
#: The baseline as the artifact's scripts run it: DeepSpeed ZeRO-3 with the optimizer on NVMe and
#: sub_group_size 1e8 (scripts/config-n-run.sh sets it for every run). With DeepSpeed's default
#: 1e9 the 4 ranks' host buffers (64 GiB pinned 16-bit gradients each, rounded up, plus the
#: pageable copy made while pinning) exceed the node's 460.8 GiB usable DRAM in offsim.
BASELINE_70B = load_strategy("zero-infinity-nvme").model_copy(update={"sub_group_params": 1e8})


def test_mlp_offload_is_faster_than_zero_infinity_nvme() -> None:
    """Direction of the headline on a Polaris node with Grand: fewer NVMe bytes, shorter step."""
    zi = run(HW, WL_70B, BASELINE_70B).metrics
    mlp = run(HW, WL_70B, "mlp-offload").metrics
    assert mlp.traffic_bytes.nvme_read < zi.traffic_bytes.nvme_read
    assert mlp.iteration_time_s < zi.iteration_time_s


def test_mlp_offload_headline_speedup() -> None:
    """MLP-Offload (arXiv 2509.02480) abstract: 2.5x faster iterations than state-of-the-art
    runtimes (DeepSpeed ZeRO-3, optimizer on NVMe), models up to 280B; the artifact's 70B logs
    show 370 s vs 151 s per iteration (2.45x). Generous range: 1.5x to 4x."""
    zi = run(HW, WL_70B, BASELINE_70B).metrics
    mlp = run(HW, WL_70B, "mlp-offload").metrics
    assert 1.5 <= zi.iteration_time_s / mlp.iteration_time_s <= 4.0


def test_state_on_the_pfs_is_accounted_there_not_on_nvme() -> None:
    """A share s of the optimizer state lives on the PFS: the PFS tier holds s x state bytes (per
    rank x ranks per node x nodes), NVMe holds (1 - s) of it, and the PFS traffic appears in the
    metrics. Bytes hand-derived from the state sizes."""

    share = 0.25
    striped = run(HW, WL_SMALL, io_bound(pfs_share=share))
    nvme_only = run(HW, WL_SMALL, io_bound(pfs_share=0.0))
    sz = state_sizes(make_run_config(HW, WL_SMALL, io_bound(pfs_share=share)))
    state_node = sz.local_params * sz.optimizer_bytes_per_param * sz.ranks_per_node
    assert striped.metrics.peak_bytes.pfs == pytest.approx(share * state_node, rel=1e-9)
    assert nvme_only.metrics.peak_bytes.pfs == 0.0
    assert nvme_only.metrics.peak_bytes.nvme - striped.metrics.peak_bytes.nvme == pytest.approx(
        share * state_node, rel=1e-6)
    t = striped.metrics.traffic_bytes
    assert t.pfs_read > 0 and t.pfs_write > 0
    assert t.pfs_write == pytest.approx(share / (1 - share) * t.nvme_write, rel=0.02)


def test_pfs_quota_too_small_is_infeasible_with_the_tier() -> None:
    hw = load_profile(HW)
    tiny_quota = hw.model_copy(update={"pfs": hw.pfs.model_copy(update={"capacity_tb": 0.001})})
    r = simulate(make_run_config(tiny_quota, WL_SMALL, io_bound(pfs_share=0.5)))
    assert not r.metrics.feasible
    assert "pfs" in r.metrics.infeasible_reason


def test_views_show_the_pfs() -> None:
    """The trace has PFS read/write tracks and a PFS memory counter; the memory and link figures
    draw the PFS; a run without a PFS gets no empty PFS counter."""
    from offsim.report.chrome_trace import chrome_trace
    from offsim.report.figures import link_figure, memory_figure

    r = run(HW, WL_SMALL, io_bound(pfs_share=0.25))
    events = chrome_trace(r)["traceEvents"]
    threads = {e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "thread_name"}
    counters = {e["name"] for e in events if e.get("ph") == "C"}
    assert {"Parallel FS read", "Parallel FS write"} <= threads
    assert "Parallel file system (job), GiB" in counters
    assert "pfs" in {t.name for t in memory_figure(r).data}
    assert any("Parallel FS" in (t.name or "") for t in link_figure(r).data)
    plain = chrome_trace(run(HW, WL_SMALL, io_bound(pfs_share=0.0)))["traceEvents"]
    assert not [e for e in plain if e.get("ph") == "C" and "Parallel" in e["name"]]


# ---------------------------------------------------------------- the artifact's PFS rule
def test_pfs_share_of_ratio_by_hand() -> None:
    """Sub-group i on the PFS iff i % r == 0 (DataStates/DeepSpeed dist_nvme_opt, stage3.py
    _get_opt_swapper_id): groups of 10, 20, 30, 40, 50 elements; r 3 puts groups 0 and 3 there,
    (10 + 40) / 150; r 2 groups 0, 2, 4, (10 + 30 + 50) / 150; r 1 all of them."""
    groups = [10, 20, 30, 40, 50]
    assert pfs_share_of_ratio(groups, 3) == pytest.approx(50 / 150)
    assert pfs_share_of_ratio(groups, 2) == pytest.approx(90 / 150)
    assert pfs_share_of_ratio(groups, 1) == 1.0


def test_dist_opt_ratio_runs_as_its_share_set_by_hand() -> None:
    """system_options dist_opt_ratio 3 runs exactly as pfs_share set to the share of this rank's
    DeepSpeed sub-groups (sub_group_size 2.5e8) that the rule sends to the PFS, which is about a
    third of them by count."""
    by_rule = io_bound(system_options={"dist_opt_ratio": 3})
    cfg = make_run_config(HW, WL_SMALL, by_rule)
    groups = deepspeed_sub_groups(param_partitions(cfg, state_sizes(cfg)), 2.5e8)
    share = pfs_share_of_ratio(groups, 3)
    assert len(groups[::3]) == math.ceil(len(groups) / 3) and 0.15 < share < 0.5
    a, b = run(HW, WL_SMALL, by_rule).metrics, run(HW, WL_SMALL, io_bound(pfs_share=share)).metrics
    assert a.iteration_time_s == pytest.approx(b.iteration_time_s)
    assert a.traffic_bytes == b.traffic_bytes
    assert a.peak_bytes.pfs == pytest.approx(b.peak_bytes.pfs) and a.peak_bytes.pfs > 0


def test_dist_opt_ratio_below_one_or_beside_a_hand_set_share_is_refused() -> None:
    with pytest.raises(ConfigError, match="dist_opt_ratio"):
        simulate(make_run_config(HW, WL_SMALL, io_bound(system_options={"dist_opt_ratio": 0})))
    with pytest.raises(ConfigError, match="both set the PFS share"):
        simulate(make_run_config(HW, WL_SMALL, io_bound(pfs_share=0.3, system_options={"dist_opt_ratio": 3})))


@pytest.mark.xfail(strict=True, reason=(
    "MLP-Offload sizes each path's share of the optimizer-state I/O with its own I/O performance model "
    "(arXiv 2509.02480; the artifact's README: 'complemented through an I/O performance model'), but that "
    "model was not readable here: only the paper's abstract is stored. What runs is the artifact's rule "
    "(system_options dist_opt_ratio: sub-group i on the PFS iff i % r == 0, DataStates/DeepSpeed "
    "dist_nvme_opt stage3.py _get_opt_swapper_id) with r set by hand (3 in the artifact's "
    "scripts/launch-expt.sh, which the shipped strategies/mlp-offload.yaml sets), or a hand-set pfs_share; how the "
    "paper's model would choose the share from the tiers' rates is missing"))
def test_mlp_offload_offers_its_papers_io_model_for_the_pfs_share() -> None:
    """Once the model is read, ``mlp_offload`` offers it as a system option beside the hand-set
    ``dist_opt_ratio`` and ``pfs_share``, with a hand-computed test of the share it picks."""
    from offsim.systems import mlp_offload

    assert "io_model" in mlp_offload.Options.model_fields
