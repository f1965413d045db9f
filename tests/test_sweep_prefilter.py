"""The pre-filter: the schedule's time bound never exceeds the simulated time, and a point it
marks infeasible is infeasible in the simulator."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import offsim.simulation as sim
import offsim.systems._compile as compile_module
from offsim.api import simulate
from offsim.core.enums import Res
from offsim.fit_check import footprint
from offsim.schedule.bound import GPU_COMPUTE, RES_NAMES
from offsim.sweep import evaluate
from offsim.sweep.evaluate import Payload, _result_columns, evaluate_point
from offsim.sweep.overrides import OverrideError, apply_overrides, build_run_config
from offsim.sweep.prefilter import Frontier, time_lower_bound
from offsim.sweep.spec import make_plan

STRATEGIES = [
    "gpu-only",
    "zero-offload",
    "zero-offload-dpu",
    "zero-infinity-cpu",
    "zero-infinity-nvme",
    "fuyou",
    "lsp-offload",
    "memascend",
    "superoffload",
    "tba-ssdtrain",
]
AXES = {
    "strategy": STRATEGIES,
    "dram_gib": [1, 4, 64],
    "nvme_drives": [1, 3],
    "pcie_gen": [3, 5],
    "micro_batch": [1, 2],
    "grad_accumulation": [1, 2],
    "seq_len": [128, 512],
    "prefetch_depth": [0, 2],
    "strategy.placement.activations": ["gpu", "cpu", "nvme"],
    "workload.training.activation_checkpointing": [True, False],
    "hardware.gpu.memory_gib": [1.0, 16.0],
    "dram_cache_gib": [0.0, 0.3, 1.5],
    "strategy.sub_group_params": [1e7, 1e9],
    "policy": ["reuse-distance", "lru", "belady"],
    "activation_policy": ["placement", "keep", "recompute", "offload-cpu", "auto-swap"],
}
PLAN = make_plan("tiny", "tiny", "zero-offload", grid={"strategy": STRATEGIES})  # resolves the strategy files

point = st.fixed_dictionaries({k: st.sampled_from(v) for k, v in AXES.items()})


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(point)
def test_bound_is_below_the_simulated_time_and_infeasible_agrees(overrides):
    try:
        cfg = build_run_config(apply_overrides(PLAN.base, overrides, PLAN.library), overrides)
    except OverrideError:
        return  # a combination the models refuse (e.g. gpu-only with activations on the CPU)
    result = simulate(cfg)
    cfg = result.config  # the resolved configuration (auto-swap's amount chosen)
    if footprint(cfg).first_overflow() is not None:
        assert not result.feasible
        return
    if not result.feasible:  # the engine's ledger can find an overflow the planner's estimate misses
        return
    bound = time_lower_bound(cfg)
    assert bound.seconds <= result.metrics.iteration_time_s * (1 + 1e-9), (
        bound,
        result.metrics.iteration_time_s,
    )


def test_bound_is_tight_when_only_compute_runs():
    ov = {"strategy": "gpu-only"}
    cfg = build_run_config(apply_overrides(PLAN.base, ov, PLAN.library), ov)
    bound = time_lower_bound(cfg)
    assert bound.binding == GPU_COMPUTE
    assert abs(bound.seconds - simulate(cfg).metrics.iteration_time_s) < 1e-9


def test_nvme_bound_halves_with_twice_the_drives():
    times = []
    for drives in (1, 2):
        ov = {"strategy": "zero-infinity-nvme", "nvme_drives": drives}
        times.append(
            time_lower_bound(build_run_config(apply_overrides(PLAN.base, ov, PLAN.library), ov)).terms_s[
                RES_NAMES[Res.NVME]
            ]
        )
    assert abs(times[1] - times[0] / 2) < 1e-12


def test_frontier_finds_a_cheaper_faster_point():
    rows = [
        {"status": "ok", "usd_per_hour": 1.0, "tokens_per_s": 100.0, "workload_id": "w", "point_id": "a"},
        {"status": "ok", "usd_per_hour": 2.0, "tokens_per_s": 300.0, "workload_id": "w", "point_id": "b"},
        {"status": "ok", "usd_per_hour": 3.0, "tokens_per_s": 200.0, "workload_id": "w", "point_id": "c"},
        {
            "status": "infeasible",
            "usd_per_hour": 0.5,
            "tokens_per_s": None,
            "workload_id": "w",
            "point_id": "d",
        },
    ]
    f = Frontier.from_rows(rows)
    assert f.dominated_by("w", 0.9, 1.0) is None  # nothing as cheap
    assert f.dominated_by("w", 1.5, 90.0) == "a"
    assert f.dominated_by("w", 1.5, 150.0) is None  # it might beat a
    assert f.dominated_by("w", 3.5, 250.0) == "b"
    assert f.dominated_by("other", 3.5, 1.0) is None  # another workload is not comparable
    assert len(f) == 2  # c never improves on b: only the staircase corners are kept


def _evaluated_rows(overrides_list):
    payload = Payload.from_plan(PLAN, prefilter=True)
    return [evaluate_point(payload, i, f"p{i}", ov) for i, ov in enumerate(overrides_list)]


#: points of every kind: fits, does not fit (DRAM 1 GiB under CPU offload), auto-swap's search
SHARED_POINTS = [
    {"strategy": s, "dram_gib": dram, "activation_policy": act}
    for s in ("zero-offload", "zero-infinity-nvme", "fuyou")
    for dram in (1, 64)
    for act in ("placement", "auto-swap")
]


def test_a_swept_point_is_composed_and_compiled_once(monkeypatch):
    """Issue 16: the pre-filter's compiled schedule is the one simulated (one compile a point that
    fits, none for one that does not), and the row is the one a fresh composition gives."""
    calls: list[int] = []
    real = compile_module.compile_system

    def counting(system):
        calls.append(1)
        return real(system)

    expected = []
    for ov in SHARED_POINTS:
        cfg = build_run_config(apply_overrides(PLAN.base, ov, PLAN.library), ov)
        expected.append(_result_columns(simulate(cfg)))
    for module in (compile_module, sim, evaluate):  # every name it is bound to
        monkeypatch.setattr(module, "compile_system", counting, raising=False)
    rows = _evaluated_rows(SHARED_POINTS)
    assert {r["status"] for r in rows} == {"ok", "infeasible"}
    assert len(calls) == sum(r["prefilter"] == "passed" for r in rows)
    for row, want in zip(rows, expected, strict=True):
        assert {k: row.get(k) for k in want} == want, row["strategy"]
