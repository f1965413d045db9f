"""plotly figures for ``offsim compare`` (bars per variant, or curves over cache size with the
bounds) and ``offsim rok``, built from their DataFrames only."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

LINK_COLUMNS = {"h2d_bytes": "PCIe H2D", "d2h_bytes": "PCIe D2H", "nvme_read_bytes": "NVMe read",
                "nvme_write_bytes": "NVMe write"}
CACHE_LABELS = {"gpu_params": "GPU parameter buffer", "dram_optimizer": "DRAM optimizer cache"}


def compare_figure(table: pd.DataFrame, title: str) -> go.Figure:
    """The curve over cache size when the table sweeps one (:func:`curve_figure`); otherwise four
    panels per variant: iteration and stall time, bytes per link, hit rate per cache, and total
    bytes against the lower and upper bound."""
    ok = table[table["feasible"].astype(bool)] if "feasible" in table else table
    if ok.empty or "iteration_time_s" not in ok:
        return go.Figure(layout={"title": f"{title}: no variant fits"})
    swept = sweep_column(ok)
    if swept is not None:
        return curve_figure(ok, swept, title)
    fig = make_subplots(rows=2, cols=2, subplot_titles=(
        "time per iteration (s)", "bytes per iteration per link (GB)", "hit rate per cache",
        "bytes per iteration, all links (GB), against the bounds"))
    x = ok["variant"]
    fig.add_bar(x=x, y=ok["iteration_time_s"], name="iteration", row=1, col=1, marker_color="#1f77b4")
    fig.add_bar(x=x, y=ok["stall_s"], name="GPU stalled on data", row=1, col=1, marker_color="#d62728")
    if "iteration_time_lower_bound_s" in ok:
        fig.add_scatter(x=x, y=ok["iteration_time_lower_bound_s"], mode="lines+markers", name=TIME_BOUND_LABEL,
                        line={"color": "black", "dash": "dash"}, row=1, col=1)
    for col, label in LINK_COLUMNS.items():
        if col in ok:
            fig.add_bar(x=x, y=ok[col] / 1e9, name=label, row=1, col=2)
    for name, label in CACHE_LABELS.items():
        if f"hit_rate_{name}" in ok:
            fig.add_bar(x=x, y=ok[f"hit_rate_{name}"], name=f"hits: {label}", row=2, col=1)
    if "total_bytes" in ok:
        fig.add_bar(x=x, y=ok["total_bytes"] / 1e9, name="moved (all links)", row=2, col=2, marker_color="#9467bd")
        fig.add_scatter(x=x, y=ok["lower_bound_bytes"] / 1e9, mode="lines+markers", name=BOUND_LABELS[0],
                        line={"color": "black", "dash": "dash"}, row=2, col=2)
        fig.add_scatter(x=x, y=ok["upper_bound_bytes"] / 1e9, mode="lines", name=BOUND_LABELS[1],
                        line={"color": "grey", "dash": "dot"}, row=2, col=2)
        low = float(ok["lower_bound_bytes"].min()) / 1e9
        fig.update_yaxes(range=[low * 0.98, float(ok["total_bytes"].max()) / 1e9 * 1.01], row=2, col=2)
    fig.update_layout(title=title, barmode="group", height=800, legend={"orientation": "h", "y": -0.12})
    fig.update_yaxes(range=[0, 1.05], row=2, col=1)
    return fig


BOUND_LABELS = ("lower bound (any policy)", "best schedule found (upper bound)")
#: The lower bound on the iteration time (offsim.iteration_bound).
TIME_BOUND_LABEL = "time lower bound (any eviction policy)"
SIZE_LABELS = {"cache_gib": "GPU parameter buffer (GiB)", "dram_cache_gib": "DRAM optimizer cache (GiB)"}


def sweep_column(table: pd.DataFrame) -> str | None:
    """The budget the table sweeps (``cache_gib`` or ``dram_cache_gib``), if it sweeps one."""
    for col in SIZE_LABELS:
        if col in table and table[col].nunique() > 1:
            return col
    return None


def curve_figure(table: pd.DataFrame, column: str, title: str) -> go.Figure:
    """Miss-ratio-style curves: bytes per iteration over all links (top) and iteration time
    (bottom) against the cache size ``column``, one line per policy, with the lower bound on
    the bytes any policy must move and the best schedule found. Lines are split by the other
    budget when that varies too."""
    other = "dram_cache_gib" if column == "cache_gib" else "cache_gib"
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, subplot_titles=(
        "bytes per iteration, all links (GB)", "time per iteration (s)"))
    split = other in table and table[other].nunique() > 1
    for keys, part in table.groupby(["variant", other] if split else ["variant"], sort=False, dropna=False):
        part = part.sort_values(column)
        name = f"{keys[0]} ({SIZE_LABELS[other].split(' (')[0]} {keys[1]:.3g})" if split else str(keys[0])
        fig.add_scatter(x=part[column], y=part["total_bytes"] / 1e9, mode="lines+markers", name=name,
                        legendgroup=name, row=1, col=1)
        fig.add_scatter(x=part[column], y=part["iteration_time_s"], mode="lines+markers", name=name,
                        legendgroup=name, showlegend=False, row=2, col=1)
    groups = table.groupby([column, other] if split else [column], sort=True, dropna=False)
    bounds = groups[["lower_bound_bytes", "upper_bound_bytes"]].min().reset_index()
    for (label, col, style) in ((BOUND_LABELS[0], "lower_bound_bytes", {"color": "black", "dash": "dash",
                                                                       "width": 3}),
                                (BOUND_LABELS[1], "upper_bound_bytes", {"color": "grey", "dash": "dot"})):
        for key, part in (bounds.groupby(other, dropna=False) if split else [(None, bounds)]):
            suffix = f" ({key:.3g})" if split else ""
            fig.add_scatter(x=part[column], y=part[col] / 1e9, mode="lines", name=label + suffix, line=style,
                            row=1, col=1)
    if "iteration_time_lower_bound_s" in table:
        times = groups["iteration_time_lower_bound_s"].min().reset_index()
        for key, part in (times.groupby(other, dropna=False) if split else [(None, times)]):
            suffix = f" ({key:.3g})" if split else ""
            fig.add_scatter(x=part[column], y=part["iteration_time_lower_bound_s"], mode="lines",
                            name=TIME_BOUND_LABEL + suffix, line={"color": "black", "dash": "dash", "width": 3},
                            row=2, col=1)
    fig.update_xaxes(title_text=SIZE_LABELS[column], type="log", row=2, col=1)
    fig.update_xaxes(type="log", row=1, col=1)
    fig.update_layout(title=title, height=800, legend={"orientation": "h", "y": -0.15})
    return fig


def rok_figure(curve: pd.DataFrame, title: str) -> go.Figure:
    """Memory saved (GiB) against time cost (s per iteration), one line per placement, each
    point labelled with the number of blocks that take it."""
    fig = go.Figure()
    for placement, part in curve.groupby("placement", sort=False):
        part = part[part["feasible"] & part["time_cost_s"].notna()]
        fig.add_scatter(x=part["time_cost_s"], y=part["memory_saved_bytes"] / 2**30,
                        mode="lines+markers+text", text=[f"{n}" for n in part["blocks"]],
                        textposition="top center", name=placement)
    fig.update_layout(title=title, xaxis_title="time cost per iteration (s)",
                      yaxis_title="peak GPU memory saved (GiB)", legend_title="placement (label: blocks)")
    return fig


def write_html(fig: go.Figure, path: Path) -> Path:
    """A standalone HTML file (plotly.js embedded, so it opens offline)."""
    path = Path(path)
    fig.write_html(path, include_plotlyjs=True, full_html=True)
    return path
