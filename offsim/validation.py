"""Validation against published measurements: offsim as the judge of its own predictions.

A cases file (``validation/cases.yaml``) lists published runs. Each case names the shipped (or
given) hardware profile, workload and strategy, optional field overrides, what really happened
(``outcome``: the run trained, or it ran out of memory) and, for a run that trained, the numbers
its source gives: iteration time or throughput, forward / backward / optimizer time, GPU and host
memory peaks. Each number is a :class:`Measure`: a dotted path into
:class:`~offsim.metrics.RunMetrics` (or one of :data:`DERIVED_METRICS`), the measured value and a
relative tolerance. ``role: calibration`` marks a case whose number was used to build the profile
(agreement there is a consistency check, not evidence, and it is left out of the medians).

The judge (:func:`summarize`) reports, over the validation cases:

* the median relative error per case for iteration time, each phase and each memory tier (a
  throughput figure counts as iteration time: its time error is ``measured / predicted - 1``);
* the verdicts of fit that were wrong, both ways: cases that ran but offsim rejects, and cases
  that ran out of memory but offsim accepts;
* the ordering of strategies within a case: cases sharing a ``group`` ran on the same machine
  and workload, and offsim must rank them by speed as the source does.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from itertools import combinations
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from offsim import simulate  # the public entry point (resolves searched values, then simulates)
from offsim.config.base import Frozen
from offsim.config.case_assumed import CaseAssumed, check_case_assumed, check_keys
from offsim.config.hardware import HardwareProfile
from offsim.config.loading import load_profile, load_strategy, load_workload, read_yaml, validate_data
from offsim.config.run import RunConfig, make_run_config
from offsim.config.strategy import Strategy
from offsim.config.workload import Workload
from offsim.errors import ConfigError
from offsim.fit_check import footprint
from offsim.metrics import RunMetrics
from offsim.plan.footprint import gpu_margin

HowRead = Literal["text", "table", "chart-approx", "derived", "log"]


class Outcome(StrEnum):
    """What the published run did."""

    RAN = "ran"  # it trained: offsim must accept it
    OOM = "oom"  # it ran out of GPU or host memory: offsim must reject it


class MetricKind(StrEnum):
    """What a metric measures, for the medians of the summary."""

    ITERATION = "iteration"  # iteration time, or a throughput (its inverse)
    FORWARD = "forward"
    BACKWARD = "backward"
    OPTIMIZER = "optimizer"
    GPU_MEMORY = "gpu_memory"
    HOST_MEMORY = "host_memory"
    OTHER = "other"  # traffic, CPU busy time, ...


#: Metrics whose value is a rate (higher = faster): their iteration-time error is measured/predicted - 1.
THROUGHPUT_METRICS = frozenset({"tflops_per_gpu", "hardware_tflops_per_gpu", "tokens_per_s", "samples_per_s",
                                "tflops_total"})
_KIND_BY_METRIC = {
    "iteration_time_s": MetricKind.ITERATION,
    "phases_s.forward": MetricKind.FORWARD,
    "phases_s.backward": MetricKind.BACKWARD,
    "phases_s.optimizer": MetricKind.OPTIMIZER,
    "peak_bytes.gpu": MetricKind.GPU_MEMORY,
    "peak_bytes.gpu_allocated": MetricKind.GPU_MEMORY,
    "peak_bytes.host": MetricKind.HOST_MEMORY,
    "peak_bytes.host_pinned": MetricKind.HOST_MEMORY,
}


def metric_kind(metric: str) -> MetricKind:
    """The summary category of a metric path."""
    if metric in THROUGHPUT_METRICS:
        return MetricKind.ITERATION
    return _KIND_BY_METRIC.get(metric, MetricKind.OTHER)


def _samples_per_s(metrics: RunMetrics, cfg: RunConfig) -> float | None:
    """Sequences per second over the whole job (tokens_per_s counts every rank's tokens)."""
    return None if metrics.tokens_per_s is None else metrics.tokens_per_s / cfg.workload.training.seq_len


def _tflops_total(metrics: RunMetrics, cfg: RunConfig) -> float | None:
    """Model TFLOPS of the whole job: per-GPU TFLOPS times the data-parallel ranks."""
    tp = metrics.tflops_per_gpu
    return None if tp is None else tp * cfg.workload.training.data_parallel


def _gpu_allocated(metrics: RunMetrics, cfg: RunConfig) -> float | None:
    """The GPU peak as ``torch.cuda.max_memory_allocated`` reads it, bytes: blocks handed to
    tensors (``allocated_bytes.all.peak``), so without the memory outside PyTorch's pool that
    ``peak_bytes.gpu`` counts from the start, the profile's ``reserved_gib`` (CUDA context,
    allocator slack; ../shared/reference/gpu_memory.md, the counters' table and simulator rule 4)."""
    return metrics.peak_bytes.gpu - cfg.hardware.gpu.reserved_bytes


#: Metrics a source reports that RunMetrics does not carry as such, derived from it here.
DERIVED_METRICS: dict[str, Callable[[RunMetrics, RunConfig], float | None]] = {
    "samples_per_s": _samples_per_s,
    "tflops_total": _tflops_total,
    "peak_bytes.gpu_allocated": _gpu_allocated,
}


class Measure(Frozen):
    """One published number of a case and the tolerance it is judged with."""

    metric: str
    measured: float
    tolerance: float = Field(gt=0, description="relative, e.g. 0.25 for +-25%")
    how_read: HowRead | None = None  # None: the case's how_read
    notes: str = ""


class ValidationCase(Frozen):
    """One published run and the configuration that should reproduce it."""

    id: str
    citation: str = Field(min_length=1)
    url: str = Field(min_length=1)
    hardware: str
    workload: str
    strategy: str
    overrides: dict[str, Any] = Field(default_factory=dict)
    outcome: Outcome = Field(default=Outcome.RAN, strict=False)  # YAML gives the value as text
    # single-number shorthand (the first cases' form); ``measures`` lists several
    metric: str | None = None
    measured: float | None = None
    tolerance: float | None = Field(default=None, gt=0)
    measures: list[Measure] = Field(default_factory=list)
    group: str | None = None  # cases of one group ran on the same machine: their speed order is judged
    # the work the number comes from (default: the url); held-out intervals leave out every case
    # of the same source, not only the case itself (offsim.validation_intervals)
    source: str | None = None
    software: str = ""  # framework version or era, with the reason (e.g. "DeepSpeed 0.13.3: the log's ds_report")
    how_read: HowRead = "text"
    role: Literal["validation", "calibration"] = "validation"
    known_miss: str | None = None  # why offsim misses this case today (tests expect the miss)
    notes: str = ""
    # inputs the case's own source leaves unknown, with their ranges (offsim.config.case_assumed):
    # drawn by `offsim validate --samples N` in place of other ranges on the same fields
    assumed: dict[str, CaseAssumed] = Field(default_factory=dict)

    @field_validator("assumed")
    @classmethod
    def _assumed_keys(cls, assumed: dict[str, CaseAssumed]) -> dict[str, CaseAssumed]:
        check_keys(assumed)
        return assumed

    @model_validator(mode="after")
    def _consistent(self) -> ValidationCase:
        single = (self.metric, self.measured, self.tolerance)
        if any(v is not None for v in single) and not all(v is not None for v in single):
            raise ValueError("metric, measured and tolerance go together")
        if self.outcome is Outcome.OOM and self.all_measures():
            raise ValueError("a case that ran out of memory has no measured numbers (it is a verdict check)")
        return self

    @property
    def source_key(self) -> str:
        """The source this case's numbers come from: ``source`` when given, else the url."""
        return self.source or self.url

    def all_measures(self) -> list[Measure]:
        """The shorthand number (if any) followed by ``measures``."""
        if self.metric is None or self.measured is None or self.tolerance is None:
            return list(self.measures)
        return [Measure(metric=self.metric, measured=self.measured, tolerance=self.tolerance), *self.measures]


class CasesFile(Frozen):
    """The file: a schema version and a list of cases."""

    schema_version: Literal[1] = 1
    cases: list[ValidationCase]

    @model_validator(mode="after")
    def _unique_and_grouped(self) -> CasesFile:
        ids = [c.id for c in self.cases]
        dup = sorted({i for i in ids if ids.count(i) > 1})
        if dup:
            raise ValueError(f"duplicate case ids: {', '.join(dup)}")
        for group, members in _groups(self.cases).items():
            if len(members) < 2:
                raise ValueError(f"group '{group}' has one case: an ordering needs two")
            metrics = {m.metric for c in members for m in c.all_measures()
                       if metric_kind(m.metric) is MetricKind.ITERATION}
            if len(metrics) != 1 or any(c.outcome is Outcome.OOM for c in members):
                raise ValueError(f"group '{group}': every case ran and gives the same iteration-time or throughput "
                                 f"metric (found {sorted(metrics)})")
        return self


def _groups(cases: Sequence[ValidationCase]) -> dict[str, list[ValidationCase]]:
    out: dict[str, list[ValidationCase]] = {}
    for c in cases:
        if c.group is not None:
            out.setdefault(c.group, []).append(c)
    return out


def load_cases(path: Path) -> list[ValidationCase]:
    """Read and validate a cases file; errors name the file and the field (a case's ``assumed``
    checked against its run: :func:`~offsim.config.case_assumed.check_case_assumed`)."""
    cases = validate_data(CasesFile, read_yaml(path), str(path)).cases
    for i, case in enumerate(cases):
        if case.assumed:
            models = dict(zip(("hardware", "workload", "strategy"), case_models(case), strict=True))
            try:
                check_case_assumed(case.assumed, models)
            except ValueError as exc:
                raise ConfigError(f"{path}: cases.{i} ({case.id}).{exc}") from None
    return cases


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


def metric_value(metrics: RunMetrics, dotted: str, cfg: RunConfig | None = None) -> float | None:
    """Read a dotted metric path from RunMetrics, or a :data:`DERIVED_METRICS` entry (needs ``cfg``)."""
    if dotted in DERIVED_METRICS:
        if cfg is None:
            raise ConfigError(f"metric '{dotted}' is derived and needs the run's configuration")
        return DERIVED_METRICS[dotted](metrics, cfg)
    node: Any = metrics
    for k in dotted.split("."):
        node = getattr(node, k, None)
        if node is None:
            return None
    return float(node)


def relative_error(metric: str, measured: float, predicted: float | None) -> float | None:
    """(predicted - measured) / measured: positive = offsim predicts more (more time, more bytes,
    or, for a throughput, a faster run)."""
    return None if predicted is None else (predicted - measured) / measured


def time_error(metric: str, measured: float, predicted: float | None) -> float | None:
    """The error as an error on time or bytes: for a throughput, measured / predicted - 1 (the
    iteration time offsim implies against the one measured); otherwise the relative error.
    Negative = offsim too fast (or too small)."""
    if predicted is None:
        return None
    if metric in THROUGHPUT_METRICS:
        return measured / predicted - 1.0 if predicted > 0 else None
    return (predicted - measured) / measured


@dataclass(frozen=True)
class MeasureResult:
    """One number of a case, predicted against measured."""

    metric: str
    kind: MetricKind
    measured: float
    predicted: float | None
    tolerance: float

    @property
    def error(self) -> float | None:
        """Relative error of the metric as stated (see :func:`relative_error`)."""
        return relative_error(self.metric, self.measured, self.predicted)

    @property
    def time_error(self) -> float | None:
        """Error on time or bytes (see :func:`time_error`), the quantity the medians use."""
        return time_error(self.metric, self.measured, self.predicted)

    @property
    def within(self) -> bool:
        """True when the prediction is within the tolerance of the measured value."""
        return self.error is not None and abs(self.error) <= self.tolerance


@dataclass(frozen=True)
class CaseResult:
    """A case judged: offsim's verdict of fit against the outcome, and each number."""

    case: ValidationCase
    feasible: bool
    infeasible_reason: str | None
    measures: tuple[MeasureResult, ...] = field(default_factory=tuple)
    gpu_margin: str | None = None  # the GPU verdict with its margin (plan.footprint.GpuMargin)

    @property
    def verdict_ok(self) -> bool:
        """offsim accepts a run that trained and rejects one that ran out of memory."""
        return self.feasible == (self.case.outcome is Outcome.RAN)

    @property
    def within(self) -> bool:
        """The verdict is right and every number is within its tolerance."""
        return self.verdict_ok and all(m.within for m in self.measures)

    def speed(self) -> tuple[float, float | None] | None:
        """(measured, predicted) speed of the case's iteration-time figure (higher = faster), for
        the ordering; None when the case has no such figure."""
        for m in self.measures:
            if m.kind is MetricKind.ITERATION:
                if m.metric in THROUGHPUT_METRICS:
                    return m.measured, m.predicted
                return 1.0 / m.measured, (None if not m.predicted else 1.0 / m.predicted)
        return None

    def rows(self) -> list[dict[str, Any]]:
        """One flat row per number (one row for a verdict-only case), for tables and CSV."""
        head = {"id": self.case.id, "role": self.case.role, "outcome": str(self.case.outcome),
                "feasible": self.feasible, "verdict_ok": self.verdict_ok,
                "infeasible_reason": self.infeasible_reason, "gpu_margin": self.gpu_margin, "group": self.case.group,
                "known_miss": self.case.known_miss, "citation": self.case.citation, "url": self.case.url}
        if not self.measures:
            return [{**head, "metric": "verdict", "kind": "verdict", "measured": None, "predicted": None,
                     "error": None, "time_error": None, "tolerance": None, "within": self.verdict_ok}]
        return [{**head, "metric": m.metric, "kind": str(m.kind), "measured": m.measured,
                 "predicted": m.predicted, "error": m.error, "time_error": m.time_error,
                 "tolerance": m.tolerance, "within": self.verdict_ok and m.within} for m in self.measures]


def case_models(case: ValidationCase) -> tuple[HardwareProfile, Workload, Strategy]:
    """A case's profile, workload and strategy with its overrides applied."""
    for key in case.overrides:
        if key.split(".")[0] not in ("hardware", "workload", "strategy"):
            raise ConfigError(f"case {case.id}: override '{key}' must start with hardware., workload. or strategy.")
    hw = _apply(load_profile(case.hardware), "hardware", case.overrides)
    wl = _apply(load_workload(case.workload), "workload", case.overrides)
    st = _apply(load_strategy(case.strategy), "strategy", case.overrides)
    return hw, wl, st


def case_config(case: ValidationCase) -> RunConfig:
    """The run configuration of a case: its profile, workload and strategy with the overrides."""
    return make_run_config(*case_models(case))


def measure_results(case: ValidationCase, metrics: RunMetrics, cfg: RunConfig) -> tuple[MeasureResult, ...]:
    """Each number of ``case`` predicted by ``metrics`` (None where the run does not fit)."""
    return tuple(
        MeasureResult(metric=m.metric, kind=metric_kind(m.metric), measured=m.measured,
                      predicted=metric_value(metrics, m.metric, cfg) if metrics.feasible else None,
                      tolerance=m.tolerance)
        for m in case.all_measures())


def run_case(case: ValidationCase) -> CaseResult:
    """Simulate one case and judge its verdict of fit and each of its numbers."""
    cfg = case_config(case)
    result = simulate(cfg)
    metrics = result.metrics
    margin = gpu_margin(footprint(result.config)).sentence()
    return CaseResult(case=case, feasible=metrics.feasible, infeasible_reason=metrics.infeasible_reason,
                      measures=measure_results(case, metrics, cfg), gpu_margin=margin)


@dataclass(frozen=True)
class Ordering:
    """The speed order of a group's cases, measured and predicted (fastest first)."""

    group: str
    measured_order: tuple[str, ...]
    predicted_order: tuple[str, ...]
    unjudged: tuple[str, ...]  # members offsim rejected or gave no figure for

    @property
    def discordant_pairs(self) -> tuple[tuple[str, str], ...]:
        """Pairs (a, b) measured a faster than b that offsim orders the other way."""
        rank = {cid: i for i, cid in enumerate(self.predicted_order)}
        return tuple((a, b) for a, b in combinations(self.measured_order, 2)
                     if a in rank and b in rank and rank[a] > rank[b])

    @property
    def same(self) -> bool:
        """Every member judged and no pair inverted."""
        return not self.unjudged and not self.discordant_pairs


def judge_ordering(group: str, results: Sequence[CaseResult]) -> Ordering:
    """Rank a group's cases by measured and by predicted speed (ties keep the file's order)."""
    speeds = {r.case.id: r.speed() for r in results}
    measured = sorted((cid for cid, s in speeds.items() if s is not None), key=lambda c: -_first(speeds[c]))
    judged = [cid for cid in measured if (speeds[cid] or (0.0, None))[1] is not None]
    predicted = sorted(judged, key=lambda c: -(_second(speeds[c])))
    unjudged = tuple(r.case.id for r in results if r.case.id not in judged)
    return Ordering(group=group, measured_order=tuple(measured), predicted_order=tuple(predicted),
                    unjudged=unjudged)


def _first(s: tuple[float, float | None] | None) -> float:
    return 0.0 if s is None else s[0]


def _second(s: tuple[float, float | None] | None) -> float:
    return 0.0 if s is None or s[1] is None else s[1]


@dataclass(frozen=True)
class KindStats:
    """Median errors over the cases that give one kind of figure (one value per case: the
    median of the case's figures of that kind)."""

    kind: MetricKind
    cases: int
    median_abs_error: float | None
    median_signed_error: float | None  # negative: offsim too fast / too small


@dataclass(frozen=True)
class Summary:
    """The judge's verdict over a set of cases."""

    total: int
    within: int
    calibration: int
    kinds: tuple[KindStats, ...]
    rejected_but_ran: tuple[str, ...]
    accepted_but_oom: tuple[str, ...]
    orderings: tuple[Ordering, ...]
    misses: tuple[str, ...]

    @property
    def ok(self) -> bool:
        """No case misses and every group is ordered as measured."""
        return not self.misses and all(o.same for o in self.orderings)

    def kind(self, kind: MetricKind) -> KindStats:
        """The statistics of one kind."""
        return next(k for k in self.kinds if k.kind is kind)

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable form."""
        return {
            "total": self.total, "within": self.within, "calibration": self.calibration,
            "median_error": {str(k.kind): {"cases": k.cases, "median_abs": k.median_abs_error,
                                           "median_signed": k.median_signed_error} for k in self.kinds},
            "rejected_but_ran": list(self.rejected_but_ran), "accepted_but_oom": list(self.accepted_but_oom),
            "orderings": [{"group": o.group, "measured": list(o.measured_order),
                           "predicted": list(o.predicted_order), "unjudged": list(o.unjudged),
                           "discordant_pairs": [list(p) for p in o.discordant_pairs], "same": o.same}
                          for o in self.orderings],
            "misses": list(self.misses), "ok": self.ok,
        }


def _kind_stats(results: Sequence[CaseResult], kind: MetricKind) -> KindStats:
    per_case: list[float] = []
    for r in results:
        errs = [e for m in r.measures if m.kind is kind and (e := m.time_error) is not None]
        if errs:
            per_case.append(statistics.median(errs))
    if not per_case:
        return KindStats(kind, 0, None, None)
    return KindStats(kind, len(per_case), statistics.median(abs(e) for e in per_case),
                     statistics.median(per_case))


def summarize(results: Sequence[CaseResult]) -> Summary:
    """Medians per kind over the validation cases (calibration cases left out), the wrong
    verdicts of fit both ways, and the ordering within each group. A case rejected by offsim
    gives no error to the medians: it is counted among the wrong verdicts instead."""
    evidence = [r for r in results if r.case.role == "validation"]
    groups: dict[str, list[CaseResult]] = {}
    for r in results:
        if r.case.group is not None:
            groups.setdefault(r.case.group, []).append(r)
    return Summary(
        total=len(results),
        within=sum(r.within for r in results),
        calibration=len(results) - len(evidence),
        kinds=tuple(_kind_stats(evidence, k) for k in MetricKind),
        rejected_but_ran=tuple(r.case.id for r in results if r.case.outcome is Outcome.RAN and not r.feasible),
        accepted_but_oom=tuple(r.case.id for r in results if r.case.outcome is Outcome.OOM and r.feasible),
        orderings=tuple(judge_ordering(g, members) for g, members in groups.items()),
        misses=tuple(r.case.id for r in results if not r.within),
    )


def default_cases_path() -> Path:
    """The shipped cases file (installed copy first, then the source checkout)."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "_data" / "validation" / "cases.yaml", here.parent / "validation" / "cases.yaml"):
        if candidate.exists():
            return candidate
    raise ConfigError("shipped validation/cases.yaml not found")
