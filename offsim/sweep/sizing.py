"""Reverse sizing: the cheapest (or smallest) machine that meets a time or throughput target.

The varied dimensions are treated as **monotone**: each one's values are ordered from less to
more capability (more DRAM, more drives, a newer PCIe generation, more cores; for a block swap
such as ``gpu``, the order given), and more capability never makes a point slower or unable to
fit, nor cheaper. Under that assumption the points that meet the target form an up-set of the
grid, and the cheapest one is among its *minimal* elements, which a staircase walk finds
without the full grid:

* the two dimensions with the most values are walked as a staircase (for each value of the
  first, the smallest value of the second that meets the target; that smallest value never
  rises as the first grows), which costs about ``n1 + n2`` evaluations instead of ``n1 x n2``;
* the other dimensions are enumerated, and a combination whose cheapest corner already costs
  more than the second-best answer found so far is skipped;
* with the pre-filter on, a point that does not fit in memory (the footprint check), or whose
  time bound misses the target, is settled without simulating (the bound is the least steady
  iteration time read off the point's compiled schedule,
  :func:`offsim.plan.time_bound.time_lower_bound`; that schedule is the one then simulated).

The objective is ``cost`` (the machine's purchase price, :func:`offsim.sweep.cost.capex_usd`;
ties go to the smaller machine) or ``size`` (the sum of each dimension's position in its value
list: the "smallest" machine). The answer comes with the runner-up (the cheapest other minimal
point, i.e. a genuinely different trade-off, not the answer plus one more part) and, for each
dimension, what happens one step below the answer's value: the evidence that every part of the
answer is needed.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from offsim.config.hardware import HardwareProfile
from offsim.errors import ConfigError
from offsim.sweep.cost import capex_usd
from offsim.sweep.evaluate import Goal, Payload, evaluate_point
from offsim.sweep.overrides import OverrideError, apply_overrides, resolve_axis
from offsim.sweep.spec import CostAssumptions, SweepPlan, make_plan, point_id
from offsim.sweep.store import rows_to_frame

#: Candidate values of the hardware aliases when ``--values`` does not give them.
DEFAULT_VALUES: dict[str, list[Any]] = {
    "dram_gib": [32, 64, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048],
    "nvme_drives": [1, 2, 3, 4, 6, 8],
    "pcie_gen": [3, 4, 5],
    "cpu_cores": [8, 16, 24, 32, 48, 64, 96, 128],
}

Index = tuple[int, ...]


@dataclass
class Candidate:
    """One evaluated combination."""

    index: Index
    overrides: dict[str, Any]
    row: dict[str, Any]
    objective: float
    size: int

    @property
    def key(self) -> tuple[float, int, float, Index]:
        """Sort key: objective, then the smaller machine, then the faster, then the index."""
        t = self.row.get("iteration_time_s")
        return (self.objective, self.size, t if isinstance(t, float) else math.inf, self.index)


@dataclass
class Sizing:
    """The outcome of :func:`size`.

    Attributes:
        answer: the cheapest combination that meets the target (None if none does).
        largest: the combination with every dimension at its largest value (evaluated first:
            when even it misses the target, nothing else is evaluated).
        runner_up: the cheapest other minimal combination that meets it.
        steps_down: per dimension, the answer with that dimension one value lower (None at the
            lowest value).
        objective: ``cost`` or ``size``.
        dims: the varied dimensions and their ordered values.
        evaluated: every evaluated row (a tidy table).
        grid_points: size of the full grid the search avoided.
        notes: remarks (free dimensions, assumptions).
    """

    answer: Candidate | None
    runner_up: Candidate | None
    largest: Candidate
    steps_down: dict[str, Candidate | None]
    objective: str
    dims: dict[str, list[Any]]
    goal: Goal
    evaluated: pd.DataFrame
    grid_points: int
    notes: list[str] = field(default_factory=list)


class _Search:
    """Memoised evaluation of grid indices and the objective of each."""

    def __init__(
        self, plan: SweepPlan, dims: dict[str, list[Any]], goal: Goal, objective: str, prefilter: bool
    ) -> None:
        self.plan, self.dims, self.goal, self.objective = plan, dims, goal, objective
        self.keys = list(dims)
        self.payload = Payload.from_plan(plan, prefilter)
        self.rows: dict[Index, dict[str, Any]] = {}
        self._hw_cache: dict[Index, HardwareProfile | None] = {}

    def overrides(self, idx: Index) -> dict[str, Any]:
        return {k: self.dims[k][i] for k, i in zip(self.keys, idx, strict=True)}

    def row(self, idx: Index) -> dict[str, Any]:
        if idx not in self.rows:
            ov = self.overrides(idx)
            self.rows[idx] = evaluate_point(
                self.payload, len(self.rows), point_id(ov, self.plan.library), ov, goal=self.goal
            )
        return self.rows[idx]

    def meets(self, idx: Index) -> bool:
        return self.goal.met(self.row(idx))

    def hardware(self, idx: Index) -> HardwareProfile | None:
        if idx not in self._hw_cache:
            ov = {k: v for k, v in self.overrides(idx).items() if resolve_axis(k).section == "hardware"}
            try:
                hw = apply_overrides({"hardware": self.plan.base["hardware"]}, ov, self.plan.library)[
                    "hardware"
                ]
                self._hw_cache[idx] = HardwareProfile.model_validate(hw)
            except (ValueError, OverrideError):
                self._hw_cache[idx] = None
        return self._hw_cache[idx]

    def cost(self, idx: Index) -> float:
        if self.objective == "size":
            return float(sum(idx))
        hw = self.hardware(idx)
        capex = capex_usd(hw) if hw is not None else None
        return math.inf if capex is None else capex

    def candidate(self, idx: Index) -> Candidate:
        return Candidate(idx, self.overrides(idx), self.row(idx), self.cost(idx), sum(idx))


def _staircase(search: _Search, prefix: Index, n_a: int, n_b: int, limit: float) -> list[Index]:
    """Minimal points meeting the target in the plane of the last two dimensions."""
    found: list[Index] = []
    b = n_b - 1
    have = False
    for a in range(n_a):
        if search.cost((*prefix, a, 0)) > limit:
            break
        if not have:
            if not search.meets((*prefix, a, b)):
                continue
            have = True
        while b > 0 and search.meets((*prefix, a, b - 1)):
            b -= 1
        found.append((*prefix, a, b))
        if b == 0:
            break
    return found


def _line(search: _Search, prefix: Index, n: int) -> list[Index]:
    """The smallest value of a single remaining dimension that meets the target (binary search)."""
    lo, hi = 0, n - 1
    if not search.meets((*prefix, hi)):
        return []
    while lo < hi:
        mid = (lo + hi) // 2
        if search.meets((*prefix, mid)):
            hi = mid
        else:
            lo = mid + 1
    return [(*prefix, lo)]


def _minimal_points(search: _Search) -> list[Candidate]:
    sizes = [len(v) for v in search.dims.values()]
    found: list[Candidate] = []
    best: list[float] = [math.inf, math.inf]  # the two best objectives so far
    rest = sizes[:-2] if len(sizes) >= 2 else []
    for prefix in itertools.product(*(range(n) for n in rest)):
        tail = len(sizes) - len(prefix)
        if search.cost((*prefix, *([0] * tail))) > best[1]:
            continue
        if tail == 2:
            pts = _staircase(search, prefix, sizes[-2], sizes[-1], best[1])
        else:
            pts = _line(search, prefix, sizes[-1])
        for idx in pts:
            c = search.candidate(idx)
            found.append(c)
            best = sorted([*best, c.objective])[:2]
    return sorted(found, key=lambda c: c.key)


def _order_dims(dims: dict[str, list[Any]]) -> dict[str, list[Any]]:
    """Numbers ascending; the two dimensions with the most values last (the staircase plane)."""
    out = {}
    for k, vals in dims.items():
        if all(isinstance(v, int | float) and not isinstance(v, bool) for v in vals):
            vals = sorted(vals)
        out[k] = list(vals)
    keys = sorted(out, key=lambda k: len(out[k]))
    return {k: out[k] for k in keys}


def _choose_objective(objective: str, search: _Search) -> str:
    if objective == "size":
        return "size"
    top = tuple(len(v) - 1 for v in search.dims.values())
    hw = search.hardware(top)
    known = hw is not None and capex_usd(hw) is not None
    if objective == "cost" and not known:
        raise ConfigError(
            "objective 'cost' needs prices: the profile lacks one of gpu.price_usd, cpu.price_usd, "
            "dram.price_usd_per_gib, nvme.price_usd; add them with --set (e.g. --set "
            "hardware.dram.price_usd_per_gib=3.5) or use --objective size"
        )
    return "cost" if known else "size"


def size(
    hardware: str,
    workload: str,
    strategy: str,
    vary: Sequence[str],
    goal: Goal,
    *,
    values: Mapping[str, Sequence[Any]] | None = None,
    fixed: Mapping[str, Any] | None = None,
    objective: str = "auto",
    prefilter: bool = True,
    cost: CostAssumptions | None = None,
    iterations: int = 3,
) -> Sizing:
    """Search the monotone dimensions ``vary`` for the cheapest machine that meets ``goal``.

    Args:
        vary: axis keys (aliases or dotted paths) whose values are searched.
        values: candidate values per dimension (default: :data:`DEFAULT_VALUES`).
        fixed: overrides applied to every point (e.g. prices missing from the profile).
        objective: ``cost``, ``size`` or ``auto`` (cost when the machine's price is known).
    """
    if goal.max_iteration_s is None and goal.min_tokens_per_s is None:
        raise ConfigError("give a target: --target-iteration-s or --target-tokens-per-s")
    dims = _order_dims(_dimensions(vary, dict(values or {})))
    plan = make_plan(hardware, workload, strategy, grid=dims, points=[], iterations=iterations, cost=cost,
                     name="size", fixed=dict(fixed or {}))
    search = _Search(plan, dims, goal, "size", prefilter)
    search.objective = _choose_objective(objective, search)
    largest = search.candidate(tuple(len(v) - 1 for v in dims.values()))
    minimal = _minimal_points(search) if goal.met(largest.row) else []
    answer = minimal[0] if minimal else None
    steps = _steps_down(search, answer)
    rows = [
        {**r, "objective": search.cost(idx), "meets_target": goal.met(r)} for idx, r in search.rows.items()
    ]
    return Sizing(
        answer,
        _runner_up(minimal),
        largest,
        {k: steps[k] for k in vary if k in steps},
        search.objective,
        {k: dims[k] for k in vary},  # the user's order
        goal,
        rows_to_frame(rows, list(vary)),
        math.prod(len(v) for v in dims.values()),
        _notes(search, answer),
    )


def _dimensions(vary: Sequence[str], values: dict[str, Sequence[Any]]) -> dict[str, list[Any]]:
    """Candidate values per searched dimension (given, else :data:`DEFAULT_VALUES`)."""
    dims: dict[str, list[Any]] = {}
    for key in vary:
        vals = values.get(key, DEFAULT_VALUES.get(key))
        if not vals:
            raise ConfigError(f"dimension '{key}' has no default values; give them with --values {key}=A,B,C")
        dims[key] = list(vals)
    unknown = set(values) - set(dims)
    if unknown:
        raise ConfigError(f"--values for {sorted(unknown)[0]!r}, which is not in --vary")
    return dims


def _runner_up(minimal: list[Candidate]) -> Candidate | None:
    """The next minimal point that is not simply larger than the answer in every dimension."""
    if not minimal:
        return None
    answer = minimal[0]
    return next(
        (c for c in minimal[1:] if not all(x >= y for x, y in zip(c.index, answer.index, strict=True))), None
    )


def _steps_down(search: _Search, answer: Candidate | None) -> dict[str, Candidate | None]:
    """Per dimension, the answer with that dimension one value smaller (None at the first value)."""
    steps: dict[str, Candidate | None] = {}
    if answer is None:
        return steps
    for d, key in enumerate(search.keys):
        i = answer.index[d]
        steps[key] = search.candidate((*answer.index[:d], i - 1, *answer.index[d + 1 :])) if i > 0 else None
    return steps


def _notes(search: _Search, answer: Candidate | None) -> list[str]:
    notes = []
    if search.objective == "cost" and answer is not None:
        for d, key in enumerate(search.keys):
            lo = tuple(0 if j == d else i for j, i in enumerate(answer.index))
            hi = tuple(len(search.dims[key]) - 1 if j == d else i for j, i in enumerate(answer.index))
            if search.cost(lo) == search.cost(hi):
                notes.append(
                    f"{key} changes no price in the profile; among equal prices the smaller value wins"
                )
    return notes
