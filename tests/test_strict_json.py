"""What offsim writes as JSON is strict (RFC 8259): a NaN or infinite number is ``null``, never
``NaN`` or ``Infinity`` (issue 20, item 1): ``RunResult.to_json``, the Chrome trace, ``--json``."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from offsim import make_run_config, simulate
from offsim.core import strict_json
from offsim.report.chrome_trace import write_chrome_trace
from offsim.results import RunResult


def strict_loads(text: str) -> Any:
    """Parse ``text``, refusing ``NaN``, ``Infinity`` and ``-Infinity`` as a strict parser does."""

    def refuse(name: str) -> None:
        raise ValueError(f"not strict JSON: {name}")

    return json.loads(text, parse_constant=refuse)


def test_the_strict_parser_refuses_python_defaults() -> None:
    with pytest.raises(ValueError, match="NaN"):
        strict_loads(json.dumps({"x": math.nan}))


def test_dumps_writes_null_for_non_finite_numbers() -> None:
    obj = {"nan": math.nan, "inf": [math.inf, -math.inf], "np": np.float64("nan"), "f32": np.float32(1.5),
           "arr": np.array([1.0, 2.0]), "ok": 1.25, "path": Path("a/b"), "t": (math.nan, 2)}
    doc = strict_loads(strict_json.dumps(obj))
    assert doc == {"nan": None, "inf": [None, None], "np": None, "f32": 1.5, "arr": [1.0, 2.0], "ok": 1.25,
                   "path": "a/b", "t": [None, 2]}


def test_dumps_catches_a_nan_from_a_converted_value() -> None:
    """A numpy NaN inside an array is met only when encoding; it still comes out as null."""
    assert strict_loads(strict_json.dumps({"a": np.array([np.nan, 1.0])})) == {"a": [None, 1.0]}


def test_dumps_keeps_other_errors() -> None:
    loop: list[Any] = []
    loop.append(loop)
    with pytest.raises(ValueError, match="Circular"):
        strict_json.dumps(loop)


@pytest.fixture(scope="module")
def broken_result() -> RunResult:
    """A tiny run whose metrics carry NaN and infinities (as a bug or a degenerate case could)."""
    result = simulate(make_run_config("tiny", "tiny", "zero-infinity-cpu", iterations=2, warmup_iterations=1))
    assert result.feasible
    m = result.metrics
    cache = {name: c.model_copy(update={"hit_rate": math.nan, "offline_plan_bytes_fetched": math.inf})
             for name, c in m.cache.items()}
    metrics = m.model_copy(update={"iteration_time_s": math.nan, "tokens_per_s": math.inf,
                                   "stall_s": -math.inf, "iteration_times_s": [math.nan, 1.0], "cache": cache})
    footprint = {"need": {"gpu": 1.0}, "capacity": {"gpu": math.inf}}
    return RunResult(result.config, metrics, result.recorder, footprint, result.events, math.nan)


def test_to_json_is_strict(broken_result: RunResult) -> None:
    doc = strict_loads(broken_result.to_json())
    assert doc["iteration_time_s"] is None and doc["tokens_per_s"] is None and doc["stall_s"] is None
    assert doc["iteration_times_s"] == [None, 1.0]
    assert doc["footprint_bytes"]["capacity"]["gpu"] is None and doc["wall_time_s"] is None
    assert all(c["hit_rate"] is None and c["offline_plan_bytes_fetched"] is None for c in doc["cache"].values())
    assert strict_loads(broken_result.to_json(indent=None)) == doc
    assert math.isnan(broken_result.to_dict()["iteration_time_s"])  # Python users still see the float


def test_chrome_trace_is_strict(broken_result: RunResult, tmp_path: Path) -> None:
    path = write_chrome_trace(broken_result, tmp_path / "trace.json")
    doc = strict_loads(path.read_text())
    assert doc["otherData"]["iteration_time_s"] is None
    assert doc["traceEvents"]
