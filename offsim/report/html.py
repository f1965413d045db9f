"""One self-contained HTML page for a run or a comparison of runs.

The page holds, in order: when a policy study was run (``offsim report --policies``), its decision
per configuration in one sentence (:func:`offsim.compare.decision`); the bottleneck of each run
in one sentence; headline metrics side by
side; for a comparison, where each iteration goes, GPU memory and host-link throughput over one
steady iteration; then per run the timeline, memory and link figures and the per-layer stall
table; last, the configuration (key fields, then the full resolved configuration as JSON).

plotly.js is inlined once in the page head, so the file opens without a network connection.
"""

from __future__ import annotations

import html
import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import pandas as pd
import plotly.graph_objects as go
import plotly.io as pio
from plotly.offline import get_plotlyjs

from offsim.config.run import RunConfig
from offsim.core._version import __version__
from offsim.report import figures
from offsim.report.bottleneck import bottleneck
from offsim.report.tracks import RESOURCE_LABELS, TIER_LABELS
from offsim.results import RunResult

_CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0 auto; max-width: 1280px;
       padding: 0 24px 48px; color: #222; }
h1 { font-size: 1.6em; margin: 24px 0 4px; } h2 { margin-top: 40px; border-bottom: 1px solid #ddd; }
.meta { color: #666; margin: 0 0 16px; }
.bottleneck { background: #f4f7fb; border-left: 4px solid #1f77b4; padding: 8px 14px; margin: 8px 0; }
.infeasible { background: #fdf1f0; border-left: 4px solid #d62728; padding: 8px 14px; margin: 8px 0; }
table.grid { border-collapse: collapse; font-size: 0.9em; margin: 8px 0 16px; }
table.grid th, table.grid td { border: 1px solid #ddd; padding: 3px 8px; text-align: right; }
table.grid th:first-child, table.grid td:first-child { text-align: left; }
table.grid thead th { background: #eef; }
details { margin: 8px 0; } summary { cursor: pointer; color: #1f5fa0; }
pre { background: #f8f8f8; padding: 8px; overflow-x: auto; font-size: 0.8em; }
.figure { margin: 12px 0 24px; }
"""


def _esc(value: object) -> str:
    return html.escape(str(value))


def _table(header: Sequence[str], rows: Sequence[Sequence[object]], css: str = "grid") -> str:
    head = "".join(f"<th>{_esc(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{_esc(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f'<table class="{css}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


class _Figures:
    """Turns figures into ``<div>`` snippets with stable ids (plotly.js is in the head)."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, fig: go.Figure) -> str:
        self.count += 1
        div = pio.to_html(fig, include_plotlyjs=False, full_html=False, div_id=f"figure-{self.count}",
                          config={"displaylogo": False, "responsive": True})
        return f'<div class="figure">{div}</div>'


def _fmt(value: float | None, unit: str = "", digits: int = 4) -> str:
    return "-" if value is None else f"{value:.{digits}g}{unit}"


def _cells(results: Sequence[RunResult], name: str, get: Callable[[RunResult], object],
           feasible_only: bool = True) -> list[str]:
    """One table row: ``name`` then ``get(result)`` per run ("-" where it did not fit)."""
    return [name, *("-" if feasible_only and not r.feasible else str(get(r)) for r in results)]


def _phase_cell(phase: str) -> Callable[[RunResult], object]:
    return lambda r: _fmt(getattr(r.metrics.phases_s, phase), " s")


def _peak_cell(tier: str) -> Callable[[RunResult], object]:
    return lambda r: f"{getattr(r.metrics.peak_bytes, tier) / 2**30:.3g} GiB"


def _traffic_cell(link: str) -> Callable[[RunResult], object]:
    return lambda r: f"{getattr(r.metrics.traffic_bytes, link) / 1e9:.3g} GB"


def metric_rows(results: Sequence[RunResult]) -> list[list[str]]:
    """Headline metrics, one row per metric and one column per run."""
    m: dict[str, Callable[[RunResult], object]] = {
        "iteration time": lambda r: _fmt(r.metrics.iteration_time_s, " s"),
        "throughput": lambda r: f"{r.metrics.tokens_per_s or 0.0:,.0f} tokens/s",
        "model TFLOP/s per GPU": lambda r: _fmt(r.metrics.tflops_per_gpu, "", 3),
        "GPU busy": lambda r: f"{100 * (r.metrics.gpu_busy_fraction or 0.0):.1f} %",
        "GPU stalled on data": lambda r: _fmt(r.metrics.stall_s, " s"),
        "optimizer step": lambda r: _fmt(r.metrics.optimizer_step_s, " s"),
        "bottleneck": lambda r: RESOURCE_LABELS.get(bottleneck(r).resource, ""),
    }
    for phase in ("forward", "backward", "optimizer"):
        m[f"phase {phase}"] = _phase_cell(phase)
    for tier in ("gpu", "host_pinned", "host", "nvme"):
        m[f"peak {TIER_LABELS[tier]}"] = _peak_cell(tier)
    for link in ("h2d", "d2h", "nvme_read", "nvme_write", "gpu_link", "dram_copy"):
        m[f"traffic {RESOURCE_LABELS[link]} / iteration"] = _traffic_cell(link)
    fits = _cells(results, "fits", lambda r: "yes" if r.feasible else f"no: {r.metrics.infeasible_reason}",
                  feasible_only=False)
    return [fits, *(_cells(results, name, get) for name, get in m.items())]


def _nvme(c: RunConfig) -> str:
    nv = c.hardware.nvme
    if nv is None:
        return "none"
    return f"{nv.drives}x {nv.model} ({nv.read_gb_per_s:g} / {nv.write_gb_per_s:g} GB/s read / write)"


def _host_link(c: RunConfig) -> str:
    hl = c.hardware.host_link
    gen = f" Gen{hl.generation}" if hl.generation else ""
    lanes = f" x{hl.lanes}" if hl.lanes else ""
    return (f"{hl.kind}{gen}{lanes}: H2D {hl.h2d.pinned.bandwidth_gb_per_s:g}, "
            f"D2H {hl.d2h.pinned.bandwidth_gb_per_s:g} GB/s pinned")


def _batch(c: RunConfig) -> str:
    t = c.workload.training
    return (f"seq {t.seq_len} x micro-batch {t.micro_batch} x accumulation {t.grad_accumulation}, "
            f"data parallel {t.data_parallel}")


def _placement(c: RunConfig) -> str:
    p = c.strategy.placement
    return f"{p.params} / {p.grads} / {p.optimizer_states} / {p.activations}"


_CONFIG: dict[str, Callable[[RunConfig], object]] = {
    "hardware": lambda c: c.hardware.name,
    "GPU": lambda c: (f"{c.hardware.topology.gpus_per_node}x {c.hardware.gpu.model}, "
                      f"{c.hardware.gpu.memory_gib:g} GiB"),
    "host link": _host_link,
    "CPU": lambda c: f"{c.hardware.cpu.model}, {c.hardware.cpu.cores} cores, "
                     f"{c.hardware.cpu.optimizer_params_per_s / 1e9:.3g} G Adam params/s",
    "DRAM": lambda c: f"{c.hardware.dram.capacity_gib:g} GiB",
    "NVMe": _nvme,
    "workload": lambda c: c.workload.name,
    "model": lambda c: f"{c.workload.model.total_params / 1e9:.3g}B params, {c.workload.model.layers} layers",
    "batch": _batch,
    "activation checkpointing": lambda c: c.activation_checkpointing,
    "strategy": lambda c: c.strategy.name,
    "description": lambda c: c.strategy.description,
    "ZeRO stage": lambda c: c.strategy.zero_stage,
    "placement (params / grads / optimizer / activations)": _placement,
    "optimizer on": lambda c: c.strategy.optimizer_device,
    "prefetch depth": lambda c: c.strategy.prefetch_depth,
    "delayed parameter update": lambda c: c.strategy.delayed_param_update,
    "iterations (warm-up)": lambda c: f"{c.iterations} ({c.warmup_iterations})",
}


def config_rows(results: Sequence[RunResult]) -> list[list[str]]:
    """Key configuration fields, one column per run."""
    return [_cells(results, name, _config_cell(get), feasible_only=False) for name, get in _CONFIG.items()]


def _config_cell(get: Callable[[RunConfig], object]) -> Callable[[RunResult], object]:
    return lambda r: get(r.config)


def _stall_html(result: RunResult) -> str:
    table = figures.stall_table(result)
    if table.empty:
        return "<p>No per-layer spans.</p>"
    shown = table.copy()
    for col in shown.columns:
        if col == "stall_share":
            shown[col] = [f"{100 * v:.1f}" for v in shown[col]]
        elif col.endswith("_s"):
            shown[col] = [f"{1e3 * v:.4g}" for v in shown[col]]
    header = ["layer", "name", *(figures._column_label(c) for c in shown.columns[2:])]
    total = ["", "total", *(_total(table, c) for c in table.columns[2:])]
    rows = [*shown.astype(str).values.tolist(), total]
    return (f"<details><summary>Per-layer compute and GPU stalls ({len(table)} layers, per steady "
            f"iteration)</summary>{_table(header, rows)}</details>")


def _total(table: pd.DataFrame, column: str) -> str:
    value = table[column].sum()
    return f"{100 * value:.1f}" if column == "stall_share" else f"{1e3 * value:.4g}"


def _run_section(result: RunResult, label: str, fig_html: _Figures) -> str:
    parts = [f"<h2>{_esc(label)}: {_esc(figures.run_title(result))}</h2>"]
    if not result.feasible:
        parts.append(f'<p class="infeasible">Does not fit: {_esc(result.metrics.infeasible_reason)}</p>')
        return "<section class='run'>" + "".join(parts) + "</section>"
    parts.append(f'<p class="bottleneck">{_esc(bottleneck(result).sentence)}</p>')
    parts += [fig_html(figures.timeline_figure(result)), fig_html(figures.memory_figure(result)),
              fig_html(figures.link_figure(result)), _stall_html(result)]
    return "<section class='run'>" + "".join(parts) + "</section>"


def render_report(results: Sequence[RunResult], title: str | None = None,
                  decisions: Mapping[str, str] | None = None) -> str:
    """The HTML page (a string) for one run or several.

    ``decisions``: per run label, the decision sentence of a policy study on that configuration,
    shown first.
    """
    if not results:
        raise ValueError("render_report needs at least one result")
    labels = figures.run_labels(results)
    title = title or ("offsim: " + figures.run_title(results[0]) if len(results) == 1
                      else f"offsim: comparison of {len(results)} runs")
    fig_html = _Figures()
    body = [f"<h1>{_esc(title)}</h1>",
            f'<p class="meta">offsim {_esc(__version__)}; times are per steady-state iteration '
            "(warm-up left out).</p>"]
    if decisions:
        body.append("<h2>Which policy</h2>")
        body += [f'<p class="bottleneck"><b>{_esc(label)}</b>: {_esc(text)}</p>' for label, text in decisions.items()]
    body.append("<h2>Bottleneck</h2>")
    for label, r in zip(labels, results, strict=True):
        text = bottleneck(r).sentence if r.feasible else f"does not fit: {r.metrics.infeasible_reason}"
        css = "bottleneck" if r.feasible else "infeasible"
        body.append(f'<p class="{css}"><b>{_esc(label)}</b>: {_esc(text)}</p>')
    body += ["<h2>Headline metrics</h2>", _table(["metric", *labels], metric_rows(results))]
    feasible = [r for r in results if r.feasible]
    if len(results) > 1 and feasible:
        comparison = (figures.breakdown_figure(results), figures.memory_compare_figure(results),
                      figures.link_compare_figure(results))
        body += ["<h2>Comparison</h2>", *(fig_html(f) for f in comparison)]
    body += [_run_section(r, label, fig_html) for label, r in zip(labels, results, strict=True)]
    body += ["<h2>Configuration</h2>", _table(["field", *labels], config_rows(results))]
    for label, r in zip(labels, results, strict=True):
        dump = json.dumps(r.config.model_dump(mode="json"), indent=2)
        body.append(f"<details><summary>Full configuration: {_esc(label)}</summary>"
                    f"<pre>{_esc(dump)}</pre></details>")
    return ("<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
            f"<title>{_esc(title)}</title><style>{_CSS}</style>"
            f'<script type="text/javascript">{get_plotlyjs()}</script></head>'
            f"<body>{''.join(body)}</body></html>\n")


def write_report(results: Sequence[RunResult], path: Path | str, title: str | None = None,
                 decisions: Mapping[str, str] | None = None) -> Path:
    """Write :func:`render_report` to ``path``; returns the path."""
    path = Path(path)
    path.write_text(render_report(results, title, decisions), encoding="utf-8")
    return path
