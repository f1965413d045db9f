"""Golden metrics: every shipped strategy's metrics, footprint and time bound are unchanged.

The goldens are written by ``python scripts/golden.py`` (see its docstring); each deliberate
change is listed in ``tests/golden/CHANGES.md`` with the mechanism that explains it. Times and
other floats compare to 1e-9 relative, everything else exactly.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from offsim.api import simulate
from offsim.config.run import make_run_config
from offsim.plan.time_bound import time_lower_bound

_SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "golden.py"
_spec = importlib.util.spec_from_file_location("offsim_golden_script", _SCRIPT)
assert _spec is not None and _spec.loader is not None
golden = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(golden)


@pytest.mark.parametrize(("hardware", "workload", "strategy"), golden.configurations(),
                         ids=lambda v: str(v))
def test_golden(hardware: str, workload: str, strategy: str) -> None:
    expected = json.loads(golden.file_for(strategy).read_text())[f"{hardware}/{workload}"]
    actual = json.loads(json.dumps(golden.record(hardware, workload, strategy)))
    diffs = golden.differences(expected, actual)
    assert not diffs, "\n".join(diffs[:30])


def test_every_golden_configuration_is_recorded() -> None:
    recorded = {(s, key) for s in {c[2] for c in golden.configurations()}
                for key in json.loads(golden.file_for(s).read_text())}
    wanted = {(s, f"{hw}/{wl}") for hw, wl, s in golden.configurations()}
    assert recorded == wanted


def test_differences_sees_a_moved_time() -> None:
    assert golden.differences({"t": 1.0}, {"t": 1.0 + 1e-12}) == []
    assert golden.differences({"t": 1.0}, {"t": 1.001}) != []
    assert golden.differences({"b": 3}, {"b": 4}) != []


@pytest.mark.parametrize(("hardware", "workload", "strategy"), golden.configurations(),
                         ids=lambda v: str(v))
def test_time_bound_is_below_the_simulated_time(hardware: str, workload: str, strategy: str) -> None:
    """The time bound read off the compiled schedule (offsim.schedule.bound, architecture.md §9)
    never exceeds the simulated steady iteration time of a configuration that runs. Both come
    from this tree (a golden records the times of the tree that wrote it)."""
    result = simulate(make_run_config(hardware, workload, strategy))
    if not result.feasible:
        pytest.skip(f"does not run: {result.metrics.infeasible_reason}")
    bound = time_lower_bound(result.config)  # the resolved configuration
    time_s = result.metrics.iteration_time_s
    assert time_s is not None and bound.seconds <= time_s * (1 + 1e-9), (bound, time_s)
