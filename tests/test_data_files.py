"""Every shipped data file loads, and every profile x a few workloads x every preset either
simulates or reports infeasible with a reason (never a crash, never a silent result)."""

from __future__ import annotations

import math

import pytest

from offsim import load_profile, load_strategy, load_workload, make_run_config, simulate
from offsim.config.loading import shipped_files
from offsim.errors import ConfigError

PROFILES = sorted(shipped_files("hardware"))
WORKLOADS = sorted(shipped_files("workload"))
STRATEGIES = sorted(shipped_files("strategy"))
SAMPLE_WORKLOADS = ["tiny", "llama2-7b", "gpt3-13b"]


@pytest.mark.parametrize("name", PROFILES)
def test_profile_loads_with_provenance(name: str) -> None:
    p = load_profile(name)
    assert p.name == name
    assert p.provenance.source.strip()


@pytest.mark.parametrize("name", WORKLOADS)
def test_workload_loads(name: str) -> None:
    assert load_workload(name).model.total_params > 0


@pytest.mark.parametrize("name", STRATEGIES)
def test_strategy_loads(name: str) -> None:
    assert load_strategy(name).provenance.source.strip()


def test_at_least_eight_real_profiles_and_workloads() -> None:
    real = [p for p in PROFILES if load_profile(p).provenance.kind != "synthetic"]
    assert len(real) >= 8, real
    assert len([w for w in WORKLOADS if w != "tiny"]) >= 8


@pytest.mark.parametrize("profile", PROFILES)
def test_every_preset_runs_or_is_infeasible(profile: str) -> None:
    for workload in SAMPLE_WORKLOADS:
        for strategy in STRATEGIES:
            try:
                cfg = make_run_config(profile, workload, strategy)
            except ConfigError as exc:  # e.g. an nvme placement on a machine without NVMe
                assert "nvme" in str(exc) or "data_parallel" in str(exc), str(exc)
                continue
            m = simulate(cfg).metrics
            if m.feasible:
                assert m.iteration_time_s > 0 and math.isfinite(m.iteration_time_s), (profile, workload, strategy)
                assert m.tokens_per_s > 0
            else:
                assert m.infeasible_reason and m.infeasible_tier in ("gpu", "host_pinned", "host", "nvme")
