"""Validation against published measurements: predicted vs measured, with the error per case.

A cases file (``validation/cases.yaml``) lists, for each case, the shipped (or given) hardware
profile, workload and strategy, optional field overrides, the metric compared (a dotted path into
:class:`~offsim.metrics.RunMetrics`, e.g. ``tflops_per_gpu`` or ``phases_s.backward``), the
measured value, a relative tolerance, and the citation. ``role: calibration`` marks a case whose
number was used to build the profile (agreement there is a consistency check, not evidence).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from offsim.config.base import Frozen
from offsim.config.loading import load_profile, load_strategy, load_workload, read_yaml, validate_data
from offsim.config.run import make_run_config
from offsim.errors import ConfigError
from offsim.simulation import simulate


class ValidationCase(Frozen):
    """One published number and the configuration that should reproduce it."""

    id: str
    citation: str
    url: str | None = None
    hardware: str
    workload: str
    strategy: str
    overrides: dict[str, Any] = Field(default_factory=dict)
    metric: str
    measured: float
    tolerance: float = Field(gt=0, description="relative, e.g. 0.25 for +-25%")
    how_read: Literal["text", "table", "chart-approx", "derived"] = "text"
    role: Literal["validation", "calibration"] = "validation"
    notes: str = ""


class CasesFile(Frozen):
    """The file: a schema version and a list of cases."""

    schema_version: Literal[1] = 1
    cases: list[ValidationCase]


def load_cases(path: Path) -> list[ValidationCase]:
    """Read and validate a cases file; errors name the file and the field."""
    return validate_data(CasesFile, read_yaml(path), str(path)).cases


def _set_path(data: dict[str, Any], dotted: str, value: Any) -> None:
    keys = dotted.split(".")
    node = data
    for k in keys[:-1]:
        if not isinstance(node.get(k), dict):
            raise ConfigError(f"override '{dotted}': no field '{k}'")
        node = node[k]
    if keys[-1] not in node:
        raise ConfigError(f"override '{dotted}': no field '{keys[-1]}'")
    node[keys[-1]] = value


def _apply(model: Any, prefix: str, overrides: dict[str, Any]) -> Any:
    mine = {k.removeprefix(prefix + "."): v for k, v in overrides.items() if k.startswith(prefix + ".")}
    if not mine:
        return model
    data = model.model_dump()
    for path, value in mine.items():
        _set_path(data, path, value)
    return validate_data(type(model), data, f"override of {prefix}")


def metric_value(metrics: Any, dotted: str) -> float | None:
    """Read a dotted metric path from RunMetrics."""
    node: Any = metrics
    for k in dotted.split("."):
        node = getattr(node, k, None)
        if node is None:
            return None
    return float(node)


def run_case(case: ValidationCase) -> dict[str, Any]:
    """Simulate one case; returns a row with predicted, measured, error and pass/fail."""
    for key in case.overrides:
        if key.split(".")[0] not in ("hardware", "workload", "strategy"):
            raise ConfigError(f"case {case.id}: override '{key}' must start with hardware., workload. or strategy.")
    hw = _apply(load_profile(case.hardware), "hardware", case.overrides)
    wl = _apply(load_workload(case.workload), "workload", case.overrides)
    st = _apply(load_strategy(case.strategy), "strategy", case.overrides)
    result = simulate(make_run_config(hw, wl, st))
    predicted = metric_value(result.metrics, case.metric) if result.feasible else None
    error = None if predicted is None else (predicted - case.measured) / case.measured
    return {
        "id": case.id, "role": case.role, "metric": case.metric, "measured": case.measured,
        "predicted": predicted, "error": error, "tolerance": case.tolerance,
        "within": error is not None and abs(error) <= case.tolerance,
        "feasible": result.feasible, "infeasible_reason": result.metrics.infeasible_reason,
        "citation": case.citation,
    }


def default_cases_path() -> Path:
    """The shipped cases file (installed copy first, then the source checkout)."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "_data" / "validation" / "cases.yaml", here.parent / "validation" / "cases.yaml"):
        if candidate.exists():
            return candidate
    raise ConfigError("shipped validation/cases.yaml not found")
