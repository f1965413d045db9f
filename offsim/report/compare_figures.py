"""plotly figures for ``offsim compare`` and ``offsim rok``, built from their DataFrames only."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

LINK_COLUMNS = {"h2d_bytes": "PCIe H2D", "d2h_bytes": "PCIe D2H", "nvme_read_bytes": "NVMe read",
                "nvme_write_bytes": "NVMe write"}
CACHE_LABELS = {"gpu_params": "GPU parameter buffer", "dram_optimizer": "DRAM optimizer cache"}


def compare_figure(table: pd.DataFrame, title: str) -> go.Figure:
    """Four panels per variant: iteration and stall time, bytes per link, hit rate per cache,
    regret against OPT (bytes)."""
    ok = table[table["feasible"]]
    if ok.empty or "iteration_time_s" not in ok:
        return go.Figure(layout={"title": f"{title}: no variant fits"})
    fig = make_subplots(rows=2, cols=2, subplot_titles=(
        "time per iteration (s)", "bytes per iteration per link (GB)", "hit rate per cache",
        "regret vs OPT: extra bytes fetched per iteration (GB)"))
    x = ok["variant"]
    fig.add_bar(x=x, y=ok["iteration_time_s"], name="iteration", row=1, col=1, marker_color="#1f77b4")
    fig.add_bar(x=x, y=ok["stall_s"], name="GPU stalled on data", row=1, col=1, marker_color="#d62728")
    for col, label in LINK_COLUMNS.items():
        if col in ok:
            fig.add_bar(x=x, y=ok[col] / 1e9, name=label, row=1, col=2)
    for name, label in CACHE_LABELS.items():
        if f"hit_rate_{name}" in ok:
            fig.add_bar(x=x, y=ok[f"hit_rate_{name}"], name=f"hits: {label}", row=2, col=1)
    if "regret_bytes" in ok:
        fig.add_bar(x=x, y=ok["regret_bytes"] / 1e9, name="regret (bytes)", row=2, col=2,
                    marker_color="#9467bd")
    fig.update_layout(title=title, barmode="group", height=800, legend={"orientation": "h", "y": -0.12})
    fig.update_yaxes(range=[0, 1.05], row=2, col=1)
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
