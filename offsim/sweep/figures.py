"""Plotly figures of a sweep table: a metric against each axis, a heatmap over two axes, and the
cost/time Pareto front. Built from the DataFrame alone (no simulation objects).

Rows that were not simulated (infeasible, dominated, error) have no iteration time and are left
out of the metric plots; the heatmap marks their cells (grey, with the reason); the Pareto figure
shows every simulated feasible point.
"""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import plotly.graph_objects as go

LABELS = {
    "iteration_time_s": "iteration time (s)",
    "tokens_per_s": "tokens/s",
    "cost_per_million_tokens_usd": "USD per million tokens",
    "capex_usd": "machine price (USD)",
    "usd_per_hour": "USD per hour",
    "energy_per_iteration_j": "energy per iteration (J)",
}


def _label(col: str) -> str:
    return LABELS.get(col, col)


def _simulated(df: pd.DataFrame, metric: str) -> pd.DataFrame:
    if df.empty or metric not in df.columns:
        return df.iloc[0:0]
    return df[(df["status"] == "ok") & df[metric].notna()]


def _is_numeric(series: pd.Series) -> bool:
    return pd.api.types.is_numeric_dtype(series) and not pd.api.types.is_bool_dtype(series)


def _hover(df: pd.DataFrame, axes: list[str]) -> list[str]:
    return ["<br>".join(f"{a} = {row[a]}" for a in axes) for _, row in df[axes].iterrows()]


def metric_vs_axis(
    df: pd.DataFrame, axis: str, axes: list[str], metric: str = "iteration_time_s"
) -> go.Figure:
    """Every simulated point against one axis, with the best value per axis value as a line."""
    ok = _simulated(df, metric)
    fig = go.Figure()
    x = ok[axis] if _is_numeric(ok[axis]) else ok[axis].astype(str)
    fig.add_trace(
        go.Scatter(
            x=x,
            y=ok[metric],
            mode="markers",
            name="points",
            opacity=0.45,
            text=_hover(ok, axes),
            hovertemplate="%{text}<br>" + _label(metric) + " = %{y:.4g}",
        )
    )
    if not ok.empty:
        best = ok.assign(_x=x).groupby("_x", sort=True)[metric].min()
        fig.add_trace(
            go.Scatter(x=best.index, y=best.values, mode="lines+markers", name="best over other axes")
        )
    fig.update_layout(
        title=f"{_label(metric)} against {axis}",
        xaxis_title=axis,
        yaxis_title=_label(metric),
        template="plotly_white",
    )
    if not _is_numeric(df[axis]):
        fig.update_xaxes(type="category")
    return fig


#: What a heatmap cell without a simulated feasible point says, by the best status among its points.
CELL_TEXT = {"too_slow": "too slow", "dominated": "dominated", "infeasible": "no fit", "error": "error"}


def _cell_status(df: pd.DataFrame, x: str, y: str) -> pd.DataFrame:
    """Per ``(y, x)`` pair, the text of a cell that has no simulated value (``''`` when it has one)."""
    order = ["ok", *CELL_TEXT]
    rank = df["status"].map(lambda s: order.index(s) if s in order else len(order))
    best = df.assign(_rank=rank).groupby([y, x], sort=True)["_rank"].min()
    text = best.map(lambda r: "" if r == 0 else CELL_TEXT.get(order[r] if r < len(order) else "", "?"))
    return text.unstack(x)


def heatmap(df: pd.DataFrame, x: str, y: str, metric: str = "iteration_time_s") -> go.Figure:
    """The best (smallest) ``metric`` over the other axes for each pair of ``x`` and ``y`` values.

    A pair with no simulated feasible point is drawn grey and says why (``no fit``, ``too slow``,
    ``dominated``, ``error``) instead of being left blank.
    """
    ok = _simulated(df, metric)
    status = _cell_status(df, x, y) if not df.empty else pd.DataFrame()
    table = pd.DataFrame()
    if not ok.empty:
        table = ok.pivot_table(index=y, columns=x, values=metric, aggfunc="min")
    table = table.reindex(index=status.index, columns=status.columns)
    xs, ys = [str(c) for c in status.columns], [str(i) for i in status.index]
    values = table.to_numpy(dtype=float)
    marked = status.to_numpy()
    fig = go.Figure()
    fig.add_trace(go.Heatmap(
        z=values, x=xs, y=ys, colorscale="Viridis_r", colorbar={"title": _label(metric)},
        text=[[f"{v:.3g}" if v == v else "" for v in row] for row in values], texttemplate="%{text}",
        name=_label(metric)))
    fig.add_trace(go.Heatmap(
        z=[[1.0 if t else None for t in row] for row in marked], x=xs, y=ys,
        colorscale=[[0, "#d9d9d9"], [1, "#d9d9d9"]], showscale=False,
        text=[[t or "" for t in row] for row in marked], texttemplate="%{text}", name="not simulated",
        hovertemplate="%{y}, %{x}: %{text}<extra></extra>"))
    fig.update_layout(
        title=f"{_label(metric)}: {y} x {x} (best over other axes; grey: no feasible point, and why)",
        xaxis_title=x,
        yaxis_title=y,
        template="plotly_white",
    )
    fig.update_xaxes(type="category")
    fig.update_yaxes(type="category")
    return fig


def cost_column(df: pd.DataFrame) -> str | None:
    """The best available cost column: per million tokens, else machine price, else hourly price."""
    for col in ("cost_per_million_tokens_usd", "capex_usd", "usd_per_hour"):
        if col in df.columns and df[col].notna().any():
            return col
    return None


def pareto_front(df: pd.DataFrame, x: str, y: str) -> pd.DataFrame:
    """Rows not beaten on both ``x`` and ``y`` (smaller is better for both), sorted by ``x``."""
    pts = df[df[x].notna() & df[y].notna()].sort_values([x, y], kind="stable")
    keep, best = [], float("inf")
    for idx, val in zip(pts.index, pts[y], strict=True):
        if val < best:
            keep.append(idx)
            best = val
    return pts.loc[keep]


def pareto_figure(
    df: pd.DataFrame, axes: list[str], metric: str = "iteration_time_s", cost: str | None = None
) -> go.Figure | None:
    """Cost against iteration time for every simulated point, with the Pareto front; None without costs."""
    ok = _simulated(df, metric)
    cost = cost or cost_column(ok)
    if cost is None:
        return None
    front = pareto_front(ok, metric, cost)
    fig = go.Figure()
    fig.add_trace(
        go.Scatter(
            x=ok[metric],
            y=ok[cost],
            mode="markers",
            name="points",
            opacity=0.45,
            text=_hover(ok, axes),
            hovertemplate="%{text}<br>%{x:.4g} s, %{y:.4g}",
        )
    )
    fig.add_trace(
        go.Scatter(
            x=front[metric],
            y=front[cost],
            mode="lines+markers",
            name="Pareto front",
            text=_hover(front, axes),
            hovertemplate="%{text}<br>%{x:.4g} s, %{y:.4g}",
        )
    )
    fig.update_layout(
        title=f"{_label(cost)} against {_label(metric)}",
        xaxis_title=_label(metric),
        yaxis_title=_label(cost),
        template="plotly_white",
    )
    return fig


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def write_figures(
    df: pd.DataFrame, axes: list[str], folder: str | Path, metric: str = "iteration_time_s"
) -> list[Path]:
    """Write ``<metric>-vs-<axis>.html`` per varied axis, a heatmap over the first two varied
    axes, and ``pareto.html`` into ``folder``; each file is self-contained (plotly.js inside)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    varied = [a for a in axes if a in df.columns and df[a].nunique(dropna=False) > 1]
    figs: dict[str, go.Figure] = {
        f"{_slug(metric.removesuffix('_s'))}-vs-{_slug(a)}": metric_vs_axis(df, a, axes, metric)
        for a in varied
    }
    if len(varied) >= 2:
        figs[f"heatmap-{_slug(varied[0])}-{_slug(varied[1])}"] = heatmap(df, varied[0], varied[1], metric)
    pareto = pareto_figure(df, axes, metric)
    if pareto is not None:
        figs["pareto"] = pareto
    paths = []
    for name, fig in figs.items():
        path = folder / f"{name}.html"
        fig.write_html(path, include_plotlyjs=True, full_html=True)
        paths.append(path)
    return paths
