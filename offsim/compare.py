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

Regret against OPT: bytes are scored against the exact offline optimum of each cache (see
:mod:`offsim.cache_stats`); stall time (the GPU waiting for parameters plus the CPU optimizer
waiting for sub-groups) and iteration time against a twin run of the same variant whose caches
follow the OPT policy within the same budget (the twin may occasionally wait longer: OPT
minimises bytes, not waiting).
"""

from __future__ import annotations

import math
import re
from typing import Any

import pandas as pd

from offsim.config.hardware import HardwareProfile
from offsim.config.run import make_run_config
from offsim.config.strategy import Strategy
from offsim.config.workload import Workload
from offsim.engine.run import simulate
from offsim.errors import ConfigError, PolicyError
from offsim.results import RunResult

CACHING = ("lru", "fifo", "mru", "lfu", "belady", "opt")
ACTIVATIONS = ("keep", "recompute", "offload-cpu", "offload-nvme")
ORDERS = ("same", "alternating")
SHORTHANDS = ["reuse-distance", *CACHING, "keep-last-K", "keep-first-K", "no-prefetch", "lookahead-K",
              "bucket", "bucket-P", "window", *ACTIVATIONS, *ORDERS]
DEFAULT_POLICIES = "reuse-distance,lru,fifo,mru,lfu,belady,opt"


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


def _opt_twin(result: RunResult) -> Strategy:
    """The variant with its caches following OPT within the budget the variant used."""
    st = result.config.strategy
    fields: dict[str, Any] = {"eviction": {"kind": "opt"}, "dram_eviction": {"kind": "opt"}}
    gpu = result.metrics.cache.get("gpu_params")
    if gpu is not None and st.policies.gpu_param_buffer_gib is None:
        fields["gpu_param_buffer_gib"] = max(gpu.peak_bytes, 1.0) / 2**30
    return st.model_copy(update={"policies": type(st.policies).model_validate(
        {**st.policies.model_dump(), **fields})})


def _total_bytes(result: RunResult) -> float:
    t = result.metrics.traffic_bytes
    return t.h2d + t.d2h + t.nvme_read + t.nvme_write


def _cache_stall(result: RunResult) -> float:
    """Seconds per iteration the consumers of the caches waited (GPU for parameters, CPU
    optimizer for sub-groups)."""
    return sum(c.stall_s for c in result.metrics.cache.values())


def _row(label: str, result: RunResult, twin: RunResult | None) -> dict[str, Any]:
    m = result.metrics
    row: dict[str, Any] = {"variant": label, "strategy": result.config.strategy.name, "feasible": m.feasible,
                           "infeasible_reason": m.infeasible_reason}
    if not m.feasible:
        return row
    row.update({"iteration_time_s": m.iteration_time_s, "stall_s": m.stall_s})
    row.update({f"{link}_bytes": v for link, v in m.traffic_bytes.model_dump().items()})
    row.update({f"peak_{tier}_bytes": v for tier, v in m.peak_bytes.model_dump().items()})
    for name, c in m.cache.items():
        row[f"hit_rate_{name}"] = c.hit_rate
        row[f"stall_{name}_s"] = c.stall_s
        row[f"regret_{name}_bytes"] = c.regret_bytes
    row["regret_bytes"] = sum(c.regret_bytes for c in m.cache.values())
    row["opt_exact"] = all(c.opt_exact for c in m.cache.values())
    row["cache_stall_s"] = _cache_stall(result)
    if twin is not None and twin.feasible:
        row["regret_stall_s"] = row["cache_stall_s"] - _cache_stall(twin)
        row["regret_iteration_s"] = m.iteration_time_s - twin.metrics.iteration_time_s
        row["regret_total_bytes"] = _total_bytes(result) - _total_bytes(twin)
    return row


def run_variants(hardware: HardwareProfile | str, workload: Workload | str,
                 variants: list[tuple[str, Strategy]], iterations: int = 3, warmup: int = 1,
                 score: bool = True) -> tuple[pd.DataFrame, list[RunResult]]:
    """Simulate each ``(label, strategy)``; one row per variant (see :func:`_row` columns).

    A variant whose policy makes an illegal decision gets a row with the error as its reason;
    ``results`` holds the runs that completed."""
    rows, results = [], []
    for label, st in variants:
        cfg = make_run_config(hardware, workload, st, iterations=iterations, warmup_iterations=warmup)
        try:
            result = simulate(cfg)
        except PolicyError as exc:  # one variant's illegal decision does not stop the others
            rows.append({"variant": label, "strategy": st.name, "feasible": False,
                         "infeasible_reason": f"policy error: {exc}"})
            continue
        twin = None
        if score and result.feasible and result.metrics.cache:
            twin = simulate(make_run_config(hardware, workload, _opt_twin(result), iterations=iterations,
                                            warmup_iterations=warmup))
        rows.append(_row(label, result, twin))
        results.append(result)
    return pd.DataFrame(rows), results


def policy_variants(base: Strategy, policies: str, param_buffer_gib: float | str | None = "auto",
                    dram_cache_gib: float | None = None) -> list[tuple[str, Strategy]]:
    """One variant of ``base`` per comma-separated item of ``policies``."""
    fields: dict[str, Any] = {}
    if param_buffer_gib is not None:
        fields["gpu_param_buffer_gib"] = param_buffer_gib
    if dram_cache_gib is not None:
        fields["dram_cache_gib"] = dram_cache_gib
    items = [p.strip() for p in policies.split(",") if p.strip()]
    return [(item, apply_policies(base, item, **fields)) for item in items]


# ---------------------------------------------------------------- ROK curve
def rok_points(n_blocks: int, points: int) -> list[int]:
    """Block counts from 0 to ``n_blocks``, at most ``points`` of them, evenly spread."""
    if points < 2 or n_blocks == 0:
        return [0, n_blocks] if n_blocks else [0]
    return sorted({round(i * n_blocks / (points - 1)) for i in range(points)})


def rok_curve(hardware: HardwareProfile | str, workload: Workload | str, base: Strategy, points: int = 6,
              iterations: int = 3, warmup: int = 1) -> pd.DataFrame:
    """Memory saved against time cost of each activation placement, per number of blocks.

    For each placement (recompute, offload to DRAM, offload to NVMe when the profile has it) and
    each count ``n``, the first ``n`` blocks take that placement and the others keep their
    activations in HBM (ProTrain-style per-block choice). Memory is the peak GPU bytes of the
    run (the planner's estimate when it does not fit); both deltas are against keeping all.
    (Wu et al., TBA, arXiv 2408.10013, Sec. 3: the recompute-offload-keep curve.)
    """
    cfg0 = make_run_config(hardware, workload, base, iterations=iterations, warmup_iterations=warmup)
    n_blocks = cfg0.workload.model.layers
    placements = [("recompute", {"recompute": None}), ("offload-cpu", {"offload": None, "tier": "cpu"})]
    if cfg0.hardware.nvme is not None:
        placements.append(("offload-nvme", {"offload": None, "tier": "nvme"}))
    keep = _rok_run(cfg0.hardware, cfg0.workload, base, {"kind": "keep"}, iterations, warmup)
    rows = []
    for name, template in placements:
        for n in rok_points(n_blocks, points):
            fields = {k: (n if v is None else v) for k, v in template.items()}
            policy = {"kind": "per-block", **fields}
            r = _rok_run(cfg0.hardware, cfg0.workload, base, policy, iterations, warmup)
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
