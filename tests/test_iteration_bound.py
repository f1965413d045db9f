"""The lower bound on the iteration time of :mod:`offsim.iteration_bound`, on engine runs.

Hand-checkable: where no eviction choice exists, the caches' terms are the run's own traffic over
the peak rates. The issue's commands (in ``tests/test_policy_bounds_engine.py``) check that the
bound is the same for every policy, and the policies never run below it.
"""

from __future__ import annotations

import pytest

from offsim.compare import policy_variants, run_variants
from offsim.config.loading import load_profile, load_strategy
from offsim.core.enums import Res
from offsim.iteration_bound import iteration_lower_bound
from offsim.plan.footprint import state_sizes
from offsim.plan.time_bound import time_lower_bound
from offsim.schedule.bound import RES_NAMES


@pytest.mark.parametrize("policy", ["lru", "mru"])
def test_with_no_choice_the_cache_terms_are_the_runs_own_traffic(policy: str) -> None:
    """zero-infinity-nvme on tiny with an unbounded GPU buffer and no DRAM cache: every layer is
    fetched once per iteration and every sub-group read and written once, whatever the policy.
    The NVMe term is then n x (read bytes / read rate + write bytes / write rate) of the run
    itself, and the H2D term its H2D bytes over the peak of the pinned and pageable rates. The
    bound is the largest term: the GPU stream's chain through the step, which waits for each
    sub-group's NVMe round trip in turn (4.03 s against the array's 3.62 s when written)."""
    (_, st), = policy_variants(load_strategy("zero-infinity-nvme"), policy, None, None)
    table, (result,) = run_variants("tiny", "tiny", [(policy, st)])
    b = iteration_lower_bound(result)
    hw, traffic = load_profile("tiny"), result.metrics.traffic_bytes
    n = state_sizes(result.config).ranks_per_node
    nvme_s = n * (traffic.nvme_read / hw.nvme.read_bytes_per_s + traffic.nvme_write / hw.nvme.write_bytes_per_s)
    h2d_peak = max(hw.host_link.h2d.pinned.peak_bytes_per_s, hw.host_link.h2d.pageable.peak_bytes_per_s)
    nvme, h2d = RES_NAMES[Res.NVME], RES_NAMES[Res.H2D]
    assert b.terms_s[nvme] == pytest.approx(nvme_s, rel=1e-12)
    assert b.terms_s[h2d] == pytest.approx(traffic.h2d / h2d_peak, rel=1e-12)
    assert b.seconds == max(b.terms_s.values()) == b.terms_s[b.binding] >= b.terms_s[nvme]
    assert result.metrics.iteration_time_s >= b.seconds
    assert table.loc[0, "iteration_time_lower_bound_s"] == b.seconds


def test_the_bound_is_never_weaker_than_the_schedules() -> None:
    """Every term of :func:`offsim.plan.time_bound.time_lower_bound` (the compiled schedule's) is
    kept (the cache-aware terms only replace a resource's term when larger)."""
    (_, st), = policy_variants(load_strategy("zero-infinity-nvme"), "lru", 0.05, 0.1)
    _, (result,) = run_variants("tiny", "tiny", [("lru", st)])
    schedule = time_lower_bound(result.config)
    b = iteration_lower_bound(result)
    for name, seconds in schedule.terms_s.items():
        assert b.terms_s[name] >= seconds
    assert b.seconds >= schedule.seconds


@pytest.mark.parametrize(("hardware", "workload"), [("dgx2-v100", "gpt3-13b"), ("a100-azure-4nvme", "llama2-13b"),
                                                    ("a6000-ws", "llama2-7b")])
@pytest.mark.parametrize("strategy", ["zero-infinity-nvme", "zero-infinity-cpu"])
def test_several_gpus_never_run_below_the_bound(hardware: str, workload: str, strategy: str) -> None:
    """Several GPUs per node: bytes are per rank, and the ranks of a node share its NVMe array.
    No row runs below the bound, and the bound is the same for every policy of one budget."""
    variants = policy_variants(load_strategy(strategy), "lru,mru,belady", [4.0, "auto"], [None, 24.0])
    table, _ = run_variants(hardware, workload, variants)
    ok = table[table["feasible"].astype(bool)]
    assert not ok.empty
    assert (ok["iteration_time_s"] >= ok["iteration_time_lower_bound_s"]).all()
    for _, part in ok.groupby(["cache_gib", "dram_cache_gib"], dropna=False):
        bound_s = part["iteration_time_lower_bound_s"]
        assert bound_s.max() - bound_s.min() <= 1e-9 * bound_s.max()
