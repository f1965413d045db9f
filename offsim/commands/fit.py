"""``offsim fit``: will this model train on this machine, with which strategy, and how fast.

For each strategy (every shipped one, or those given with ``-s``), the planner's peak of each
memory tier (:func:`offsim.fit_check.footprint`: per GPU; pinned host, host and NVMe per
node; start-up transients of pinning included) and the host's start-up peak while the model is
loaded and the optimizer built (:func:`offsim.plan.startup.startup_peak`) are checked against
the profile's capacity. Those that fit are simulated (:func:`offsim.simulate`, the same
iterations as ``offsim run``) and listed fastest first; those that do not fit are not simulated
and follow with the tier, the need and the capacity (where the simulation itself overflowed, the
engine's level). Under them, DeepSpeed's own estimator table for the same model
(:mod:`offsim.plan.ds_estimator`) and, per strategy that runs on DeepSpeed (:func:`on_deepspeed`)
and maps onto one of its lines, where offsim's figure differs and why: the estimator counts model
states only. Without such a strategy there is no table.

``-o FILE`` writes the strategies as CSV (:func:`fit_table`); nothing is written otherwise. Exit
status (:mod:`offsim.commands._common`): 0 when at least one strategy fits, 1 when none does, 2 on
bad input.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from offsim.commands import _options as opt
from offsim.commands._common import ExitCode, check_out_file, console, fail, print_json, say

if TYPE_CHECKING:  # pandas is imported where the table is built (issue 16: start-up)
    import pandas as pd

    from offsim.config.run import RunConfig
    from offsim.plan.footprint import Footprint

wide = console if console.is_terminal else Console(width=170)  # logs and pipes: do not squeeze the table

#: The tiers reported, with their labels; ``pfs`` only where the profile has one.
TIER_LABELS = {"gpu": "GPU", "host_pinned": "pinned", "host": "host", "nvme": "NVMe", "pfs": "PFS"}
#: The tiers whose start-up peak is reported (:mod:`offsim.plan.startup`).
STARTUP_TIERS = ("host_pinned", "host")
#: Items per tier listed as its largest.
TOP_ITEMS = 3
#: Footprint items that are model states (what DeepSpeed's estimator counts); the rest is not.
MODEL_STATES = ("params (16-bit)", "grads (16-bit)", "grads (optimizer format)", "optimizer state")

#: The systems that run DeepSpeed's own ZeRO code, a release or a fork of it: the only ones whose
#: model states DeepSpeed's estimator speaks for. zero-offload (zero/stage_1_and_2.py),
#: zero-infinity (zero/stage3.py), twin-flow (``offload_optimizer.ratio``), superoffload
#: (zero/superoffload_stage3.py), zenflow (runtime/zenflow/), deep-optimizer-states and
#: mlp-offload (DataStates' DeepSpeed forks) and memascend (DeepSpeed ZeRO-3 with its host-memory
#: fixes). FSDP2, Megatron-Core, Colossal-AI Gemini and the research systems with their own
#: runtimes (Fuyou, Harmony, GreedySnake, LSP-Offload, ProTrain, TBA, the virtual-memory baseline)
#: are not; ``custom`` (a file that names no system) is DeepSpeed's only when the file is one of
#: DeepSpeed's (:func:`on_deepspeed`).
DEEPSPEED_SYSTEMS = frozenset({"zero-offload", "zero-infinity", "twin-flow", "superoffload", "zenflow",
                               "deep-optimizer-states", "mlp-offload", "memascend"})

StrategiesOpt = Annotated[list[str] | None, typer.Option(
    "--strategy", "-s", help="strategy name or YAML path; repeat or comma-separate (default: every shipped one)")]


def fit(
    hardware: opt.Hardware = opt.HARDWARE,
    workload: opt.Workload = opt.WORKLOAD,
    strategy: StrategiesOpt = None,
    iterations: opt.Iterations = opt.ITERATIONS,
    warmup: opt.Warmup = opt.WARMUP,
    out: Annotated[Path | None, opt.out("write the strategies as CSV here (a row each: status, time, "
                                        "peak and capacity per tier, reason)")] = None,
    as_json: opt.Json = False,
    quiet: opt.Quiet = False,
) -> None:
    """Does it fit (GPU, pinned host, host, NVMe), with which strategy, and how fast; with
    DeepSpeed's memory estimator for the same model. Exit 1 when no strategy fits.

    Each tier's verdict is stated with its margin: GiB to spare, or short; the GPU's with its
    uncertainty (allocator fragmentation and the memory outside PyTorch's pool, fits / marginal /
    out of memory); --json gives each tier's sentence."""
    check_out_file(out)
    hw, wl, given = _load_inputs(hardware, workload, strategy)
    found = _assess_all(hw, wl, given, iterations, warmup, enabled=not (quiet or as_json))
    report = fit_report(hw, wl, sort_assessments(found))
    if out is not None:
        fit_table(report).to_csv(out, index=False)
    if as_json:
        print_json(report)
    else:
        _print_report(report, quiet)
        if out is not None and not quiet:
            say(f"table written to {out}")
    if not report["fits_any"]:
        raise typer.Exit(ExitCode.NO)


def _load_inputs(hardware: str, workload: str, strategy: list[str] | None) -> tuple[Any, Any, list[str]]:
    """The profile, the workload and the strategies given by name; bad input exits 2 before any work."""
    from offsim.config.loading import load_profile, load_workload, resolve_path
    from offsim.errors import OffsimError

    given = _strategy_names(strategy)
    try:
        hw, wl = load_profile(hardware), load_workload(workload)
        for name in given:  # an unknown name or a missing file fails before any work
            resolve_path("strategy", name)
    except OffsimError as exc:
        fail(str(exc))
    return hw, wl, given


def _assess_all(hw: Any, wl: Any, given: list[str], iterations: int, warmup: int, *,
                enabled: bool) -> list[Assessment]:
    """Every strategy given (or every shipped one) assessed, with progress on stderr when
    ``enabled``; a strategy asked for by name that cannot run here is bad input, as in ``offsim run``."""
    from offsim.config.loading import shipped_files
    from offsim.report.progress import progress_bar

    names = given or list(shipped_files("strategy"))
    found = []
    with progress_bar(len(names), "checking strategies", enabled=enabled) as advance:
        for name in names:
            advance(0, f"checking {name}")
            found.append(assess(hw, wl, name, iterations, warmup))
            advance()
    for a in found if given else ():
        if a.row["status"] == "cannot-run":
            fail(f"{a.row['strategy']}: {a.row['reason']['text']}")
    return found


def fit_table(report: dict[str, Any]) -> pd.DataFrame:
    """The report's strategies as a table (the ``-o`` CSV), in the report's order: ``strategy``,
    ``status``, ``fits``, ``iteration_time_s``, ``tokens_per_s``, per tier ``<tier>_peak_bytes`` and
    ``<tier>_capacity_bytes`` (training; GPU per GPU, the others per node), ``<tier>_spare_bytes``
    (each tier's margin, :func:`offsim.fit_check.tier_margins`; negative: short) with the GPU's
    ``gpu_uncertainty_bytes`` and ``gpu_verdict``, ``startup_<tier>_peak_bytes`` (pinned and host
    while the model is loaded and the optimizer built), ``reason``."""
    import pandas as pd

    rows = []
    for r in report["strategies"]:
        row = {k: r[k] for k in ("strategy", "status", "fits", "iteration_time_s", "tokens_per_s")}
        for tier, rep in r["tiers"].items():
            row[f"{tier}_peak_bytes"], row[f"{tier}_capacity_bytes"] = rep["peak_bytes"], rep["capacity_bytes"]
        for m in r["margins"]:
            row[f"{m['tier']}_spare_bytes"] = m["spare_bytes"]
            if m["tier"] == "gpu":
                row["gpu_uncertainty_bytes"], row["gpu_verdict"] = m["uncertainty_bytes"], m["verdict"]
        for tier, rep in (r["startup"] or {"tiers": {}})["tiers"].items():
            row[f"startup_{tier}_peak_bytes"] = rep["peak_bytes"]
        row["reason"] = None if r["reason"] is None else r["reason"]["text"]
        rows.append(row)
    return pd.DataFrame(rows)


def _strategy_names(given: list[str] | None) -> list[str]:
    """``-s a -s b,c`` -> [a, b, c] (order kept, repeats dropped)."""
    names = [n.strip() for item in (given or []) for n in item.split(",") if n.strip()]
    return list(dict.fromkeys(names))


@dataclass
class Assessment:
    """One strategy checked on the pairing.

    Attributes:
        row: what is reported (JSON-ready; keys in :func:`assess`).
        cfg: the run configuration (None when the strategy cannot run here).
        fp: the planner's footprint (None likewise).
    """

    row: dict[str, Any]
    cfg: RunConfig | None = None
    fp: Footprint | None = field(default=None, repr=False)


def assess(hw: Any, wl: Any, strategy: str, iterations: int, warmup: int) -> Assessment:
    """Check one strategy (a shipped name or a file, read with the workload as ``offsim run``
    reads it: a DeepSpeed, Accelerate or Megatron file may set the batch): each tier's peak
    against its capacity; simulated when every tier fits.

    The row's keys: ``strategy`` (as given), ``notes`` (what offsim ignored or approximated in a
    foreign strategy file), ``status`` (``fits``, ``does-not-fit``, ``cannot-run`` where the strategy
    does not combine with this hardware or workload), ``fits``, ``iteration_time_s`` and
    ``tokens_per_s`` (null unless simulated), ``tiers`` (:func:`tier_report`), ``startup``
    (:func:`startup_report`: the host peak while the model is loaded and the optimizer built),
    ``margins`` (each tier's verdict with its margin in training, :meth:`offsim.fit_check.TierMargin.to_dict`:
    the GPU's with the allocator's margin, gpu_memory.md §4; empty when it cannot run),
    ``simulated_peak_bytes``, ``reason`` (tier, ``when``: ``training``, the start-up phase or
    ``simulation``; need, capacity and text; null when it fits), ``deepspeed`` (filled by
    :func:`fit_report`). A strategy fits when every tier fits in training and at start-up and
    the simulation finds no overflow."""
    from offsim import make_run_config
    from offsim.api import resolve
    from offsim.errors import OffsimError
    from offsim.fit_check import footprint, tier_margins
    from offsim.plan.footprint import state_sizes
    from offsim.plan.startup import startup_peak

    row: dict[str, Any] = {"strategy": strategy, "notes": [], "status": "cannot-run", "fits": False,
                           "iteration_time_s": None, "tokens_per_s": None, "tiers": {}, "margins": [],
                           "startup": None, "simulated_peak_bytes": None, "reason": None, "deepspeed": None}
    try:
        cfg = resolve(make_run_config(hw, wl, strategy, iterations=iterations, warmup_iterations=warmup))
        sz = state_sizes(cfg)
        fp = footprint(cfg, sz)
    except OffsimError as exc:
        row["reason"] = {"tier": None, "when": None, "need_bytes": None, "capacity_bytes": None, "text": str(exc)}
        return Assessment(row)
    row["notes"] = list(getattr(cfg, "notes", ()))
    row["tiers"] = tier_report(fp, hw.nvme is not None, hw.pfs is not None)
    row["margins"] = [m.to_dict() for m in tier_margins(fp)]
    row["startup"] = startup_report(startup_peak(cfg, sz, fp), fp.capacity_bytes)
    reason = _plan_overflow(row["tiers"], fp.first_overflow(), "training") \
        or _plan_overflow(row["startup"]["tiers"], _first_over(row["startup"]["tiers"]), row["startup"]["phase"])
    if reason is not None:
        row.update(status="does-not-fit", reason=reason)
        return Assessment(row, cfg, fp)
    _simulate_row(row, cfg)
    return Assessment(row, cfg, fp)


def _first_over(tiers: dict[str, dict[str, Any]]) -> str | None:
    """The first tier of ``tiers`` over its capacity, or None."""
    return next((tier for tier, rep in tiers.items() if not rep["fits"]), None)


def _plan_overflow(tiers: dict[str, dict[str, Any]], over: str | None, when: str) -> dict[str, Any] | None:
    """The reason of a planner's overflow of ``tiers`` (None when ``over`` is None): ``when`` is
    ``training`` or the start-up phase."""
    if over is None:
        return None
    also = [t for t, rep in tiers.items() if not rep["fits"] and t != over]
    text = _overflow_text(over, tiers, also)
    return {"tier": over, "when": when, "need_bytes": tiers[over]["peak_bytes"],
            "capacity_bytes": tiers[over]["capacity_bytes"], "also_over": also,
            "text": text if when == "training" else f"at start-up ({when}): {text}"}


def _simulate_row(row: dict[str, Any], cfg: RunConfig) -> None:
    """Simulate a configuration the planner says fits; fill its time and peaks, or the engine's
    overflow (the tier, the level it reached and the capacity) as the reason it does not fit."""
    from offsim.simulation import simulate_resolved

    m = simulate_resolved(cfg).metrics
    if not m.feasible:  # the engine met a peak the planner did not foresee
        need, cap = _engine_overflow(cfg)
        tier = m.infeasible_tier or ""
        if cap is None:
            cap = row["tiers"].get(tier, {}).get("capacity_bytes")
        row.update(status="does-not-fit", reason={"tier": tier, "when": "simulation", "need_bytes": need,
                                                  "capacity_bytes": cap,
                                                  "text": f"while simulating: {m.infeasible_reason}"})
        return
    row.update(status="fits", fits=True, iteration_time_s=m.iteration_time_s, tokens_per_s=m.tokens_per_s,
               simulated_peak_bytes=m.peak_bytes.model_dump())


def _engine_overflow(cfg: RunConfig) -> tuple[float | None, float | None]:
    """The engine's level and capacity where it overflowed (the run's :class:`InfeasibleError`):
    the schedule is run again to catch it, since the run's metrics keep only its message."""
    from offsim.errors import InfeasibleError
    from offsim.plan.footprint import state_sizes
    from offsim.simulation import run_schedule

    try:
        run_schedule(cfg, state_sizes(cfg))
    except InfeasibleError as exc:
        return exc.need_bytes, exc.capacity_bytes
    return None, None


def startup_report(peak: Any, capacity_bytes: dict[str, float]) -> dict[str, Any]:
    """The start-up peak (:func:`offsim.plan.startup.startup_peak`) as reported: ``phase`` and,
    per tier (``host_pinned``, ``host`` with pinned included; per node), ``peak_bytes``,
    ``capacity_bytes``, ``fits`` and ``largest`` (the :data:`TOP_ITEMS` biggest items per rank)."""
    tiers = {}
    for tier in ("host_pinned", "host"):
        top = sorted(peak.items[tier].items(), key=lambda kv: -kv[1])[:TOP_ITEMS]
        need, cap = peak.need_bytes[tier], capacity_bytes[tier]
        tiers[tier] = {"peak_bytes": need, "capacity_bytes": cap, "fits": need <= cap,
                       "largest": [{"what": what, "bytes": nbytes} for what, nbytes in top]}
    return {"phase": peak.phase, "tiers": tiers}


def tier_report(fp: Any, with_nvme: bool, with_pfs: bool) -> dict[str, dict[str, Any]]:
    """Per tier (NVMe and the parallel FS only where the profile has them): ``peak_bytes`` (the
    planner's estimate; GPU per GPU, the PFS for the whole job, the others per node; host includes
    pinned), ``capacity_bytes``, ``fits`` and ``largest`` (the :data:`TOP_ITEMS` biggest items,
    per rank, as ``{"what", "bytes"}``)."""
    out = {}
    for tier in TIER_LABELS:
        if (tier == "nvme" and not with_nvme) or (tier == "pfs" and not with_pfs):
            continue
        items = tier_items(fp, tier)
        top = sorted(items.items(), key=lambda kv: -kv[1])[:TOP_ITEMS]
        need, cap = fp.need_bytes[tier], fp.capacity_bytes[tier]
        out[tier] = {"peak_bytes": need, "capacity_bytes": cap, "fits": need <= cap,
                     "largest": [{"what": what, "bytes": nbytes} for what, nbytes in top]}
    return out


def tier_items(fp: Any, tier: str) -> dict[str, float]:
    """The footprint's items of ``tier`` (bytes per rank); ``host`` holds pinned and pageable."""
    if tier != "host":
        return dict(fp.breakdown[tier])
    items = dict(fp.breakdown["host_pinned"])
    for what, nbytes in fp.breakdown["host"].items():
        items[what] = items.get(what, 0.0) + nbytes
    return items


def _overflow_text(tier: str, tiers: dict[str, dict[str, Any]], also: list[str]) -> str:
    """``gpu needs 86.83 GiB, has 23.64 GiB (per GPU); largest: ...; also over: ...``."""
    rep = tiers[tier]
    scope = "per GPU" if tier == "gpu" else ("whole job" if tier == "pfs" else "per node")
    largest = ", ".join(f"{i['what']} {i['bytes'] / 2**30:.2f} GiB" for i in rep["largest"])
    text = (f"{tier} needs {rep['peak_bytes'] / 2**30:.2f} GiB, has {rep['capacity_bytes'] / 2**30:.2f} GiB "
            f"({scope}); largest: {largest}")
    over = [f"{t} {tiers[t]['peak_bytes'] / 2**30:.2f} of {tiers[t]['capacity_bytes'] / 2**30:.2f} GiB" for t in also]
    return text + (f"; also over: {', '.join(over)}" if over else "")


def sort_assessments(found: list[Assessment]) -> list[Assessment]:
    """Those that fit, fastest first; then those that do not fit, nearest to fitting first (the
    largest need over capacity of any tier); then those that cannot run here, by name."""
    def key(row: dict[str, Any]) -> tuple[int, float, str]:
        if row["fits"]:
            t = row["iteration_time_s"]
            return 0, t if t is not None and math.isfinite(t) else math.inf, row["strategy"]
        if row["status"] == "does-not-fit":
            reps = [*row["tiers"].values(), *(row["startup"] or {"tiers": {}})["tiers"].values()]
            return 1, max(_fill(rep) for rep in reps), row["strategy"]
        return 2, 0.0, row["strategy"]

    return sorted(found, key=lambda a: key(a.row))


def _fill(rep: dict[str, Any]) -> float:
    """A tier's peak over its capacity (infinite when it has none but needs some)."""
    if rep["capacity_bytes"] > 0:
        return float(rep["peak_bytes"] / rep["capacity_bytes"])
    return math.inf if rep["peak_bytes"] > 0 else 0.0


def fit_report(hw: Any, wl: Any, found: list[Assessment]) -> dict[str, Any]:
    """The whole answer as a JSON-ready dict: the pairing, the model's total and active
    parameters, the rows in the given order (each on DeepSpeed's system with the DeepSpeed line it
    maps onto, the others null) and DeepSpeed's estimator table (null when no strategy on
    DeepSpeed, :func:`on_deepspeed`, could run here)."""
    from offsim.plan.ds_estimator import BUFFER_FACTOR, estimator_setup, matching_row

    estimator: dict[str, Any] | None = None
    for a in found:
        if a.cfg is None or a.fp is None or not on_deepspeed(a.cfg.strategy.system, a.row["strategy"]):
            continue  # its row keeps "deepspeed": None
        setup = estimator_setup(a.cfg)
        table = setup.table()
        if estimator is None:
            estimator = {"params": setup.params, "largest_layer_params": setup.largest_layer_params,
                         "gpus_per_node": setup.gpus_per_node, "nodes": setup.nodes,
                         "buffer_factor": BUFFER_FACTOR, "rows": [r.to_dict() for r in table]}
        match = matching_row(a.cfg, table)
        a.row["deepspeed"] = None if match is None else compare_with_estimator(a.fp, match)
    rows = [a.row for a in found]
    return {"hardware": hw.name, "workload": wl.name, "params_total": wl.model.total_params,
            "params_active": wl.model.active_params, "fits_any": any(r["fits"] for r in rows),
            "strategies": rows, "deepspeed_estimator": estimator}


def on_deepspeed(system: str, strategy: str) -> bool:
    """Whether the strategy ``strategy`` (as given: a name or a file) runs on DeepSpeed: its
    system is one of :data:`DEEPSPEED_SYSTEMS`, or it names none (``custom``) and its file is a
    ds_config or an Accelerate config with the DeepSpeed plugin (a ds_config without offload maps
    to ``custom``, :func:`offsim.config.ds_config.deepspeed_system`; an Accelerate FSDP or a
    Megatron file without offload does too, and is not DeepSpeed's)."""
    if system != "custom":
        return system in DEEPSPEED_SYSTEMS
    from offsim.config.loading import read_yaml, resolve_path, strategy_format
    from offsim.errors import OffsimError

    try:
        data = read_yaml(resolve_path("strategy", strategy))
    except OffsimError:
        return False
    fmt = strategy_format(data)
    return fmt == "ds_config" or (fmt == "accelerate" and (data.get("distributed_type") == "DEEPSPEED"
                                                           or "deepspeed_config" in data))


def compare_with_estimator(fp: Any, row: Any) -> dict[str, Any]:
    """offsim's GPU and host peaks beside the DeepSpeed line ``row``, and offsim's largest items
    that are not model states (what the estimator leaves out: activations, buffers, transients)."""
    extra = {}
    for tier in ("gpu", "host"):
        others = [(what, b) for what, b in tier_items(fp, tier).items() if not what.startswith(MODEL_STATES)]
        extra[tier] = [{"what": what, "bytes": b} for what, b in sorted(others, key=lambda kv: -kv[1])[:TOP_ITEMS]]
    return {"options": f"ZeRO-{row.stage} {row.options}", "estimator_gpu_bytes": row.gpu_bytes,
            "estimator_cpu_bytes": row.cpu_bytes, "offsim_gpu_bytes": fp.need_bytes["gpu"],
            "offsim_host_bytes": fp.need_bytes["host"], "not_in_estimator": extra}


# ------------------------------------------------------------------------------------- printing
def _gib(nbytes: float | None) -> str:
    return "-" if nbytes is None else f"{nbytes / 2**30:.2f}"


def _print_report(report: dict[str, Any], quiet: bool) -> None:
    """The strategies table, the reasons of those that do not fit, DeepSpeed's table and notes."""
    rows = report["strategies"]
    fitting = sum(r["fits"] for r in rows)
    active = report["params_active"]
    moe = f", {active / 1e9:.2f}B active" if active != report["params_total"] else ""
    say(f"{report['workload']} ({report['params_total'] / 1e9:.2f}B params{moe}) on {report['hardware']}: "
        f"{fitting} of {len(rows)} strategies fit")
    if quiet:
        return
    _print_strategies(rows)
    _print_margins(rows)
    for row in rows:
        if not row["fits"]:
            what = "does not fit" if row["status"] == "does-not-fit" else "cannot run here"
            wide.print(f"[red]{escape(row['strategy'])}[/] {what}: {escape(row['reason']['text'])}",
                       highlight=False)
    for row in rows:
        if row["notes"]:
            kinds = [next((k for k in ("ignored", "approximated") if f": {k}: " in line), "other")
                     for line in row["notes"]]
            counts = ", ".join(f"{kinds.count(k)} {k}" for k in ("ignored", "approximated", "other") if k in kinds)
            say(f"{row['strategy']}: {len(kinds)} notes on the file ({counts}; listed in --json and by "
                f"offsim strategies --explain {row['strategy']})")
    if report["deepspeed_estimator"] is not None:
        _print_estimator(report["deepspeed_estimator"], rows)
        for line in estimator_notes(rows):
            say(line)


def _print_strategies(rows: list[dict[str, Any]]) -> None:
    tiers: dict[str, dict[str, Any]] = next((r["tiers"] for r in rows if r["tiers"]), {})
    t = Table(title="strategies, fastest first (peaks: GPU per GPU; pinned, host, NVMe per node; GiB)")
    t.add_column("strategy", no_wrap=True)
    t.add_column("iteration s", justify="right")
    t.add_column("tokens/s", justify="right")
    for tier, rep in tiers.items():
        t.add_column(f"{TIER_LABELS[tier]} / {_gib(rep['capacity_bytes'])}", justify="right")
    for tier in STARTUP_TIERS:
        t.add_column(f"start-up {TIER_LABELS[tier]}", justify="right")
    t.add_column("fullest tier: largest items (GiB)")
    for row in rows:
        time = "-" if row["iteration_time_s"] is None else f"{row['iteration_time_s']:.4g}"
        speed = "-" if row["tokens_per_s"] is None else f"{row['tokens_per_s']:,.0f}"
        cells = [_tier_cell(row["tiers"].get(tier)) for tier in tiers]
        start = (row["startup"] or {"tiers": {}})["tiers"]
        cells += [_tier_cell(start.get(tier)) for tier in STARTUP_TIERS]
        t.add_row(escape(row["strategy"]), time, speed, *cells, escape(_fullest(row["tiers"], start)))
    wide.print(t)


def _print_margins(rows: list[dict[str, Any]]) -> None:
    """Each strategy's verdict per tier with its margin (:func:`offsim.fit_check.tier_margins`),
    and at start-up the pinned and host capacity less the start-up peak; the GPU's rule under it."""
    from offsim.commands._verdicts import gpu_margin_note, margin_cell

    assessed = [r for r in rows if r["margins"]]
    if not assessed:
        return
    tiers = [t for t in TIER_LABELS if any(m["tier"] == t for r in assessed for m in r["margins"])]
    t = Table(title="verdict per tier with its margin (GiB to spare, or short; GPU per GPU, the others per node)")
    t.add_column("strategy", no_wrap=True)
    for tier in tiers:
        t.add_column(TIER_LABELS[tier], justify="right")
    for tier in STARTUP_TIERS:
        t.add_column(f"start-up {TIER_LABELS[tier]}", justify="right")
    for row in assessed:
        by_tier = {m["tier"]: m for m in row["margins"]}
        start = (row["startup"] or {"tiers": {}})["tiers"]
        t.add_row(escape(row["strategy"]), *(margin_cell(by_tier.get(tier)) for tier in tiers),
                  *(margin_cell(_startup_margin(tier, start.get(tier))) for tier in STARTUP_TIERS))
    wide.print(t)
    say(gpu_margin_note())


def _startup_margin(tier: str, rep: dict[str, Any] | None) -> dict[str, Any] | None:
    """A start-up tier's report as a margin (capacity less peak), for :func:`margin_cell`."""
    if rep is None or rep["peak_bytes"] <= 0:
        return None
    return {"tier": tier, "spare_bytes": rep["capacity_bytes"] - rep["peak_bytes"], "uncertainty_bytes": 0.0,
            "verdict": "fits" if rep["fits"] else "out of memory"}


def _tier_cell(rep: dict[str, Any] | None) -> str:
    if rep is None:
        return "-"
    text = _gib(rep["peak_bytes"])
    return text if rep["fits"] else f"[red]{text}[/]"


def _fullest(tiers: dict[str, dict[str, Any]], startup: dict[str, dict[str, Any]]) -> str:
    """The tier nearest its capacity (in training or at start-up) and its two largest items."""
    used = [(_fill(rep), TIER_LABELS[tier], rep) for tier, rep in tiers.items() if rep["capacity_bytes"] > 0]
    used += [(_fill(rep), f"start-up {TIER_LABELS[tier]}", rep) for tier, rep in startup.items()
             if rep["capacity_bytes"] > 0]
    if not used:
        return ""
    share, label, rep = max(used, key=lambda u: u[0])
    items = ", ".join(f"{i['what']} {_gib(i['bytes'])}" for i in rep["largest"][:2])
    return f"{label} {100 * share:.0f} %: {items}"


def _print_estimator(est: dict[str, Any], rows: list[dict[str, Any]]) -> None:
    """DeepSpeed's table as its ``_all_cold`` functions print it, with the strategies on each line."""
    on_line: dict[str, list[str]] = {}
    for row in rows:
        if row["deepspeed"] is not None:
            on_line.setdefault(row["deepspeed"]["options"], []).append(row["strategy"])
    gpus = f"{est['gpus_per_node']} GPU{'s' if est['gpus_per_node'] > 1 else ''} per node x {est['nodes']} node"
    t = Table(title=f"DeepSpeed's estimator, model states only: {est['params'] / 1e6:,.0f}M params, "
                    f"{est['largest_layer_params'] / 1e6:,.0f}M largest module, {gpus} (GiB)")
    for label in ("per CPU", "per GPU", "options", "offsim strategies on this line"):
        t.add_column(label, justify="right" if label.startswith("per") else "left")
    for r in est["rows"]:
        options = f"ZeRO-{r['stage']} {r['options']}"
        t.add_row(_gib(r["cpu_bytes"]), _gib(r["gpu_bytes"]), escape(options),
                  escape(", ".join(on_line.get(options, []))))
    wide.print(t)


def estimator_notes(rows: list[dict[str, Any]]) -> list[str]:
    """Where offsim differs from DeepSpeed's estimator, and why: a general line, then one line per
    strategy on an estimator line with the largest items the estimator leaves out."""
    lines = ["DeepSpeed's estimator counts model states only (params, grads, Adam state; CPU x 1.5 "
             "additional_buffer_factor, x 4 bytes x GPUs per node when loaded without zero.Init). offsim also "
             "counts activations, the gathered-parameter window, gradient and staging buffers, the CUDA "
             "reserve and start-up transients (pageable sources of pinned copies), and rounds pinned "
             "host tensors up to powers of two as PyTorch's caching host allocator does. Its start-up peak "
             "counts, as the estimator's zero_init=0 lines do, the fp32 model every rank builds without "
             "zero.Init (ZeRO-1/2), and the fp32 master copy made from the 16-bit parameters and pinned by "
             "copy (stage_1_and_2.py DeepSpeedZeroOptimizer.__init__; stage3.py _create_fp32_partitions)."]
    for row in rows:
        ds = row["deepspeed"]
        if ds is None:
            continue
        gpu = ", ".join(f"{i['what']} {_gib(i['bytes'])}" for i in ds["not_in_estimator"]["gpu"]) or "none"
        host = ", ".join(f"{i['what']} {_gib(i['bytes'])}" for i in ds["not_in_estimator"]["host"]) or "none"
        lines.append(f"{row['strategy']} ({ds['options']}): GPU offsim {_gib(ds['offsim_gpu_bytes'])} vs DeepSpeed "
                     f"{_gib(ds['estimator_gpu_bytes'])} GiB (not in the estimator: {gpu}); host offsim "
                     f"{_gib(ds['offsim_host_bytes'])} vs {_gib(ds['estimator_cpu_bytes'])} GiB (not in the "
                     f"estimator: {host})")
    return lines


def register(app: typer.Typer) -> None:
    """Add ``fit`` to the CLI."""
    app.command()(fit)
