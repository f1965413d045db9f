"""Side-by-side runs of several policies (``offsim compare``) and the ROK curve (``offsim rok``).

Pure orchestration over :func:`offsim.simulate`: variants of one strategy are built from short
policy names, each is simulated, and one row per variant is returned as a DataFrame. Figures
live in :mod:`offsim.report.compare_figures`; the CLI in :mod:`offsim.commands.compare`.

Policy names (``--policies``; join several with ``+``, e.g. ``lru+alternating``):

=========================================  ==================================================
``reuse-distance``                         DeepSpeed's release-after-use (the default)
``lru`` ``fifo`` ``mru`` ``lfu``           eviction of the GPU parameter buffer and the DRAM
``belady`` ``opt``                         cache of optimizer state
``keep-last-K`` ``keep-first-K``           static residency of K layers
``no-prefetch`` ``lookahead-K``            prefetch
``bucket`` ``bucket-P`` ``window``         DeepSpeed bucket (P parameters), Fuyou window
``keep`` ``recompute``                     activations
``offload-cpu`` ``offload-nvme``
``same`` ``alternating``                   optimizer sub-group order
=========================================  ==================================================

``belady-size`` is a size-aware heuristic (:mod:`offsim.policies.belady_size`). ``belady`` and
``belady-size`` are heuristics with tensors of several sizes; ``opt`` follows the plan of
:mod:`offsim.policies.opt` (exact by enumeration on the bare sequence when the run's cache metrics say
``offline_plan_exact``).
None of them is the yardstick.

Bounds and regret: every row is scored against a **lower bound** on the bytes any policy must
move with the same budgets, and the **upper bound** of the best schedule offsim constructs,
from the access sequence the engine served (:func:`offsim.cache_stats.cache_bound`, the
min-cost-flow bound of :mod:`offsim.policies.bounds`; ``bound_exact`` when they meet, i.e. the
bound is the optimum). Bytes outside the caches (gradients, activations, the optimizer's reads
of gradients) are the same for every policy and count in both bounds, so ``lower_bound_bytes``
and ``upper_bound_bytes`` are totals over all links, like ``total_bytes``; ``regret_bytes`` =
``total_bytes - lower_bound_bytes`` >= 0. Links are those between tiers (host memory copies,
``dram_copy``, are left out of the totals). Per cache, ``<cache>_bytes`` (what the policy moved
for it over all links), ``lower_bound_<cache>_bytes``, ``upper_bound_<cache>_bytes``,
``regret_<cache>_bytes``, ``bound_exact_<cache>`` and ``bound_method_<cache>`` (``foo-flow``, or
``pfoo`` on sequences too long for one flow: then the bounds rarely meet and the gap is shown).

Time: ``iteration_time_lower_bound_s`` is a lower bound on the steady iteration time any eviction
policy reaches with the row's strategy and budgets on the modelled machine
(:mod:`offsim.iteration_bound`: the least work of the compiled schedule on each resource and
stream, and the caches' least bytes, at peak rate; not a prediction: it assumes perfect overlap),
``iteration_time_bound_binding`` its largest term, ``iteration_time_above_bound_s`` the row's
distance to it (>= 0): at most what any eviction rule could still gain.

Curves: :func:`policy_variants` takes lists of GPU parameter budgets and DRAM cache sizes; a row
per policy and size, with ``cache_gib`` and ``dram_cache_gib`` (the budgets as run, GiB).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from itertools import product
from typing import Any

import pandas as pd

from offsim.api import simulate
from offsim.cache_stats import cache_bound
from offsim.config.hardware import HardwareProfile
from offsim.config.run import make_run_config
from offsim.config.strategy import Strategy
from offsim.config.workload import Workload
from offsim.core.enums import Res
from offsim.errors import ConfigError, PolicyError
from offsim.iteration_bound import iteration_lower_bound
from offsim.metrics import steady_iterations
from offsim.policies.bounds import EXACT_RTOL
from offsim.results import RunResult
from offsim.schedule.bound import GPU_COMPUTE, RES_NAMES

CACHING = ("lru", "fifo", "mru", "lfu", "belady", "belady-size", "opt")
ACTIVATIONS = ("keep", "recompute", "offload-cpu", "offload-nvme")
ORDERS = ("same", "alternating")
SHORTHANDS = ["reuse-distance", *CACHING, "keep-last-K", "keep-first-K", "no-prefetch", "lookahead-K",
              "bucket", "bucket-P", "window", *ACTIVATIONS, *ORDERS]
DEFAULT_POLICIES = "reuse-distance,lru,fifo,mru,lfu,belady,belady-size,opt"
#: Kinds of the spans that move a GPU parameter buffer miss (engine names, offsim.engine.simulate).
PARAM_FETCH_KINDS = ("param_fetch", "param_allgather")
GPU_PARAMS, DRAM_OPTIMIZER = "gpu_params", "dram_optimizer"


def _token_overrides(token: str) -> dict[str, Any]:
    """The ``policies`` fields one policy name sets."""
    if token == "reuse-distance":
        return {"eviction": {"kind": "reuse-distance"}}
    if token in CACHING:
        return {"eviction": {"kind": token}, "dram_eviction": {"kind": token}}
    if m := re.fullmatch(r"keep-(last|first)-(\d+)", token):
        return {"eviction": {"kind": "static", f"keep_{m[1]}": int(m[2])}}
    if token == "no-prefetch":
        return {"prefetch": {"kind": "none"}}
    if m := re.fullmatch(r"lookahead-(\d+)", token):
        return {"prefetch": {"kind": "lookahead", "depth": int(m[1])}}
    if token == "window":
        return {"prefetch": {"kind": "window"}}
    if m := re.fullmatch(r"bucket(?:-([0-9.eE+]+))?", token):
        return {"prefetch": {"kind": "bucket", **({"bucket_params": float(m[1])} if m[1] else {})}}
    if token in ACTIVATIONS:
        return {"activations": {"kind": token}}
    if token in ORDERS:
        return {"optimizer_order": {"kind": token}}
    raise ConfigError(f"unknown policy name '{token}'; valid names: {', '.join(SHORTHANDS)} "
                      f"(join several with '+')")


def apply_policies(strategy: Strategy, spec: str, **policy_fields: Any) -> Strategy:
    """``strategy`` with the policies named in ``spec`` (``lru+alternating``) and the given
    ``policies`` fields (``gpu_param_buffer_gib=...``) set; named ``<strategy>+<spec>``."""
    fields = strategy.policies.model_dump()
    for token in filter(None, spec.split("+")):
        fields.update(_token_overrides(token.strip()))
    fields.update(policy_fields)
    try:
        policies = type(strategy.policies).model_validate(fields)
    except ValueError as exc:
        raise ConfigError(f"policies '{spec}': {exc}") from None
    return strategy.model_copy(update={"policies": policies})


#: Traffic that stays inside one tier (host memory copies): not a link between tiers.
WITHIN_TIER = ("dram_copy",)


def _links(result: RunResult) -> dict[str, float]:
    """Bytes per iteration on each link between tiers (PCIe both ways, NVMe, GPU links, PFS)."""
    return {k: v for k, v in result.metrics.traffic_bytes.model_dump().items() if k not in WITHIN_TIER}


def _total_bytes(result: RunResult) -> float:
    """Bytes per iteration over all links between tiers."""
    return float(sum(_links(result).values()))


def _cache_stall(result: RunResult) -> float:
    """Seconds per iteration the consumers of the caches waited (GPU for parameters, CPU
    optimizer for sub-groups)."""
    return sum(c.stall_s for c in result.metrics.cache.values())


def _steady(result: RunResult) -> list[int]:
    return steady_iterations(result.config, result.recorder)[0]


def param_link_bytes(result: RunResult) -> tuple[float, dict[int, float]]:
    """Bytes per steady iteration the GPU parameter buffer's misses moved over all links, and per
    layer the link bytes one byte of a miss costs (host reads, H2D copy, all-gather), both
    measured from the run's spans."""
    steady = set(_steady(result))
    links = set(_links(result))
    moved: dict[int, float] = {}
    for s in result.recorder.spans:
        if s.iteration in steady and s.kind in PARAM_FETCH_KINDS and s.resource in links:
            moved[s.layer] = moved.get(s.layer, 0.0) + s.bytes
    missed: dict[int, float] = {}
    for e in result.recorder.cache_events:
        if e.cache == GPU_PARAMS and e.kind == "miss" and e.iteration in steady:
            missed[e.tensor] = missed.get(e.tensor, 0.0) + e.bytes
    factor = {t: moved.get(t, 0.0) / b for t, b in missed.items() if b > 0}
    return sum(moved.values()) / len(steady), factor


def cache_link_bytes(result: RunResult) -> dict[str, tuple[float, float, float, bool, str]]:
    """Per cache: bytes per iteration the policy moved for it over all links, the lower and upper
    bound on them (any policy, same budget and sequence), whether the bound is exact, and how it
    was computed (``foo-flow``: one min-cost flow; ``pfoo``: flows over segments, for long
    sequences, :mod:`offsim.policies.bounds`).

    A DRAM-cache miss reads the sub-group's state and a write-back writes it, one byte per byte
    (``offsim.engine.optimizer_cache``); a GPU-buffer miss moves what the spans show."""
    out = {}
    steady = _steady(result)
    for name, c in result.metrics.cache.items():
        if name == GPU_PARAMS:
            moved, factor = param_link_bytes(result)
            b = cache_bound(result.recorder, name, steady, factor)
        else:
            moved = c.bytes_fetched + c.bytes_written_back
            b = cache_bound(result.recorder, name, steady)
        out[name] = (moved, b.lower_bytes, b.upper_bytes, b.exact, str(b.method))
    return out


def _budgets(result: RunResult) -> dict[str, float | None]:
    """The caches' budgets as run, GiB (None: unbounded, or no such cache)."""
    out: dict[str, float | None] = {"cache_gib": None, "dram_cache_gib": None}
    for name, col in ((GPU_PARAMS, "cache_gib"), (DRAM_OPTIMIZER, "dram_cache_gib")):
        c = result.metrics.cache.get(name)
        if c is not None and c.capacity_bytes is not None:
            out[col] = c.capacity_bytes / 2**30
    return out


def _bound_columns(result: RunResult) -> dict[str, Any]:
    """Totals and per-cache bounds (see the module docstring)."""
    total = _total_bytes(result)
    row: dict[str, Any] = {"total_bytes": total}
    outside, lower, upper, exact = total, 0.0, 0.0, True
    for name, (moved, lo, up, ex, method) in cache_link_bytes(result).items():
        row.update({f"{name}_bytes": moved, f"lower_bound_{name}_bytes": lo, f"upper_bound_{name}_bytes": up,
                    f"regret_{name}_bytes": _regret(moved, lo), f"bound_exact_{name}": ex,
                    f"bound_method_{name}": method})
        outside, lower, upper, exact = outside - moved, lower + lo, upper + up, exact and ex
    row.update({"lower_bound_bytes": outside + lower, "upper_bound_bytes": outside + upper,
                "regret_bytes": _regret(total, outside + lower), "bound_exact": exact})
    return row


def _regret(moved: float, lower: float) -> float:
    """``moved - lower``; differences within float rounding of the sums read as 0."""
    r = moved - lower
    return 0.0 if abs(r) <= 1e-9 * max(abs(moved), 1.0) else r


def _row(label: str, result: RunResult) -> dict[str, Any]:
    m = result.metrics
    row: dict[str, Any] = {"variant": label, "strategy": result.config.strategy.name, "feasible": m.feasible,
                           "infeasible_reason": m.infeasible_reason}
    row.update(_budgets(result))
    if not m.feasible:
        return row
    row.update({"iteration_time_s": m.iteration_time_s, "stall_s": m.stall_s})
    row.update({f"{link}_bytes": v for link, v in m.traffic_bytes.model_dump().items()})
    row.update({f"peak_{tier}_bytes": v for tier, v in m.peak_bytes.model_dump().items()})
    for name, c in m.cache.items():
        row[f"hit_rate_{name}"] = c.hit_rate
        row[f"stall_{name}_s"] = c.stall_s
    row["cache_stall_s"] = _cache_stall(result)
    row.update(_bound_columns(result))
    row.update(_time_bound_columns(result))
    return row


def _time_bound_columns(result: RunResult) -> dict[str, Any]:
    """The lower bound on the iteration time any eviction policy reaches with this row's
    strategy and budgets (:func:`offsim.iteration_bound.iteration_lower_bound`), its binding
    term, and how far above it the row is (>= 0)."""
    b = iteration_lower_bound(result)
    seconds = result.metrics.iteration_time_s
    return {"iteration_time_lower_bound_s": b.seconds, "iteration_time_bound_binding": b.binding,
            "iteration_time_above_bound_s": math.nan if seconds is None else seconds - b.seconds}


def run_variants(hardware: HardwareProfile | str, workload: Workload | str,
                 variants: Sequence[tuple[str, Strategy | str]], iterations: int = 3, warmup: int = 1,
                 on_variant: Callable[[str], None] | None = None) -> tuple[pd.DataFrame, list[RunResult]]:
    """Simulate each ``(label, strategy)``; one row per variant (see :func:`_row` columns).

    A strategy given by name or path is read with the workload as ``offsim run`` reads it
    (:func:`~offsim.config.run.make_run_config`): a DeepSpeed, Accelerate or Megatron-Core file
    resolves its ``"auto"`` values from the model and sets the batch of its own row.

    A variant whose policy makes an illegal decision gets a row with the error as its reason;
    ``results`` holds the runs that completed. ``on_variant(label)`` is called after each
    variant (progress)."""
    rows, results = [], []
    for label, st in variants:
        cfg = make_run_config(hardware, workload, st, iterations=iterations, warmup_iterations=warmup)
        try:
            result = simulate(cfg)
        except PolicyError as exc:  # one variant's illegal decision does not stop the others
            rows.append({"variant": label, "strategy": cfg.strategy.name, "feasible": False,
                         "infeasible_reason": f"policy error: {exc}"})
        else:
            rows.append(_row(label, result))
            results.append(result)
        if on_variant is not None:
            on_variant(label)
    return tighten_upper_bounds(pd.DataFrame(rows)), results


def tighten_upper_bounds(table: pd.DataFrame) -> pd.DataFrame:
    """The runs are schedules too: per cache, among rows of one strategy and budgets that bound
    the same sequence (equal lower bounds), the upper bound is at most the fewest bytes a row
    moved for that cache (the engine keeps the same budget, with prefetch only taking room).
    ``bound_exact`` and the totals follow."""
    if table.empty or "upper_bound_bytes" not in table:
        return table
    table = table.copy()
    caches = [c[len("upper_bound_"):-len("_bytes")] for c in table
              if c.startswith("upper_bound_") and c != "upper_bound_bytes"]
    exact = pd.Series(True, index=table.index)
    for name in caches:
        lo, up, moved = table[f"lower_bound_{name}_bytes"], table[f"upper_bound_{name}_bytes"], table[f"{name}_bytes"]
        key = [table["strategy"], table["cache_gib"].fillna(-1), table["dram_cache_gib"].fillna(-1), (lo / 1e3).round()]
        best = moved.groupby(key, dropna=False).transform("min")
        tighter = up.where(~(best < up), best)
        table["upper_bound_bytes"] += (tighter - up).fillna(0.0)
        table[f"upper_bound_{name}_bytes"] = tighter
        met = (tighter - lo) <= EXACT_RTOL * tighter.clip(lower=1.0)
        table[f"bound_exact_{name}"] = met.where(lo.notna(), table[f"bound_exact_{name}"])
        exact &= met | lo.isna()
    table["bound_exact"] = exact.where(table["lower_bound_bytes"].notna(), table["bound_exact"])
    return table


def policy_variants(base: Strategy, policies: str,
                    param_buffer_gib: float | str | Sequence[float | str | None] | None = "auto",
                    dram_cache_gib: float | Sequence[float | None] | None = None) -> list[tuple[str, Strategy]]:
    """One variant of ``base`` per comma-separated item of ``policies`` and per budget: every
    GPU parameter budget in ``param_buffer_gib`` with every DRAM cache size in
    ``dram_cache_gib`` (a single value, or a list for curves over cache size)."""
    buffers = list(param_buffer_gib) if isinstance(param_buffer_gib, list | tuple) else [param_buffer_gib]
    drams = list(dram_cache_gib) if isinstance(dram_cache_gib, list | tuple) else [dram_cache_gib]
    items = [p.strip() for p in policies.split(",") if p.strip()]
    out = []
    for buffer, dram, item in product(buffers, drams, items):
        fields: dict[str, Any] = {}
        if buffer is not None:
            fields["gpu_param_buffer_gib"] = buffer
        if dram is not None:
            fields["dram_cache_gib"] = dram
        out.append((item, apply_policies(base, item, **fields)))
    return out


# ---------------------------------------------------------------- reading the study
def _feasible(table: pd.DataFrame) -> pd.DataFrame:
    ok = table[table["feasible"].astype(bool)] if "feasible" in table else table
    return ok if "iteration_time_s" in ok else ok.iloc[0:0]


def _budget_groups(table: pd.DataFrame) -> list[tuple[tuple[Any, Any], pd.DataFrame]]:
    """Feasible rows grouped by (GPU buffer GiB, DRAM cache GiB), smallest first."""
    ok = _feasible(table)
    if ok.empty:
        return []
    return [((a, b), part) for (a, b), part in ok.groupby(["cache_gib", "dram_cache_gib"], dropna=False,
                                                            sort=True)]


def _budget_words(cache_gib: Any, dram_gib: Any) -> str:
    parts = []
    if cache_gib is not None and not _nan(cache_gib):
        parts.append(f"the GPU parameter buffer at {cache_gib:.3g} GiB")
    if dram_gib is not None and not _nan(dram_gib):
        parts.append(f"a DRAM cache of {dram_gib:.3g} GiB" if dram_gib > 0 else "no DRAM cache")
    return " and ".join(parts) or "these budgets"


def _nan(x: Any) -> bool:
    return isinstance(x, float) and math.isnan(x)


#: Iteration times within this relative distance of each other are a tie.
TIE_REL = 1e-9


def _names(variants: Sequence[str]) -> str:
    """The variants quoted and joined: "`a`", "`a` and `b`", "`a`, `b` and `c`"."""
    quoted = [f"`{v}`" for v in variants]
    return quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} and {quoted[-1]}"


def _fastest(part: pd.DataFrame) -> tuple[pd.Series, str, str]:
    """The row the sentence names, the words that name it, and how a tie was broken. The rule:
    the fastest iteration (times within :data:`TIE_REL` tie); of tied rows, the one that moves
    the fewest bytes per iteration; of those, the first listed."""
    fastest_s = part["iteration_time_s"].min()
    tied = part[part["iteration_time_s"] <= fastest_s * (1 + TIE_REL)]
    fewest = tied[tied["total_bytes"] <= tied["total_bytes"].min() * (1 + TIE_REL)]
    best = fewest.iloc[0]
    name = f"`{best['variant']}`"
    if len(tied) == 1:
        return best, f"{name} is fastest", ""
    if len(fewest) == 1:
        why = "it moves the fewest bytes of them"
    elif len(fewest) == len(tied):
        why = "they move the same bytes and it is listed first"
    else:
        why = f"of those moving the fewest bytes ({_names(list(fewest['variant']))}) it is listed first"
    return best, f"{_names(list(tied['variant']))} tie as fastest", f"; {name} is named below: {why}"


def _slower(part: pd.DataFrame, best: pd.Series) -> str:
    """", X s faster than `w`", every variant tied as slowest named; empty when all tie."""
    slowest_s = part["iteration_time_s"].max()
    gain = slowest_s - best["iteration_time_s"]
    if gain <= best["iteration_time_s"] * TIE_REL:
        return ""
    worst = list(part[part["iteration_time_s"] >= slowest_s * (1 - TIE_REL)]["variant"])
    tie = ", which tie as slowest" if len(worst) > 1 else ""
    return f", {gain:.3g} s faster than {_names(worst)}{tie}"


def decision(table: pd.DataFrame) -> str:
    """One sentence: per budget, the fastest policy (ties named, and broken by fewer bytes moved,
    then by the order given), its iteration time against the slowest, and how far its bytes are
    from the lower bound."""
    clauses = []
    for (cache_gib, dram_gib), part in _budget_groups(table):
        best, fastest, tie = _fastest(part)
        clauses.append(f"with {_budget_words(cache_gib, dram_gib)}, {fastest} "
                       f"({best['iteration_time_s']:.4g} s per iteration{_slower(part, best)}{tie}); "
                       f"`{best['variant']}` moves {best['total_bytes'] / 1e9:.4g} GB per iteration, "
                       f"{_against_bound(best)}{_against_time_bound(part, best)}")
    if not clauses:
        return "No variant fits."
    text = "; ".join(clauses)
    return text[0].upper() + text[1:] + "."


def _against_bound(row: pd.Series) -> str:
    """How a row's bytes compare with the bounds, in words."""
    gap = (row["upper_bound_bytes"] - row["lower_bound_bytes"]) / 1e9
    bound = ("the optimum" if bool(row["bound_exact"])
             else f"the lower bound ({gap:.3g} GB below the best schedule found)")
    if row["regret_bytes"] <= 0:
        return f"at {bound}"
    rel = row["regret_bytes"] / row["lower_bound_bytes"]
    return f"{row['regret_bytes'] / 1e9:.3g} GB ({rel:.2%}) above {bound}"


#: What a binding term of the time bound is, in words (offsim.iteration_bound).
BINDING_WORDS = {RES_NAMES[Res.NVME]: "the NVMe array busy with the fewest bytes any policy moves",
                 RES_NAMES[Res.H2D]: "host-to-GPU copies of the fewest bytes any policy moves",
                 RES_NAMES[Res.D2H]: "GPU-to-host copies", GPU_COMPUTE: "the GPU's compute stream",
                 RES_NAMES[Res.CPU]: "the CPU optimizer", RES_NAMES[Res.DRAM]: "host memory traffic"}


def _against_time_bound(part: pd.DataFrame, best: pd.Series) -> str:
    """``; no policy ... below X s (binding) ...``: the smallest of the budget's time bounds (a
    bound for every row of it), and the fastest row's distance to it."""
    if "iteration_time_lower_bound_s" not in part or part["iteration_time_lower_bound_s"].isna().all():
        return ""
    low = part.loc[part["iteration_time_lower_bound_s"].idxmin()]
    seconds, binding = float(low["iteration_time_lower_bound_s"]), str(low["iteration_time_bound_binding"])
    gap = best["iteration_time_s"] - seconds
    return (f"; no policy can take less than {seconds:.4g} s per iteration with these budgets (a lower bound: "
            f"{BINDING_WORDS.get(binding, binding)}, at peak rate), {gap:.3g} s ({gap / seconds:.1%}) below "
            f"`{best['variant']}`: at most what a better eviction rule could gain")


def anomalies(table: pd.DataFrame, column: str = "cache_gib") -> list[str]:
    """Policies that move more bytes with a larger ``column`` budget (Belady's anomaly: FIFO
    can; LRU and the bound cannot, see ``tests/test_policy_bounds.py``)."""
    ok = _feasible(table)
    if column not in ok or ok[column].nunique() < 2 or "total_bytes" not in ok:
        return []
    out = []
    other = "dram_cache_gib" if column == "cache_gib" else "cache_gib"
    for (variant, _), part in ok.groupby(["variant", ok[other].fillna(-1)], sort=False):
        part = part.sort_values(column)
        totals, sizes = list(part["total_bytes"]), list(part[column])
        for k in range(1, len(totals)):
            if totals[k] > totals[k - 1] * (1 + 1e-9):
                out.append(f"{variant}: {(totals[k] - totals[k - 1]) / 1e9:.3g} GB more per iteration at "
                           f"{sizes[k]:.3g} GiB than at {sizes[k - 1]:.3g} GiB")
    return out


# ---------------------------------------------------------------- ROK curve
def rok_points(n_blocks: int, points: int) -> list[int]:
    """Block counts from 0 to ``n_blocks``, at most ``points`` of them, evenly spread."""
    if points < 2 or n_blocks == 0:
        return [0, n_blocks] if n_blocks else [0]
    return sorted({round(i * n_blocks / (points - 1)) for i in range(points)})


def _rok_placements(hardware: HardwareProfile, workload: Workload, points: int
                    ) -> list[tuple[str, int, dict[str, Any]]]:
    """The ROK curve's points: (placement, blocks, activation policy), placement by placement."""
    templates: list[tuple[str, dict[str, str | None]]] = [
        ("recompute", {"recompute": None}), ("offload-cpu", {"offload": None, "tier": "cpu"})]
    if hardware.nvme is not None:
        templates.append(("offload-nvme", {"offload": None, "tier": "nvme"}))
    out = []
    for name, template in templates:
        for n in rok_points(workload.model.layers, points):
            fields = {k: (n if v is None else v) for k, v in template.items()}
            out.append((name, n, {"kind": "per-block", **fields}))
    return out


def rok_runs(hardware: HardwareProfile | str, workload: Workload | str, base: Strategy, points: int = 6) -> int:
    """How many simulations :func:`rok_curve` runs (its points, and keeping everything)."""
    cfg0 = make_run_config(hardware, workload, base)
    return len(_rok_placements(cfg0.hardware, cfg0.workload, points)) + 1


def rok_curve(hardware: HardwareProfile | str, workload: Workload | str, base: Strategy, points: int = 6,
              iterations: int = 3, warmup: int = 1, on_run: Callable[[], None] | None = None) -> pd.DataFrame:
    """Memory saved against time cost of each activation placement, per number of blocks.

    For each placement (recompute, offload to DRAM, offload to NVMe when the profile has it) and
    each count ``n``, the first ``n`` blocks take that placement and the others keep their
    activations in HBM (ProTrain-style per-block choice). Memory is the peak GPU bytes of the
    run (the planner's estimate when it does not fit); both deltas are against keeping all.
    ``on_run()`` is called after each simulation (progress; :func:`rok_runs` of them).
    (Wu et al., TBA, arXiv 2408.10013, Sec. 3: the recompute-offload-keep curve.)
    """
    cfg0 = make_run_config(hardware, workload, base, iterations=iterations, warmup_iterations=warmup)
    done = on_run or (lambda: None)
    keep = _rok_run(cfg0.hardware, cfg0.workload, base, {"kind": "keep"}, iterations, warmup)
    done()
    rows = []
    for name, n, policy in _rok_placements(cfg0.hardware, cfg0.workload, points):
        r = _rok_run(cfg0.hardware, cfg0.workload, base, policy, iterations, warmup)
        done()
        rows.append({"placement": name, "blocks": n, **r,
                     "memory_saved_bytes": keep["gpu_bytes"] - r["gpu_bytes"],
                     "time_cost_s": (r["iteration_time_s"] - keep["iteration_time_s"])
                     if r["feasible"] and keep["feasible"] else math.nan})
    return pd.DataFrame(rows)


def _rok_run(hw: HardwareProfile, wl: Workload, base: Strategy, activations: dict[str, Any], iterations: int,
             warmup: int) -> dict[str, Any]:
    st = base.model_copy(update={"policies": type(base.policies).model_validate(
        {**base.policies.model_dump(), "activations": activations})})
    result = simulate(make_run_config(hw, wl, st, iterations=iterations, warmup_iterations=warmup))
    m = result.metrics
    gpu = m.peak_bytes.gpu if m.feasible else result.footprint_bytes["need"]["gpu"]
    return {"feasible": m.feasible, "iteration_time_s": m.iteration_time_s if m.feasible else math.nan,
            "gpu_bytes": gpu}
