"""Prediction intervals of the validation cases, and how often they hold (issue 23 part 3).

Each published figure of a case gets up to three intervals (p10, p50, p90), each from its own
source of uncertainty:

* ``inputs``: the values of a profile, workload or strategy that are assumptions carry a range
  (``validation/assumptions.yaml``, each range with its source; a profile's or workload's own
  ``assumed`` ranges take the place of the file's on the same field). The case is simulated at
  ``n`` Latin-hypercube draws of the ranges that apply to it; the quantiles are taken over the
  draws that fit. This is what a user's run reports (``offsim run --samples``, :mod:`offsim.intervals`).
* ``model``: the spread of offsim's error on *other* cases. The residual of a figure is its
  measured / predicted ratio as time or bytes (a throughput's is predicted / measured). A case's
  interval uses the residuals of the same kind of figure from the validation cases of every
  *other* source (held out by source: a case never sees its own residual, nor its siblings' from
  the same paper or artifact; ``holdout="case"`` leaves out the case alone). With fewer than
  :data:`MIN_POOL` such residuals the pool is the kind's family (time: iteration and phases;
  memory: GPU and host); still fewer, and the figure has no interval. Calibration cases give no
  residual.
* ``combined``: every input draw times every held-out residual.

:func:`coverage` reports, per source and per kind of figure, the share of validation figures whose
measured value lies within [p10, p90] (coverage) and the median p90/p10 ratio (sharpness: an
interval that covers everything is no answer).
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, model_validator

from offsim import simulate
from offsim.config.assumed import field_at
from offsim.config.base import Frozen
from offsim.config.case_assumed import check_choices, field_of
from offsim.config.loading import read_yaml, validate_data
from offsim.config.run import RunConfig, make_run_config
from offsim.errors import ConfigError
from offsim.metrics import RunMetrics
from offsim.validation import (
    THROUGHPUT_METRICS,
    CaseResult,
    MeasureResult,
    MetricKind,
    ValidationCase,
    case_models,
    metric_value,
)

#: Fewest held-out residuals an interval is taken from (below: the kind's family, then none).
MIN_POOL = 5
#: The quantiles of an interval.
LOW_Q, MID_Q, HIGH_Q = 0.10, 0.50, 0.90
#: The sources of an interval, in the order they are reported.
SOURCES = ("inputs", "model", "combined")
_FAMILY = {
    MetricKind.ITERATION: "time", MetricKind.FORWARD: "time", MetricKind.BACKWARD: "time",
    MetricKind.OPTIMIZER: "time", MetricKind.GPU_MEMORY: "memory", MetricKind.HOST_MEMORY: "memory",
}
_PARTS = ("hardware", "workload", "strategy")
_CPU_RATE = "hardware.cpu.optimizer_params_per_s"
Holdout = Literal["source", "case"]
Residual = tuple[ValidationCase, MeasureResult, float]  # a figure of a case and its measured / predicted ratio


# ----------------------------------------------------------------------------- the ranges
class Assumption(Frozen):
    """A range of assumed input values: one factor, drawn log-uniformly, on every path (``scale``);
    or a discrete choice (``choices``, drawn with ``weights``, uniform when none), e.g. the
    DeepSpeed version switches (:mod:`offsim.plan.deepspeed_versions`) of the releases a case's
    source allows. A choice is the value of every path, or a mapping of each path to its value
    (one release sets several switches)."""

    id: str = Field(min_length=1)
    paths: list[str] = Field(min_length=1)
    scale: tuple[float, float] | None = Field(default=None, strict=False)  # YAML gives a list
    choices: list[Any] | None = Field(default=None, min_length=1)
    weights: list[float] | None = None
    clip: tuple[float, float] | None = Field(default=None, strict=False)
    when: dict[str, Any] = Field(default_factory=dict)
    source: str = Field(min_length=1)
    notes: str = ""

    @model_validator(mode="after")
    def _check(self) -> Assumption:
        for path in [*self.paths, *self.when]:
            if path.split(".")[0] not in _PARTS or "." not in path:
                raise ValueError(f"path '{path}' must start with hardware., workload. or strategy.")
        if (self.scale is None) == (self.choices is None):
            raise ValueError("give exactly one of scale and choices")
        if self.scale is not None:
            low, high = self.scale
            if not 0 < low <= 1 <= high:
                raise ValueError(f"scale [{low}, {high}] must hold 1 with 0 < low <= 1 <= high")
            if self.weights is not None:
                raise ValueError("weights go with choices, not scale")
            return self
        check_choices(self.choices or [], self.weights, self.paths)
        return self

    @property
    def is_choice(self) -> bool:
        """A discrete choice (``choices``), not a factor range."""
        return self.choices is not None

    def value_of(self, choice: Any, path: str) -> Any:
        """What ``choice`` sets at ``path`` (a mapping's entry, or the choice itself)."""
        return choice[path] if isinstance(choice, dict) else choice


class AssumptionsFile(Frozen):
    """The file: a schema version and the ranges."""

    schema_version: Literal[1] = 1
    assumptions: list[Assumption]

    @model_validator(mode="after")
    def _unique(self) -> AssumptionsFile:
        ids = [a.id for a in self.assumptions]
        dup = sorted({i for i in ids if ids.count(i) > 1})
        if dup:
            raise ValueError(f"duplicate assumption ids: {', '.join(dup)}")
        return self


def load_assumptions(path: Path) -> list[Assumption]:
    """Read and validate an assumptions file; errors name the file and the field."""
    return validate_data(AssumptionsFile, read_yaml(path), str(path)).assumptions


def default_assumptions_path() -> Path:
    """The shipped ``validation/assumptions.yaml`` (installed copy first, then the checkout)."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "_data" / "validation" / "assumptions.yaml",
                      here.parent / "validation" / "assumptions.yaml"):
        if candidate.exists():
            return candidate
    raise ConfigError("shipped validation/assumptions.yaml not found")


Models = dict[str, Any]  # "hardware" / "workload" / "strategy" -> the pydantic model


def _get(models: Models, dotted: str) -> Any:
    part, *keys = dotted.split(".")
    node: Any = models[part]
    for k in keys:
        node = node.get(k) if isinstance(node, dict) else getattr(node, k, None)
        if node is None:
            return None
    return node


def has_field(models: Models, dotted: str) -> bool:
    """``dotted`` names a field of ``models`` (its value may be None), or a key of a dict field."""
    return field_of(models, dotted)[0]


def applies(assumption: Assumption, models: Models) -> bool:
    """Its ``when`` holds, and every path is a number (or a curve) in ``models`` (a choice: a field
    of ``models``)."""
    if any(str(_get(models, p)) != str(v) for p, v in assumption.when.items()):
        return False
    if assumption.is_choice:
        return all(has_field(models, p) for p in assumption.paths)
    return all(isinstance(_get(models, p), int | float | list) for p in assumption.paths)


def _scaled(value: Any, factor: float, clip: tuple[float, float] | None) -> Any:
    def one(x: float) -> float:
        y = x * factor
        return y if clip is None else min(max(y, clip[0]), clip[1])

    if isinstance(value, list | tuple):  # a curve of [x, y] points: the y values are scaled
        return [[p[0], one(p[1])] for p in value]
    if isinstance(value, int) and not isinstance(value, bool):  # a count (a workload's seq_len): whole, >= 1
        return max(1, round(one(float(value))))
    return one(float(value))


def _set(data: dict[str, Any], keys: Sequence[str], value: Any) -> None:
    node = data
    for k in keys[:-1]:
        node = node[k]
    node[keys[-1]] = value


def _effective_cpu_rate(models: Models) -> float:
    """The node's CPU Adam rate this configuration runs at, as a measured figure would state it
    (per-rank rate times the ranks on the node): a derived rate scaled as an override."""
    from offsim.plan.footprint import state_sizes
    from offsim.plan.paths import cpu_adam_rank_rate

    cfg = make_run_config(models["hardware"], models["workload"], models["strategy"])
    ranks = state_sizes(cfg).ranks_per_node
    return cpu_adam_rank_rate(cfg, ranks) * ranks


def run_value(models: Models, path: str) -> Any:
    """The value at ``path`` as the configuration runs with it: the field itself, except the CPU
    Adam rate, which is the node's effective rate (a derived rate included)."""
    return _effective_cpu_rate(models) if path == _CPU_RATE else _get(models, path)


#: What one draw gives a range: a factor (``scale``), or the value chosen (``choices``).
Drawn = Any


def _drawn_value(a: Assumption, drawn: Drawn, models: Models, path: str) -> Any:
    """The value ``path`` takes in a draw: the chosen value, or the run's value times the factor."""
    if a.is_choice:
        return a.value_of(drawn, path)
    return _scaled(run_value(models, path), drawn, a.clip)


def perturb(models: Models, draws: Iterable[tuple[Assumption, Drawn]]) -> Models:
    """``models`` with each assumption's factor (or choice) applied, in order (each re-validated,
    so a derived value such as the CPU Adam rate follows a scaled DRAM bandwidth). A value that
    breaks a rule of its file raises :class:`DrawRuleError` (a ConfigError) naming the file, the
    field and the range."""
    out = dict(models)
    for a, drawn in draws:
        for part in _PARTS:
            paths = [p for p in a.paths if p.split(".")[0] == part]
            if not paths:
                continue
            data = out[part].model_dump()
            data.pop("assumed", None)  # the file's own ranges, drawn already: a draw's value may sit at their edge
            for p in paths:
                _set(data, p.split(".")[1:], _drawn_value(a, drawn, out, p))
                if p == _CPU_RATE:  # scaled as the override it now is
                    data["cpu"]["optimizer_rate_origin"] = "measured"
            try:
                out[part] = type(out[part]).model_validate(data)
            except ValidationError as exc:
                raise DrawRuleError(broken_rule(part, out[part], exc, a.id)) from None
    return out


#: What each part of a run is called in a broken rule's sentence.
_FILE_KIND = {"hardware": "hardware profile", "workload": "workload", "strategy": "strategy"}


@dataclass(frozen=True)
class BrokenRule:
    """A rule of the input files that a draw's values break: the draw does not fit, for this reason.

    Attributes:
        file: the file whose values were re-validated, by kind and name (``hardware profile 'tiny'``),
            or ``the drawn configuration`` for a rule across files (:class:`~offsim.config.run.RunConfig`).
        field: the dotted field the rule sits on (``hardware.gpu``; the part alone for a rule across files).
        rule: what the rule says (the validator's message, with the value when it is a number).
        assumption: the id of the range whose factor was being applied (None for a rule across files).
    """

    file: str
    field: str
    rule: str
    assumption: str | None = None

    def text(self) -> str:
        """``breaks a rule of hardware profile 'tiny', hardware.gpu: ... (range 'x' drew it)``."""
        by = f" (range '{self.assumption}' drew it)" if self.assumption else ""
        return f"breaks a rule of {self.file}, {self.field}: {self.rule}{by}"

    def to_dict(self) -> dict[str, str | None]:
        """JSON-serialisable form."""
        return {"file": self.file, "field": self.field, "rule": self.rule, "assumption": self.assumption}


class DrawRuleError(ConfigError):
    """A draw's values break a rule of the input files (:class:`BrokenRule`)."""

    def __init__(self, broken: BrokenRule) -> None:
        super().__init__(broken.text())
        self.broken = broken


def broken_rule(part: str, model: Any, exc: ValidationError, assumption: str | None) -> BrokenRule:
    """The first rule of ``exc`` that the drawn ``part`` (whose values were ``model``'s) breaks."""
    err = exc.errors()[0]
    loc = ".".join(str(x) for x in err["loc"])
    msg = str(err["msg"]).removeprefix("Value error, ")
    value = err.get("input")
    if isinstance(value, int | float) and not isinstance(value, bool):
        msg = f"{msg} (got {value:.4g})"
    name = getattr(model, "name", None)
    file = f"{_FILE_KIND[part]} '{name}'" if name else _FILE_KIND[part]
    return BrokenRule(file, f"{part}.{loc}" if loc else part, msg, assumption)


def drawn_config(models: Models, factors: Sequence[tuple[Assumption, Drawn]], *, iterations: int = 3,
                 warmup: int = 1) -> RunConfig | BrokenRule:
    """The configuration one draw makes, or the rule its values break (a file's field, or a rule
    across the files: then the whole message of :func:`~offsim.config.run.make_run_config`)."""
    try:
        drawn = perturb(models, sorted(factors, key=lambda af: not af[0].is_choice))  # choices first
        return make_run_config(drawn["hardware"], drawn["workload"], drawn["strategy"],
                               iterations=iterations, warmup_iterations=warmup)
    except DrawRuleError as exc:
        return exc.broken
    except ConfigError as exc:
        return BrokenRule("the drawn configuration", "hardware, workload and strategy together", str(exc))


#: The parts of a run whose files may declare their own ranges, and what a range of theirs is called.
DECLARING = {"hardware": "hardware profile", "workload": "workload"}


def declared_ranges(models: Models) -> list[Assumption]:
    """The ranges the profile and the workload declare under ``assumed`` (:mod:`offsim.config.assumed`),
    as factor ranges of the values the files give; each is named ``<part>:<path>``."""
    out = []
    for part in DECLARING:
        model = models[part]
        for path, r in getattr(model, "assumed", {}).items():
            out.append(Assumption(id=f"{part}:{path}", paths=[f"{part}.{path}"],
                                  scale=r.factors(field_at(model, path)), source=r.why))
    return out


def case_ranges(case: ValidationCase, models: Models) -> list[Assumption]:
    """The ranges a validation case declares under ``assumed`` (:mod:`offsim.config.case_assumed`)
    for the inputs its own source leaves unknown, as factor ranges of the case's values or as
    choices; each is named ``case:<key>``."""
    out = []
    for key, r in case.assumed.items():
        paths = r.paths(key)
        if r.choices is not None:
            out.append(Assumption(id=f"case:{key}", paths=paths, choices=r.choices, weights=r.weights,
                                  source=r.why))
            continue
        scale = r.scale
        if r.range is not None:
            value = float(field_of(models, key)[1])
            scale = (r.range[0] / value, r.range[1] / value)
        out.append(Assumption(id=f"case:{key}", paths=paths, scale=scale, source=r.why))
    return out


def with_declared(models: Models, shipped: Sequence[Assumption], case_own: Sequence[Assumption] = ()
                  ) -> list[Assumption]:
    """The files' own ranges first, then the shipped ranges, each less the fields declared before
    it or by a case's factor range (a range left with no field is dropped), then the case's own
    ranges (last, so that a case without any draws the others as before). A case's choice leaves
    the factor ranges on its fields: the draw applies the choice first, then scales the chosen
    value (:func:`drawn_config`)."""
    own = declared_ranges(models)
    taken = {p for a in case_own if not a.is_choice for p in a.paths}
    kept = []
    for a in [*own, *shipped]:
        paths = [p for p in a.paths if p not in taken]
        if paths:
            kept.append(a if len(paths) == len(a.paths) else a.model_copy(update={"paths": paths}))
        if a in own:
            taken |= set(paths)
    return [*kept, *case_own]


def latin_hypercube(n: int, k: int, rng: random.Random) -> list[list[float]]:
    """``n`` points in [0, 1)^k, one in each of the ``n`` strata of every axis."""
    columns = []
    for _ in range(k):
        strata = [(i + rng.random()) / n for i in range(n)]
        rng.shuffle(strata)
        columns.append(strata)
    return [[columns[j][i] for j in range(k)] for i in range(n)]


def draw_one(a: Assumption, u: float) -> Drawn:
    """The factor (log-uniform over ``scale``) or the choice (by cumulative ``weights``, uniform
    when none) at the point ``u`` in [0, 1) of the range's axis."""
    if a.choices is not None:
        weights = a.weights or [1.0] * len(a.choices)
        total, edge = sum(weights), 0.0
        for choice, w in zip(a.choices, weights, strict=True):
            edge += w / total
            if u < edge:
                return choice
        return a.choices[-1]
    low, high = a.scale or (1.0, 1.0)
    return math.exp(math.log(low) + u * (math.log(high) - math.log(low)))


@dataclass(frozen=True)
class Draws:
    """The runs of one configuration at draws of its assumed inputs."""

    assumptions: tuple[str, ...]  # the ids of the ranges that applied
    samples: int
    feasible: int  # draws that fit
    values: dict[str, tuple[float, ...]]  # metric -> its value in each draw that fit
    # per draw that fits: each range's place in its range (0 = low end or first choice, 1 = high
    # end or last), and the metrics read from it (what drives a figure: :func:`drivers`)
    rows: tuple[tuple[dict[str, float], dict[str, float]], ...] = ()


def position(a: Assumption, drawn: Drawn) -> float:
    """Where a draw sits in its range, in [0, 1]: the log of the factor between the ends, or the
    choice's index (its middle) among the choices."""
    if a.choices is not None:
        index = next((i for i, c in enumerate(a.choices) if c == drawn), 0)
        return (index + 0.5) / len(a.choices)
    low, high = a.scale or (1.0, 1.0)
    return 0.5 if high == low else math.log(drawn / low) / math.log(high / low)


def simulate_draw(drawn: RunConfig | BrokenRule) -> RunMetrics | BrokenRule:
    """The metrics of a drawn configuration (:func:`drawn_config`), or the rule it breaks: one its
    files state, or one the run checks as it resolves and composes the drawn values (a
    :class:`~offsim.errors.ConfigError`; the run as written passed it, so the draw broke it)."""
    if isinstance(drawn, BrokenRule):
        return drawn
    try:
        return simulate(drawn).metrics
    except ConfigError as exc:
        return BrokenRule("the drawn configuration", "hardware, workload and strategy together", str(exc))


def drawn_configs(models: Models, chosen: Sequence[Assumption], samples: int, seed: str, *,
                  iterations: int = 3, warmup: int = 1
                  ) -> Iterator[tuple[list[tuple[Assumption, Drawn]], RunConfig | BrokenRule]]:
    """``samples`` Latin-hypercube draws of the ranges ``chosen`` (each applying to ``models``):
    per draw, each range's factor and the configuration it makes, or the rule of the input files
    its values break (:func:`drawn_config`: such a draw does not fit). Reproducible for a ``seed``."""
    for row in latin_hypercube(samples, len(chosen), random.Random(seed)):
        factors = [(a, draw_one(a, u)) for a, u in zip(chosen, row, strict=True)]
        yield factors, drawn_config(models, factors, iterations=iterations, warmup=warmup)


def sample_inputs(models: Models, assumptions: Sequence[Assumption], samples: int, seed: str,
                  metric_fn: Callable[[RunMetrics, RunConfig], dict[str, float | None]],
                  on_draw: Callable[[], None] | None = None, case_own: Sequence[Assumption] = ()) -> Draws:
    """Simulate ``samples`` Latin-hypercube draws of the ranges that apply to ``models`` (a case's
    own ranges, ``case_own``, in place of others on their fields); ``metric_fn`` reads what is
    wanted from each run that fits. Reproducible for a ``seed``."""
    chosen = [a for a in with_declared(models, assumptions, case_own) if applies(a, models)]
    values: dict[str, list[float]] = {}
    rows = []
    for factors, cfg in drawn_configs(models, chosen, samples, seed):
        metrics = simulate_draw(cfg)  # a draw that breaks a rule does not fit
        if not isinstance(metrics, BrokenRule) and metrics.feasible and isinstance(cfg, RunConfig):
            read = {name: v for name, v in metric_fn(metrics, cfg).items() if v is not None}
            rows.append(({a.id: position(a, f) for a, f in factors}, read))
            for name, v in read.items():
                values.setdefault(name, []).append(v)
        if on_draw is not None:
            on_draw()
    return Draws(tuple(a.id for a in chosen), samples, len(rows), {k: tuple(v) for k, v in values.items()},
                 tuple(rows))


def input_quantiles(hardware: Any, workload: Any, strategy: Any, assumptions: Sequence[Assumption],
                    samples: int = 16, seed: str = "0") -> dict[str, tuple[float, float, float] | None]:
    """p10/p50/p90 of the iteration time and each tier's peak bytes over draws of the assumed
    inputs (models as :func:`~offsim.config.run.make_run_config` takes them); None where no draw fits."""
    tiers = ("gpu", "host_pinned", "host", "nvme")

    def read(m: RunMetrics, _cfg: RunConfig) -> dict[str, float | None]:
        return {"iteration_time_s": m.iteration_time_s,
                **{f"peak_bytes.{t}": float(getattr(m.peak_bytes, t)) for t in tiers}}

    models = dict(zip(_PARTS, (hardware, workload, strategy), strict=True))
    draws = sample_inputs(models, assumptions, samples, seed, read)
    names = ["iteration_time_s", *(f"peak_bytes.{t}" for t in tiers)]
    return {n: (tuple(quantile(draws.values[n], q) for q in (LOW_Q, MID_Q, HIGH_Q))  # type: ignore[misc]
                if draws.values.get(n) else None) for n in names}


def case_draws(case: ValidationCase, assumptions: Sequence[Assumption], samples: int, seed: int = 0,
               on_draw: Callable[[], None] | None = None) -> Draws:
    """A case's figures at draws of its assumed inputs (seeded by ``seed`` and the case id)."""
    hw, wl, st = case_models(case)
    metrics = [m.metric for m in case.all_measures()]

    def read(m: RunMetrics, cfg: RunConfig) -> dict[str, float | None]:
        return {name: metric_value(m, name, cfg) for name in metrics}

    models = {"hardware": hw, "workload": wl, "strategy": st}
    return sample_inputs(models, assumptions, samples, f"{seed}:{case.id}", read, on_draw,
                         case_ranges(case, models))


# ----------------------------------------------------------------------------- intervals
def quantile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile of ``values``, linear between order statistics (numpy's default)."""
    xs = sorted(values)
    pos = q * (len(xs) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (pos - lo) * (xs[hi] - xs[lo])


def time_ratio(metric: str, measured: float, predicted: float) -> float:
    """measured / predicted as time or bytes (a throughput's ratio is predicted / measured)."""
    return predicted / measured if metric in THROUGHPUT_METRICS else measured / predicted


def _to_value(metric: str, predicted: float, ratio: float) -> float:
    return predicted / ratio if metric in THROUGHPUT_METRICS else predicted * ratio


@dataclass(frozen=True)
class Interval:
    """p10 / p50 / p90 of one figure from one source, in the figure's units."""

    source: str
    low: float
    mid: float
    high: float
    basis: str  # what it was taken from, e.g. "7 held-out iteration residuals"

    def covers(self, measured: float) -> bool:
        """The measured value lies within [p10, p90]."""
        return self.low <= measured <= self.high

    @property
    def sharpness(self) -> float:
        """p90 / p10 (1 = a point)."""
        return self.high / self.low if self.low > 0 else math.inf


def _from_ratios(source: str, metric: str, predicted: float, ratios: Sequence[float], basis: str) -> Interval:
    qs = [_to_value(metric, predicted, quantile(ratios, q)) for q in (LOW_Q, MID_Q, HIGH_Q)]
    low, high = min(qs[0], qs[2]), max(qs[0], qs[2])
    return Interval(source, low, qs[1], high, basis)


#: A range is named among a figure's drivers when its rank correlation with the figure is beyond
#: chance at 5% (two-sided): |rho| >= 1.96 / sqrt(n - 1) over n draws that fit (Spearman's rho has
#: standard deviation 1 / sqrt(n - 1) when unrelated; 0.506 at 16 draws, where the exact table gives
#: 0.503, Zar 1972; 0.98 at 5 draws).
Z_5PCT = 1.96


def min_rho(n: int) -> float:
    """The smallest |rho| named as a driver over ``n`` draws (above 1, none, below 3 draws)."""
    return Z_5PCT / math.sqrt(n - 1) if n >= 3 else math.inf


@dataclass(frozen=True)
class Driver:
    """An assumed range that moves a figure over the draws: Spearman's rank correlation between
    where the range's draw sits (:func:`position`) and the figure (+1: its high end or last choice
    gives the highest values)."""

    id: str
    rho: float

    def text(self) -> str:
        """``gpu-reserved (rho +0.93)``."""
        return f"{self.id} (rho {self.rho:+.2f})"


def _ranks(xs: Sequence[float]) -> list[float]:
    order = sorted(range(len(xs)), key=lambda i: xs[i])
    ranks = [0.0] * len(xs)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and xs[order[j + 1]] == xs[order[i]]:
            j += 1
        for k in range(i, j + 1):  # ties share their mean rank
            ranks[order[k]] = (i + j) / 2
        i = j + 1
    return ranks


def spearman(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """Spearman's rank correlation (Pearson's on mean ranks); None below 3 points or when either
    side is constant."""
    if len(xs) < 3:
        return None
    rx, ry = _ranks(xs), _ranks(ys)
    mx, my = statistics.fmean(rx), statistics.fmean(ry)
    sxy = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    sxx, syy = sum((a - mx) ** 2 for a in rx), sum((b - my) ** 2 for b in ry)
    return None if sxx == 0 or syy == 0 else sxy / math.sqrt(sxx * syy)


def drivers(draws: Draws, metric: str) -> tuple[Driver, ...]:
    """The ranges whose draws move ``metric`` beyond chance (|rho| at least :func:`min_rho` of the
    draws that fit), strongest first."""
    rows = [(pos, vals[metric]) for pos, vals in draws.rows if metric in vals]
    found = []
    for rid in draws.assumptions:
        rho = spearman([p[rid] for p, _ in rows], [v for _, v in rows])
        if rho is not None and abs(rho) >= min_rho(len(rows)):
            found.append(Driver(rid, rho))
    return tuple(sorted(found, key=lambda d: -abs(d.rho)))


@dataclass(frozen=True)
class FigureIntervals:
    """One published figure of a case with its point prediction and its intervals."""

    case_id: str
    role: str
    metric: str
    kind: MetricKind
    measured: float
    predicted: float | None
    intervals: dict[str, Interval] = field(default_factory=dict)
    missing: dict[str, str] = field(default_factory=dict)  # source -> why it has no interval
    drivers: tuple[Driver, ...] = ()  # the assumed ranges that move it over the input draws

    def row(self) -> dict[str, Any]:
        """A flat row: p10/p50/p90, covered and sharpness per source; why it is uncovered."""
        out: dict[str, Any] = {"id": self.case_id, "metric": self.metric, "kind": str(self.kind),
                               "measured": self.measured, "predicted": self.predicted}
        for s in SOURCES:
            iv = self.intervals.get(s)
            out.update({f"{s}_p10": iv and iv.low, f"{s}_p50": iv and iv.mid, f"{s}_p90": iv and iv.high,
                        f"{s}_covers": iv and iv.covers(self.measured),
                        f"{s}_basis": iv.basis if iv else self.missing.get(s)})
        out["drivers"] = [d.text() for d in self.drivers]
        out["uncovered"] = self.uncovered()
        return out

    def uncovered(self) -> str | None:
        """Why a source's interval leaves the measured value out (None when every interval holds
        it): on which side, and which assumed inputs move the figure (:func:`drivers`), or that
        none does, so the gap is offsim's model, not the inputs."""
        out = [s for s, iv in self.intervals.items() if not iv.covers(self.measured)]
        if not out:
            return None
        sides = []
        for s in out:
            iv = self.intervals[s]
            above = self.measured > iv.high
            sides.append(f"{s} {'above p90' if above else 'below p10'} {iv.high if above else iv.low:.4g}")
        inputs = self.intervals.get("inputs")
        if inputs is None:
            moved = f"no input interval ({self.missing.get('inputs', 'none')})"
        elif self.drivers:
            moved = "moved by " + ", ".join(d.text() for d in self.drivers)
        else:
            moved = f"no assumed input moves it (inputs p90/p10 {inputs.sharpness:.3f}): the gap is the model's"
        return f"measured {self.measured:.4g}: {'; '.join(sides)}; {moved}"


def _residuals(results: Sequence[CaseResult]) -> list[Residual]:
    """(case, figure, ratio) of every validation figure offsim predicts (calibration left out)."""
    return [(r.case, m, time_ratio(m.metric, m.measured, m.predicted))
            for r in results if r.case.role == "validation"
            for m in r.measures if m.predicted is not None and m.predicted > 0]


def _held_out_pool(case: ValidationCase, kind: MetricKind, residuals: Sequence[Residual], holdout: Holdout
                   ) -> tuple[list[float], str]:
    """The ratios an interval of ``case``'s ``kind`` figure may use, and what they are."""
    def other(c: ValidationCase) -> bool:
        return c.id != case.id if holdout == "case" else c.source_key != case.source_key

    same = [x for c, m, x in residuals if other(c) and m.kind is kind]
    if len(same) >= MIN_POOL:
        return same, f"{len(same)} held-out {kind} residuals"
    family = _FAMILY.get(kind)
    wider = [x for c, m, x in residuals if other(c) and family is not None and _FAMILY.get(m.kind) == family]
    if len(wider) >= MIN_POOL:
        return wider, f"{len(wider)} held-out {family} residuals ({len(same)} of {kind})"
    return [], f"{len(wider) if family else len(same)} held-out residuals, fewer than {MIN_POOL}"


def _figure(r: CaseResult, m: MeasureResult, draws: Draws | None, residuals: Sequence[Residual],
            holdout: Holdout) -> FigureIntervals:
    fig = FigureIntervals(r.case.id, r.case.role, m.metric, m.kind, m.measured, m.predicted)
    if m.predicted is None or m.predicted <= 0:
        for s in SOURCES:
            fig.missing[s] = "no point prediction (offsim rejects the case)"
        return fig
    u = [time_ratio(m.metric, v, m.predicted) for v in (draws.values.get(m.metric, ()) if draws else ())]
    if u and draws is not None:
        fig.intervals["inputs"] = _from_ratios("inputs", m.metric, m.predicted, u,
                                               f"{len(u)} of {draws.samples} input draws")
        fig = replace(fig, drivers=drivers(draws, m.metric))
    else:
        fig.missing["inputs"] = "no input draws" if draws is None else "no input draw fits"
    pool, basis = _held_out_pool(r.case, m.kind, residuals, holdout)
    if pool:
        fig.intervals["model"] = _from_ratios("model", m.metric, m.predicted, pool, basis)
    else:
        fig.missing["model"] = basis
    if u and pool:
        fig.intervals["combined"] = _from_ratios("combined", m.metric, m.predicted,
                                                 [a * b for a in u for b in pool], f"{len(u)} x {len(pool)}")
    else:
        fig.missing["combined"] = "needs both the inputs and the model interval"
    return fig


def figure_intervals(results: Sequence[CaseResult], draws: Mapping[str, Draws] | None = None,
                     holdout: Holdout = "source") -> list[FigureIntervals]:
    """Every figure of every case with its intervals (``draws`` by case id, from :func:`case_draws`)."""
    residuals = _residuals(results)
    return [_figure(r, m, (draws or {}).get(r.case.id), residuals, holdout) for r in results for m in r.measures]


# ----------------------------------------------------------------------------- coverage
@dataclass(frozen=True)
class CoverageStats:
    """How often one source's intervals hold, over the validation figures of one kind (or all)."""

    source: str
    kind: str
    figures: int  # validation figures with an interval from this source
    covered: int
    without: int  # validation figures without one
    sharpness: float | None  # median p90 / p10

    @property
    def coverage(self) -> float | None:
        """Share of figures whose measured value lies within [p10, p90]."""
        return self.covered / self.figures if self.figures else None

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable form."""
        return {"source": self.source, "kind": self.kind, "figures": self.figures, "covered": self.covered,
                "without": self.without, "coverage": self.coverage, "sharpness": self.sharpness}


def _stats(source: str, kind: str, figures: Sequence[FigureIntervals]) -> CoverageStats:
    have = [f for f in figures if source in f.intervals]
    sharp = [f.intervals[source].sharpness for f in have]
    return CoverageStats(source, kind, len(have), sum(f.intervals[source].covers(f.measured) for f in have),
                         len(figures) - len(have), statistics.median(sharp) if sharp else None)


def coverage(figures: Sequence[FigureIntervals]) -> list[CoverageStats]:
    """Coverage and sharpness per source, over all validation figures and per kind of figure
    (calibration cases left out: their numbers built the profiles)."""
    evidence = [f for f in figures if f.role == "validation"]
    kinds = [k for k in MetricKind if any(f.kind is k for f in evidence)]
    out = []
    for source in SOURCES:
        out.append(_stats(source, "all", evidence))
        out.extend(_stats(source, str(k), [f for f in evidence if f.kind is k]) for k in kinds)
    return out
