"""``offsim tune``: ProTrain's automatic knob search (arXiv 2406.08334) with offsim as the cost
model (:mod:`offsim.search.protrain`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from offsim.commands import _options as opt
from offsim.commands._common import ExitCode, check_out_file, console, fail, load_config, print_json, say


def _summary(result: Any, hardware: str, workload: str) -> dict[str, Any]:  # a SearchResult
    best, base = result.best, result.base
    counts = {s: sum(c.status == s for c in result.candidates[1:]) for s in ("ok", "infeasible", "pruned")}
    knobs = None if best.knobs is None else {
        "persistent_layers": best.knobs.persistent_layers, "prefetch_depth": best.knobs.prefetch_depth,
        "swap_blocks": best.knobs.swap_blocks, "recompute_blocks": best.knobs.recompute_blocks,
        "overlap_cpu_step": best.knobs.overlap_cpu_step}
    return {"hardware": hardware, "workload": workload, "feasible": True, "base_strategy": base.strategy.name,
            "chosen": best.label, "knobs": knobs, "iteration_time_s": best.iteration_time_s,
            "base_iteration_time_s": base.iteration_time_s, "base_status": base.status,
            "base_reason": base.reason, "speedup": result.speedup, "candidates": counts}


def _print(summary: dict[str, Any], result: Any, quiet: bool) -> None:
    t = Table(title=escape(f"offsim tune (ProTrain search): {summary['workload']} on {summary['hardware']}"))
    t.add_column("")
    t.add_column("", justify="right")
    base_s = summary["base_iteration_time_s"]
    t.add_row("chosen", escape(summary["chosen"]))
    t.add_row("iteration time", f"{summary['iteration_time_s']:.4g} s")
    t.add_row(escape(f"base ({summary['base_strategy']})"),
              f"{base_s:.4g} s" if base_s else escape(str(summary["base_reason"])))
    if summary["speedup"] is not None:
        t.add_row("speedup over base", f"{summary['speedup']:.3f}x")
    c = summary["candidates"]
    t.add_row("candidates", f"{c['ok']} simulated, {c['infeasible']} infeasible, {c['pruned']} pruned")
    console.print(t)
    if quiet:
        return
    ranked = sorted((x for x in result.candidates if x.status == "ok"), key=lambda x: x.iteration_time_s)
    for x in ranked[:5]:
        say(f"  {x.iteration_time_s:.4g} s  {x.label}")


def tune(
    hardware: opt.Hardware = opt.HARDWARE,
    workload: opt.Workload = opt.WORKLOAD,
    base_strategy: Annotated[str, opt.strategy(
        "baseline to beat; also supplies the fields ProTrain does not set", "--base-strategy")]
    = "zero-infinity-cpu",
    grid: Annotated[str, typer.Option(help="search grid: small or default")] = "default",
    as_json: opt.Json = False,
    out: Annotated[Path | None, opt.out("write the chosen strategy as YAML here")] = None,
    csv: Annotated[Path | None, typer.Option(help="write every candidate (status, reason, time) as CSV")]
    = None,
    iterations: opt.Iterations = opt.ITERATIONS,
    warmup: opt.Warmup = opt.WARMUP,
    quiet: opt.Quiet = False,
) -> None:
    """Search ProTrain's knobs (persistent chunks, prefetch depth, blocks that swap or recompute
    activations, CPU step overlap) by simulation; print the choice and its time against the base.
    The base may be a DeepSpeed, Accelerate or Megatron-Core file, read with the workload as
    offsim run reads it (its batch applies to every candidate). Exits 1 when nothing fits."""
    import yaml

    from offsim.errors import InfeasibleError, OffsimError
    from offsim.search.protrain import search, tuned_strategy

    check_out_file(out)
    check_out_file(csv, "--csv")
    cfg = load_config(hardware, workload, base_strategy, iterations=iterations, warmup=warmup, quiet=quiet or as_json)
    try:
        result = search(cfg.hardware, cfg.workload, cfg.strategy, grid, iterations=iterations, warmup=warmup)
    except InfeasibleError as exc:  # nothing fits: the answer is no
        if as_json:
            print_json({"hardware": hardware, "workload": workload, "feasible": False, "reason": str(exc)})
            raise typer.Exit(ExitCode.NO) from None
        fail(str(exc), ExitCode.NO)
    except OffsimError as exc:
        fail(str(exc))
    summary = _summary(result, hardware, workload)
    if out is not None:
        st = tuned_strategy(result, hardware, workload)
        out.write_text(yaml.safe_dump(st.model_dump(mode="json"), sort_keys=False))
        summary["out"] = str(out)
    if csv is not None:
        result.table().to_csv(csv, index=False)
    if as_json:
        print_json(summary)
        return
    _print(summary, result, quiet)
    if out is not None:
        say(f"chosen strategy written to {out}")


def register(app: typer.Typer) -> None:
    """Add ``tune`` to the CLI."""
    app.command()(tune)
