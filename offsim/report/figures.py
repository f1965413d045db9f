"""plotly figures of a run, built from its DataFrames (``result.spans()``, ``result.levels()``).

One run:

* :func:`timeline_figure`: a Gantt chart, one row per resource lane (GPU compute, GPU waiting,
  PCIe H2D/D2H, NVMe read/write, CPU optimizer, ...), bars coloured by kind of work;
* :func:`memory_figure`: bytes resident per tier over time, one panel per tier;
* :func:`link_figure`: throughput per link and direction over time;
* :func:`stall_table` / :func:`stall_table_figure`: per layer, compute and the time the GPU
  waited before it (per steady iteration).

Several runs: :func:`breakdown_figure` (where each iteration's time went) and
:func:`memory_compare_figure` / :func:`link_compare_figure` (one steady iteration of each run
on a common time axis, as in the "Breaking the Memory Wall" timelines).

Time-based figures shade the forward, backward and optimizer phases of the GPU stream and mark
iteration starts. :func:`write_html` exports any of them as a standalone HTML file.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from offsim.report.bottleneck import bottleneck
from offsim.report.tracks import (
    LINKS,
    PHASE_COLORS,
    RESOURCE_LABELS,
    RESOURCES,
    TIER_LABELS,
    TIERS,
    assign_lanes,
    iteration_windows,
    kind_label,
    lane_label,
    link_rate_steps,
    steady_windows,
    window_note,
)
from offsim.results import RunResult

#: Colour per kind of work (stable across runs, so two reports compare at a glance).
KIND_COLORS = {
    "forward": "#1f77b4", "backward": "#ff7f0e", "recompute": "#9467bd", "optimizer": "#2ca02c",
    "stall": "#d62728", "param_fetch": "#17becf", "act_offload": "#bcbd22", "act_fetch": "#8c564b",
    "grad_offload": "#e377c2", "grad_reduce": "#7f7f7f", "grad_accumulate": "#aec7e8",
    "grad_cast": "#ffbb78", "param_update": "#98df8a", "param_allgather": "#c5b0d5",
    "optimizer_swap_in": "#c49c94", "optimizer_swap_out": "#f7b6d2",
}
TIER_COLORS = {"gpu": "#636efa", "host_pinned": "#ef553b", "host": "#00a07a", "nvme": "#ab63fa", "pfs": "#8c564b"}
_TIER_FILL = {"gpu": "rgba(99,110,250,0.18)", "host_pinned": "rgba(239,85,59,0.18)",
              "host": "rgba(0,160,122,0.18)", "nvme": "rgba(171,99,250,0.18)",
              "pfs": "rgba(140,86,75,0.18)"}
_FALLBACK_COLORS = ("#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173")
_SOLID_PHASE = {"forward": "#1f77b4", "backward": "#ff7f0e", "optimizer": "#2ca02c"}
_TEMPLATE = "plotly_white"
_MARGIN = {"l": 10, "r": 10, "t": 60, "b": 40}
_LEGEND = {"orientation": "v", "x": 1.01, "xanchor": "left", "y": 1, "yanchor": "top", "font": {"size": 10},
           "tracegroupgap": 12}
#: Colour per resource in the comparison bars (``idle``: nothing moving while the GPU waited).
RESOURCE_COLORS = {"gpu": "#1f77b4", "h2d": "#d62728", "d2h": "#2ca02c", "nvme_read": "#9467bd",
                   "nvme_write": "#ff7f0e", "cpu": "#17becf", "dram_copy": "#e377c2", "gpu_link": "#7f7f7f",
                   "pfs_read": "#8c564b", "pfs_write": "#bcbd22", "idle": "#c7c7c7"}


def run_title(result: RunResult) -> str:
    """``llama2-7b on rtx4090-pcie4-ws with zero-offload``."""
    cfg = result.config
    return f"{cfg.workload.name} on {cfg.hardware.name} with {cfg.strategy.name}"


def run_labels(results: Sequence[RunResult]) -> list[str]:
    """Short labels that tell the runs apart (only the fields that differ between them)."""
    fields = [("strategy", lambda r: r.config.strategy.name), ("workload", lambda r: r.config.workload.name),
              ("hardware", lambda r: r.config.hardware.name)]
    differ = [get for _, get in fields if len({get(r) for r in results}) > 1] or [fields[0][1]]
    labels = [" / ".join(get(r) for get in differ) for r in results]
    return [f"{lab} ({i + 1})" if labels.count(lab) > 1 else lab for i, lab in enumerate(labels)]


def _kind_color(kind: str) -> str:
    return KIND_COLORS.get(kind, _FALLBACK_COLORS[sum(map(ord, kind)) % len(_FALLBACK_COLORS)])


def _phase_shapes(result: RunResult) -> list[dict]:
    """Background bands for the phases and dashed lines at iteration starts (all panels)."""
    shapes = [dict(type="rect", xref="x", yref="paper", x0=start, x1=end, y0=0, y1=1, layer="below",
                   fillcolor=PHASE_COLORS.get(name, "rgba(0,0,0,0.05)"), line={"width": 0})
              for _, name, start, end in result.recorder.phases if end > start]
    shapes += [dict(type="line", xref="x", yref="paper", x0=start, x1=start, y0=0, y1=1, layer="below",
                    line={"color": "rgba(0,0,0,0.35)", "width": 1, "dash": "dash"})
               for _, start, _ in iteration_windows(result)]
    return shapes


def _decorate(fig: go.Figure, result: RunResult, title: str, height: int) -> go.Figure:
    """Phase bands, iteration labels, a legend entry per phase, common layout."""
    for name, color in _SOLID_PHASE.items():
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=f"{name} phase",
                                 legendgroup="phases", hoverinfo="skip",
                                 marker={"symbol": "square", "size": 11, "color": color, "opacity": 0.35}))
    annotations = [dict(x=start, y=1.0, xref="x", yref="paper", text=f"iteration {k}", showarrow=False,
                        xanchor="left", yanchor="bottom", font={"size": 10, "color": "#555"})
                   for k, start, _ in iteration_windows(result)]
    fig.update_layout(shapes=_phase_shapes(result), annotations=[*fig.layout.annotations, *annotations],
                      title={"text": title, "x": 0.01, "y": 0.98, "yanchor": "top"},
                      template=_TEMPLATE, height=height, hovermode="closest",
                      margin={"l": 10, "r": 10, "t": 70, "b": 40}, legend=_LEGEND)
    return fig


def _empty(title: str, message: str) -> go.Figure:
    fig = go.Figure()
    note = dict(text=message, showarrow=False, xref="paper", yref="paper", x=0.5, y=0.5)
    fig.update_layout(title=title, template=_TEMPLATE, height=220, annotations=[note])
    return fig


def _with_lanes(spans: pd.DataFrame) -> pd.DataFrame:
    """Spans with a ``track`` column (resource lane label) and a ``track_order`` key."""
    rows = list(spans.itertuples(index=False))
    lanes = assign_lanes(rows)
    order = {r: i for i, r in enumerate(RESOURCES)}
    out = spans.assign(lane=lanes)
    out["track"] = [lane_label(r, lane) for r, lane in zip(out["resource"], lanes, strict=True)]
    out["track_order"] = [order.get(r, len(order)) * 1000 + lane
                          for r, lane in zip(out["resource"], lanes, strict=True)]
    return out


def _bytes_text(nbytes: float) -> str:
    if nbytes <= 0:
        return ""
    return f"{nbytes / 1e9:.3g} GB" if nbytes >= 1e9 else f"{nbytes / 1e6:.3g} MB"


def _windowed(result: RunResult) -> str:
    """A title's note when the steady-state shortcut skipped repetitions (left out of the figure)."""
    return " (repetitions simulated; those the steady-state shortcut skipped left out)" if window_note(result) else ""


def timeline_figure(result: RunResult, title: str | None = None) -> go.Figure:
    """Gantt chart of every resource over the run (one row per lane), the spans simulated
    (repetitions the steady-state shortcut skipped are left out, and the title says so)."""
    title = title or f"Timeline: {run_title(result)}{_windowed(result)}"
    spans = result.spans(window=True)
    if spans.empty:
        return _empty(title, result.metrics.infeasible_reason or "no spans recorded")
    spans = _with_lanes(spans)
    spans["dur"] = spans["end_s"] - spans["start_s"]
    spans["info"] = [f"{p}, iteration {it}, layer {lay}" if lay >= 0 else f"{p}, iteration {it}"
                     for p, it, lay in zip(spans["phase"], spans["iteration"], spans["layer"], strict=True)]
    spans["size"] = [_bytes_text(b) for b in spans["bytes"]]
    fig = go.Figure()
    for kind, g in spans.groupby("kind", sort=False):
        fig.add_trace(go.Bar(
            y=g["track"].tolist(), x=g["dur"].tolist(), base=g["start_s"].tolist(), orientation="h",
            name=kind_label(str(kind)), marker={"color": _kind_color(str(kind)), "line": {"width": 0}},
            customdata=list(zip(g["name"], g["info"], g["size"], strict=True)),
            hovertemplate="<b>%{customdata[0]}</b><br>%{customdata[1]}<br>start %{base:.6g} s, "
                          "%{x:.4g} s<br>%{customdata[2]}<extra>%{fullData.name}</extra>"))
    tracks = spans.drop_duplicates("track").sort_values("track_order")["track"].tolist()
    fig.update_yaxes(categoryorder="array", categoryarray=tracks[::-1], title=None)
    fig.update_xaxes(title="time (s)")
    fig.update_layout(barmode="overlay", bargap=0.25)
    legend_rows = len(fig.data) + len(_SOLID_PHASE)
    return _decorate(fig, result, title, height=max(170 + 32 * len(tracks), 140 + 30 * legend_rows))


def _level_steps(levels: pd.DataFrame, tier: str, end_s: float) -> tuple[list[float], list[float]]:
    """(t, GiB) of one tier, one point per instant (the last sample at an instant wins)."""
    lv = levels[levels["tier"] == tier].drop_duplicates("t_s", keep="last")
    t = lv["t_s"].tolist()
    gib = (lv["bytes"] / 2**30).tolist()
    if t and end_s > t[-1]:
        t.append(end_s)
        gib.append(gib[-1])
    return t, gib


def memory_figure(result: RunResult, title: str | None = None) -> go.Figure:
    """Bytes resident per tier over time (GiB), one panel per tier, phases shaded; the samples
    simulated (as :func:`timeline_figure`)."""
    title = title or f"Memory per tier: {run_title(result)}{_windowed(result)}"
    levels = result.levels(window=True)
    tiers = [t for t in TIERS if (levels.loc[levels["tier"] == t, "bytes"] > 0).any()]
    if not tiers:
        return _empty(title, result.metrics.infeasible_reason or "no memory samples recorded")
    capacity = result.footprint_bytes.get("capacity", {})
    peaks = result.metrics.peak_bytes.model_dump()
    subtitles = []
    for tier in tiers:
        text = f"{TIER_LABELS[tier]}: peak {peaks.get(tier, 0) / 2**30:.3g} GiB"
        if capacity.get(tier):
            text += f" of {capacity[tier] / 2**30:.4g} GiB"
        subtitles.append(text)
    fig = make_subplots(rows=len(tiers), cols=1, shared_xaxes=True, vertical_spacing=0.08,
                        subplot_titles=subtitles)
    for row, tier in enumerate(tiers, start=1):
        t, gib = _level_steps(levels, tier, result.recorder.end_s)
        fig.add_trace(go.Scatter(x=t, y=gib, mode="lines", name=tier, showlegend=False,
                                 line={"shape": "hv", "width": 1.6, "color": TIER_COLORS[tier]},
                                 fill="tozeroy", fillcolor=_TIER_FILL[tier],
                                 hovertemplate="%{x:.6g} s: %{y:.4g} GiB<extra>" + tier + "</extra>"),
                      row=row, col=1)
        fig.update_yaxes(title_text="GiB", rangemode="tozero", row=row, col=1)
    fig.update_xaxes(title_text="time (s)", row=len(tiers), col=1)
    for ann in fig.layout.annotations:  # the panel titles, right-aligned (iteration labels go left)
        ann.update(font={"size": 11}, x=1, xanchor="right")
    return _decorate(fig, result, title, height=130 + 170 * len(tiers))


def link_figure(result: RunResult, title: str | None = None) -> go.Figure:
    """Throughput (GB/s) on each link and direction over time, phases shaded; the spans
    simulated (as :func:`timeline_figure`)."""
    title = title or f"Link throughput: {run_title(result)}{_windowed(result)}"
    spans = result.recorder.spans.window()
    fig = go.Figure()
    for link in LINKS:
        steps = link_rate_steps(spans, link)
        if not steps:
            continue
        t = [0.0, *(s[0] for s in steps), result.recorder.end_s]
        rate = [0.0, *(s[1] / 1e9 for s in steps), 0.0]
        dash = "solid" if link in ("h2d", "d2h", "nvme_read", "nvme_write") else "dot"  # not PCIe/NVMe
        # (the PFS is reached over the network: dotted too)
        line = {"shape": "hv", "width": 1.6, "color": RESOURCE_COLORS[link], "dash": dash}
        fig.add_trace(go.Scatter(x=t, y=rate, mode="lines", name=RESOURCE_LABELS[link], line=line,
                                 hovertemplate="%{x:.6g} s: %{y:.4g} GB/s<extra>%{fullData.name}</extra>"))
    if not fig.data:
        return _empty(title, "no bytes moved on any link")
    fig.update_xaxes(title="time (s)")
    fig.update_yaxes(title="GB/s", rangemode="tozero")
    return _decorate(fig, result, title, height=380)


def stall_table(result: RunResult) -> pd.DataFrame:
    """Per layer, per steady iteration: compute seconds and GPU stall seconds by cause.

    Columns: ``layer``, ``name``, ``forward_s``, ``backward_s`` (recompute included),
    ``stall_s``, ``stall_share`` (of the iteration), then ``stall_<cause>_s`` for each cause
    the GPU reported (``params``, ``activations``, ``a free gradient buffer``, ...).
    """
    spans = result.spans()
    idx = [k for k, _, _ in steady_windows(result)] if result.feasible else []
    if spans.empty or not idx:
        return pd.DataFrame(columns=["layer", "name", "forward_s", "backward_s", "stall_s", "stall_share"])
    n = len(idx)
    iteration_s = sum(end - start for _, start, end in steady_windows(result)) / n
    spans = spans[spans["iteration"].isin(idx) & (spans["layer"] >= 0)]
    rows: dict[int, dict] = {}
    for s in spans.itertuples(index=False):
        row = rows.setdefault(int(s.layer), {"layer": int(s.layer), "name": "", "forward_s": 0.0,
                                             "backward_s": 0.0, "stall_s": 0.0})
        dur = (s.end_s - s.start_s) / n
        if s.resource == "gpu":
            row["name"] = row["name"] or str(s.name).removesuffix(f" {s.kind}")
            row["forward_s" if s.kind == "forward" else "backward_s"] += dur
        elif s.resource == "gpu_stall":
            layer_name, _, cause = str(s.name).partition(" waits for ")
            row["name"] = row["name"] or layer_name
            row["stall_s"] += dur
            key = f"stall_{cause or 'other'}_s"
            row[key] = row.get(key, 0.0) + dur
    table = pd.DataFrame(sorted(rows.values(), key=lambda r: r["layer"])).fillna(0.0)
    table.insert(5, "stall_share", table["stall_s"] / iteration_s)
    return table


def stall_table_figure(table: pd.DataFrame, title: str = "Per-layer compute and GPU stalls") -> go.Figure:
    """:func:`stall_table` as a plotly table (milliseconds, stall share in %)."""
    cols = [c for c in table.columns if c not in ("layer", "name")]
    header = ["layer", "name", *(_column_label(c) for c in cols)]
    cells = [table["layer"].tolist(), table["name"].tolist()]
    for c in cols:
        scale, fmt = (100.0, "{:.1f}") if c == "stall_share" else (1e3, "{:.3g}")
        cells.append([fmt.format(v * scale) for v in table[c]])
    fig = go.Figure(go.Table(header={"values": header, "fill_color": "#eef", "align": "left"},
                             cells={"values": cells, "align": "left"}))
    fig.update_layout(title=title, template=_TEMPLATE, height=min(900, 140 + 24 * max(1, len(table))),
                      margin={"l": 10, "r": 10, "t": 50, "b": 10})
    return fig


def _column_label(column: str) -> str:
    if column == "stall_share":
        return "stall % of iteration"
    if column.startswith("stall_") and column != "stall_s":
        return f"waiting for {column.removeprefix('stall_').removesuffix('_s')} (ms)"
    return column.removesuffix("_s").replace("_", " ") + " (ms)"


def breakdown_figure(results: Sequence[RunResult], title: str = "Where each iteration goes") -> go.Figure:
    """Per run, a stacked bar of the steady iteration: GPU compute, then the GPU's waits charged
    to the resource on the critical path (see :mod:`offsim.report.bottleneck`)."""
    runs = [(lab, r) for lab, r in zip(run_labels(results), results, strict=True)
            if r.feasible and r.recorder.spans]
    if not runs:
        return _empty(title, "no feasible run")
    parts: dict[str, list[float]] = {}  # resource (``gpu``: compute, ``idle``: nothing moving)
    for k, (_, r) in enumerate(runs):
        b = bottleneck(r)
        shares = {"gpu": b.gpu_busy_s, **b.waits_by_resource(), "idle": b.unattributed_s}
        for resource, secs in shares.items():
            parts.setdefault(resource, [0.0] * len(runs))[k] = secs
    fig = go.Figure()
    labels = [lab for lab, _ in runs]
    order = [*RESOURCES, "idle"]
    for resource in sorted(parts, key=lambda r: order.index(r) if r in order else len(order)):
        if not any(parts[resource]):
            continue
        name = {"gpu": "GPU compute", "idle": "waiting, nothing moving"}.get(
            resource, f"waiting on {RESOURCE_LABELS.get(resource, resource)}")
        fig.add_trace(go.Bar(y=labels, x=parts[resource], orientation="h", name=name,
                             marker_color=RESOURCE_COLORS.get(resource),
                             hovertemplate="%{y}: %{x:.4g} s<extra>" + name + "</extra>"))
    fig.update_layout(barmode="stack", title=title, template=_TEMPLATE, xaxis_title="seconds per iteration",
                      height=160 + 45 * len(runs), margin={"l": 10, "r": 10, "t": 60, "b": 40},
                      legend={**_LEGEND, "traceorder": "normal"})
    fig.update_yaxes(autorange="reversed")
    return fig


def _first_steady(result: RunResult) -> tuple[float, float]:
    windows = steady_windows(result)
    _, start, end = windows[0]
    return start, end


def memory_compare_figure(results: Sequence[RunResult], tier: str = "gpu",
                          title: str | None = None) -> go.Figure:
    """Bytes resident in ``tier`` over the first steady iteration of each run (time from its start)."""
    title = title or f"{TIER_LABELS.get(tier, tier)} over one steady iteration"
    fig = go.Figure()
    for label, r in zip(run_labels(results), results, strict=True):
        if not r.feasible or not r.recorder.levels:
            continue
        start, end = _first_steady(r)
        lv = r.levels()
        lv = lv[lv["tier"] == tier]
        before = lv[lv["t_s"] <= start].tail(1)["bytes"].tolist()
        inside = lv[(lv["t_s"] > start) & (lv["t_s"] < end)].drop_duplicates("t_s", keep="last")
        t = [0.0, *(inside["t_s"] - start).tolist()]
        gib = [*(b / 2**30 for b in before[:1] or [0.0]), *(inside["bytes"] / 2**30).tolist()]
        t.append(end - start)
        gib.append(gib[-1])
        fig.add_trace(go.Scatter(x=t, y=gib, mode="lines", line={"shape": "hv", "width": 1.8}, name=label,
                                 hovertemplate="%{x:.6g} s: %{y:.4g} GiB<extra>%{fullData.name}</extra>"))
    fig.update_layout(title=title, template=_TEMPLATE, height=380, yaxis_title="GiB", legend=_LEGEND,
                      xaxis_title="time since iteration start (s)", margin=_MARGIN)
    fig.update_yaxes(rangemode="tozero")
    return fig


def _relative_phase_shapes(result: RunResult, start: float, end: float, row: int) -> list[dict]:
    """Phase bands of the window ``[start, end]`` on panel ``row``, time from ``start``."""
    axis = "" if row == 1 else str(row)
    return [dict(type="rect", xref=f"x{axis}", yref=f"y{axis} domain", x0=max(a, start) - start,
                 x1=min(b, end) - start, y0=0, y1=1, layer="below", line={"width": 0},
                 fillcolor=PHASE_COLORS.get(name, "rgba(0,0,0,0.05)"))
            for _, name, a, b in result.recorder.phases if b > start and a < end and b > a]


def link_compare_figure(results: Sequence[RunResult], links: Sequence[str] = ("h2d", "d2h"),
                        title: str = "Host link throughput over one steady iteration") -> go.Figure:
    """Throughput on ``links`` over the first steady iteration of each run: one panel per run,
    time from the iteration's start, the run's phases shaded."""
    runs = [(lab, r) for lab, r in zip(run_labels(results), results, strict=True)
            if r.feasible and r.recorder.spans]
    if not runs:
        return _empty(title, "no feasible run")
    fig = make_subplots(rows=len(runs), cols=1, shared_xaxes=True, vertical_spacing=0.25 / len(runs),
                        subplot_titles=[lab for lab, _ in runs])
    shapes: list[dict] = []
    for row, (_, r) in enumerate(runs, start=1):
        start, end = _first_steady(r)
        for link in links:
            all_steps = link_rate_steps(r.recorder.spans, link)
            at_start = ([v for t, v in all_steps if t <= start][-1:] or [0.0])[0]
            steps = [(start, at_start), *((t, v) for t, v in all_steps if start < t < end)]
            fig.add_trace(go.Scatter(
                x=[t - start for t, _ in steps] + [end - start],
                y=[v / 1e9 for _, v in steps] + [steps[-1][1] / 1e9], mode="lines",
                line={"shape": "hv", "width": 1.6, "color": RESOURCE_COLORS[link]},
                name=RESOURCE_LABELS[link], legendgroup=link, showlegend=row == 1,
                hovertemplate="%{x:.6g} s: %{y:.4g} GB/s<extra>%{fullData.name}</extra>"), row=row, col=1)
        fig.update_yaxes(title_text="GB/s", rangemode="tozero", row=row, col=1)
        shapes += _relative_phase_shapes(r, start, end, row)
    fig.update_xaxes(title_text="time since iteration start (s)", row=len(runs), col=1)
    for ann in fig.layout.annotations:
        ann.update(font={"size": 11}, x=0, xanchor="left")
    fig.update_layout(title=title, template=_TEMPLATE, height=120 + 170 * len(runs), shapes=shapes,
                      margin={"l": 10, "r": 10, "t": 70, "b": 40}, legend=_LEGEND)
    return fig


def run_figures(result: RunResult) -> dict[str, go.Figure]:
    """The standard views of one run, by file stem."""
    return {"timeline": timeline_figure(result), "memory": memory_figure(result),
            "links": link_figure(result), "stalls": stall_table_figure(stall_table(result))}


def write_html(fig: go.Figure, path: Path | str) -> Path:
    """Write ``fig`` as a standalone HTML file (plotly.js inlined: opens offline)."""
    path = Path(path)
    fig.write_html(path, include_plotlyjs=True, full_html=True, config={"displaylogo": False})
    return path


def write_figures(result: RunResult, directory: Path | str) -> list[Path]:
    """Write :func:`run_figures` as ``<directory>/<name>.html``; returns the paths."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    return [write_html(fig, directory / f"{name}.html") for name, fig in run_figures(result).items()]
