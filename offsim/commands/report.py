"""``offsim report``: one self-contained HTML page for a run or a comparison of runs.

Every combination of the given ``--hardware``, ``--workload`` and ``--strategy`` values is
simulated (``-s zero-offload -s zero-infinity-cpu`` compares two strategies on one machine);
the page shows the bottleneck of each in one sentence, headline metrics, the timeline, memory
and link figures and the per-layer stall table (see :mod:`offsim.report.html`). With
``--policies``, each configuration's strategy is also run with those policies (as ``offsim
compare --policies``) and the decision sentence (which policy, how much it buys, how far from
the bound) comes first, on the page and in the output.

The page is written only to ``-o/--out`` and the figures only into ``--figures``; without
either, the sentences are printed and nothing is written.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from offsim.commands import _options as opt
from offsim.commands._common import ExitCode, check_out_dir, check_out_file, fail, print_json, say
from offsim.report.progress import progress_bar


def _option(long: str, short: str, what: str) -> typer.models.OptionInfo:
    return typer.Option(long, short, help=f"{what} name or YAML path; repeat to compare")


HardwareList = Annotated[list[str], _option("--hardware", "-H", "hardware profile")]
WorkloadList = Annotated[list[str], _option("--workload", "-w", "workload")]
StrategyList = Annotated[list[str], _option("--strategy", "-s", "strategy")]


def report(
    hardware: HardwareList = [opt.HARDWARE],  # noqa: B006 - typer reads the default, never mutated
    workload: WorkloadList = [opt.WORKLOAD],  # noqa: B006
    strategy: StrategyList = [opt.STRATEGY],  # noqa: B006
    iterations: opt.Iterations = opt.ITERATIONS,
    warmup: opt.Warmup = opt.WARMUP,
    out: Annotated[Path | None, opt.out("write the HTML page here")] = None,
    title: Annotated[str | None, typer.Option(help="page title")] = None,
    figures_dir: opt.Figures = None,
    policies: Annotated[str | None, typer.Option(
        help="also run each configuration with these policies (as offsim compare --policies, e.g. "
             "lru,fifo,belady) and put the decision sentence first")] = None,
    as_json: opt.Json = False,
    quiet: opt.Quiet = False,
) -> None:
    """Simulate one or more configurations and print the bottleneck of each (with --policies, which
    policy to use first); -o writes the HTML report (figures, metrics, bottleneck), --figures each
    run's figures."""
    from offsim.report.figures import run_labels

    check_out_file(out)
    check_out_dir(figures_dir, "--figures")
    combos = list(itertools.product(hardware, workload, strategy))
    writes = out is not None or figures_dir is not None
    with progress_bar(len(combos) * (2 if policies else 1) + writes, "simulating",
                      enabled=not (quiet or as_json)) as advance:
        results = _simulate(combos, iterations, warmup, advance)
        labels = run_labels(results)
        decisions = _policy_decisions(results, labels, policies, iterations, warmup, advance) if policies else {}
        if writes:
            advance(0, "rendering the report")
            _write(results, labels, out, title, figures_dir, decisions)
            advance()
    lines = [(label, _verdict(r)) for label, r in zip(labels, results, strict=True)]
    if as_json:
        print_json({"out": None if out is None else str(out),
                    "figures": None if figures_dir is None else str(figures_dir),
                    "runs": [{"label": label, "feasible": r.feasible, "summary": text,
                              "iteration_time_s": r.metrics.iteration_time_s, "policy_decision": decisions.get(label)}
                             for (label, text), r in zip(lines, results, strict=True)]})
    elif not quiet:
        _print_lines(decisions, lines, out, figures_dir)
    if not any(r.feasible for r in results):
        raise typer.Exit(ExitCode.NO)


def _print_lines(decisions: dict[str, str], lines: list[tuple[str, str]], out: Path | None,
                 figures_dir: Path | None) -> None:
    """The decision and bottleneck sentences, then what was written (or how to write the page)."""
    for label, text in [*decisions.items(), *lines]:
        say(f"{label}: {text}")
    if out is not None:
        say(f"report written to {out}")
    if figures_dir is not None:
        say(f"figures written under {figures_dir}")
    if out is None and figures_dir is None:
        say("nothing written: -o FILE writes the HTML report, --figures DIR each run's figures", stderr=True)


def _verdict(result: Any) -> str:
    """The bottleneck sentence of a run, or why it does not fit."""
    from offsim.report.bottleneck import bottleneck

    return bottleneck(result).sentence if result.feasible else f"does not fit: {result.metrics.infeasible_reason}"


def _simulate(combos: list[tuple[str, str, str]], iterations: int, warmup: int,
              advance: Callable[..., None]) -> list[Any]:
    """Simulate every (hardware, workload, strategy); bad input exits 2."""
    from offsim import make_run_config, simulate
    from offsim.errors import OffsimError

    results = []
    for hw, wl, st in combos:
        advance(0, f"simulating {wl} on {hw} with {st}")
        try:
            cfg = make_run_config(hw, wl, st, iterations=iterations, warmup_iterations=warmup)
            results.append(simulate(cfg))
        except OffsimError as exc:
            fail(str(exc))
        advance()
    return results


def _policy_decisions(results: list[Any], labels: list[str], policies: str, iterations: int, warmup: int,
                      advance: Callable[..., None]) -> dict[str, str]:
    """Per run label, the decision sentence of the policies run on that configuration (its own
    strategy as the base, the GPU parameter budget it leaves free); bad policy names exit 2."""
    from offsim.compare import decision, policy_variants, run_variants
    from offsim.errors import OffsimError

    out = {}
    for label, r in zip(labels, results, strict=True):
        advance(0, f"running the policies on {label}")
        cfg = r.config
        try:
            variants = policy_variants(cfg.strategy, policies)
            table, _ = run_variants(cfg.hardware, cfg.workload, variants, iterations, warmup)
        except OffsimError as exc:
            fail(str(exc))
        out[label] = f"policies {policies}: {decision(table)}"
        advance()
    return out


def _write(results: list[Any], labels: list[str], out: Path | None, title: str | None,
           figures_dir: Path | None, decisions: dict[str, str]) -> None:
    """Write the page where ``-o`` says and, with ``--figures``, each feasible run's figures."""
    from offsim.report.figures import write_figures
    from offsim.report.html import write_report

    if out is not None:
        write_report(results, out, title, decisions)
    if figures_dir is not None:
        for label, r in zip(labels, results, strict=True):
            if r.feasible:
                write_figures(r, figures_dir / _slug(label))


def _slug(label: str) -> str:
    return "".join(c if c.isalnum() or c in "-._" else "_" for c in label).strip("_") or "run"


def register(app: typer.Typer) -> None:
    """Add ``report`` to the CLI."""
    app.command()(report)
