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
    """The closed-form lower bound (offsim.plan.time_bound) never exceeds the simulated
    iteration time of a configuration that runs (both as recorded in the golden)."""
    rec = json.loads(golden.file_for(strategy).read_text())[f"{hardware}/{workload}"]
    metrics, bound = rec["metrics"], rec["time_bound"]
    if not metrics["feasible"] or "error" in bound:
        pytest.skip(f"does not run: {metrics.get('infeasible_reason') or bound.get('error')}")
    assert bound["seconds"] <= metrics["iteration_time_s"] * (1 + 1e-9), (bound, metrics["iteration_time_s"])
