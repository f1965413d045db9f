"""Fits of the raw measurements: latency + size/bandwidth, GEMM efficiency, CPU rates, NVMe.

Every fit keeps its residuals: :class:`LatBwFit` reports the RMS and largest relative error of
the model against the medians it was fitted to, so a poor fit is visible in ``fits.json`` and in
the progress output rather than hidden in a single number.

The latency-bandwidth form ``t = latency + n / bandwidth`` is the one the hardware profile uses
(``offsim.config.hardware.TransferCurve``) and the one nvbandwidth-style calibrations fit
(../shared/reference/calibration_practice.md §2).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from offsim.calibrate.common import median


@dataclass(frozen=True)
class LatBwFit:
    """``t = latency_s + size / bandwidth_bytes_per_s`` fitted to median times.

    Attributes:
        latency_s: fixed cost per operation, seconds (>= 0).
        bandwidth_bytes_per_s: asymptotic rate, bytes/s.
        n_points: sizes fitted.
        rms_rel_error: root mean square of ``(predicted - measured) / measured``.
        max_rel_error: largest ``|predicted - measured| / measured``.
        max_abs_error_s: largest ``|predicted - measured|``, seconds.
        residuals: per size: ``size_bytes``, ``measured_s``, ``predicted_s``, ``rel_error``.
        note: what the fit had to do (``latency clamped to 0``), empty when nothing.
    """

    latency_s: float
    bandwidth_bytes_per_s: float
    n_points: int
    rms_rel_error: float
    max_rel_error: float
    max_abs_error_s: float
    residuals: list[dict[str, float]] = field(default_factory=list)
    note: str = ""

    @property
    def latency_us(self) -> float:
        """Latency in microseconds (the profile's unit)."""
        return self.latency_s * 1e6

    @property
    def bandwidth_gb_per_s(self) -> float:
        """Bandwidth in GB/s (1e9, the profile's unit)."""
        return self.bandwidth_bytes_per_s / 1e9

    def predict_s(self, size_bytes: float) -> float:
        """Modelled time of one operation of ``size_bytes``."""
        return self.latency_s + size_bytes / self.bandwidth_bytes_per_s

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly form, with the profile units added."""
        out = asdict(self)
        out["latency_us"] = self.latency_us
        out["bandwidth_gb_per_s"] = self.bandwidth_gb_per_s
        return out

    def summary(self) -> str:
        """One line: latency, bandwidth and the residuals."""
        return (
            f"latency {self.latency_us:.2f} us, bandwidth {self.bandwidth_gb_per_s:.3f} GB/s "
            f"(RMS rel. error {self.rms_rel_error:.1%}, max {self.max_rel_error:.1%}, n={self.n_points})"
            + (f"; {self.note}" if self.note else "")
        )


def fit_latency_bandwidth(sizes: Sequence[float], times: Sequence[float]) -> LatBwFit:
    """Least-squares fit of ``t = a + n / b`` on relative error.

    Each equation is divided by its measured time, so that small transfers (which fix the
    latency) and large ones (which fix the bandwidth) weigh the same; an ordinary fit on
    absolute time would let the largest size decide everything. A negative latency (possible
    with noisy data) is clamped to 0 and the bandwidth refitted; the note says so.

    Raises:
        ValueError: fewer than two distinct sizes, a non-positive size or time, or data that
            give no positive bandwidth.
    """
    n = np.asarray(sizes, dtype=float)
    t = np.asarray(times, dtype=float)
    if n.shape != t.shape or n.ndim != 1:
        raise ValueError("sizes and times must be 1-D sequences of the same length")
    if len(np.unique(n)) < 2:
        raise ValueError("need at least two distinct sizes to separate latency from bandwidth")
    if np.any(n <= 0) or np.any(t <= 0) or not np.all(np.isfinite(t)):
        raise ValueError("sizes and times must be positive and finite")
    w = 1.0 / t
    design = np.column_stack([np.ones_like(n), n]) * w[:, None]
    (a, inv_b), *_ = np.linalg.lstsq(design, t * w, rcond=None)
    note = ""
    if a < 0:
        a = 0.0
        inv_b = float(np.sum(w * w * n * t) / np.sum(w * w * n * n))  # weighted fit through 0
        note = "latency clamped to 0 (the unconstrained fit gave a negative latency)"
    if not inv_b > 0:
        raise ValueError("the data give no positive bandwidth (times do not grow with size)")
    pred = a + n * inv_b
    rel = (pred - t) / t
    residuals = [
        {"size_bytes": float(s), "measured_s": float(m), "predicted_s": float(p), "rel_error": float(r)}
        for s, m, p, r in zip(n, t, pred, rel, strict=True)
    ]
    return LatBwFit(
        latency_s=float(a),
        bandwidth_bytes_per_s=float(1.0 / inv_b),
        n_points=len(n),
        rms_rel_error=float(np.sqrt(np.mean(rel**2))),
        max_rel_error=float(np.max(np.abs(rel))),
        max_abs_error_s=float(np.max(np.abs(pred - t))),
        residuals=residuals,
        note=note,
    )


def medians_by(rows: Iterable[dict[str, Any]], keys: Sequence[str], value: str) -> dict[tuple, float]:
    """Median of ``value`` over rows grouped by the ``keys`` columns."""
    groups: dict[tuple, list[float]] = defaultdict(list)
    for r in rows:
        groups[tuple(r[k] for k in keys)].append(float(r[value]))
    return {k: median(v) for k, v in groups.items()}


# ---------------------------------------------------------------------------------------------
# Host <-> device transfers


@dataclass(frozen=True)
class TransferFit:
    """One transfer curve: the fit and the measured points ``[size_bytes, achieved GB/s]``."""

    direction: str
    memory: str
    concurrency: str
    fit: LatBwFit | None
    points: list[list[float]]
    error: str = ""

    @property
    def key(self) -> str:
        """``h2d/pinned/alone`` and the like."""
        return f"{self.direction}/{self.memory}/{self.concurrency}"

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly form."""
        return {
            "direction": self.direction,
            "memory": self.memory,
            "concurrency": self.concurrency,
            "fit": self.fit.to_dict() if self.fit else None,
            "points_bytes_gb_per_s": self.points,
            "error": self.error,
        }


def fit_transfers(rows: Iterable[dict[str, Any]]) -> dict[str, TransferFit]:
    """Fit every (direction, memory, concurrency) curve of ``raw_transfers`` rows.

    Rows carry ``direction``, ``memory``, ``concurrency``, ``size_bytes`` and ``device_time_s``
    (one row per timed copy); each size's median is fitted.
    """
    med = medians_by(rows, ("direction", "memory", "concurrency", "size_bytes"), "device_time_s")
    curves: dict[tuple[str, str, str], list[tuple[float, float]]] = defaultdict(list)
    for (d, m, c, s), t in med.items():
        curves[(d, m, c)].append((float(s), t))
    out: dict[str, TransferFit] = {}
    for (d, m, c), pts in sorted(curves.items()):
        pts.sort()
        sizes = [p[0] for p in pts]
        times = [p[1] for p in pts]
        points = [[s, s / t / 1e9] for s, t in pts]
        try:
            fit, err = fit_latency_bandwidth(sizes, times), ""
        except ValueError as exc:
            fit, err = None, str(exc)
        tf = TransferFit(d, m, c, fit, points, err)
        out[tf.key] = tf
    return out


def duplex_efficiency(fits: dict[str, TransferFit]) -> float | None:
    """Fraction of each direction's rate kept while the other runs, from pinned copies.

    Compares each direction's achieved rate at the largest size measured both alone and
    bidirectionally (nvbandwidth's bidir test reports the measured direction only); the mean
    of the two directions, capped at 1.
    """
    ratios = []
    for d in ("h2d", "d2h"):
        alone = fits.get(f"{d}/pinned/alone")
        both = fits.get(f"{d}/pinned/bidir")
        if not alone or not both:
            continue
        a = {p[0]: p[1] for p in alone.points}
        b = {p[0]: p[1] for p in both.points}
        common = sorted(set(a) & set(b))
        if common:
            s = common[-1]
            ratios.append(b[s] / a[s])
    if not ratios:
        return None
    return float(min(1.0, max(1e-3, sum(ratios) / len(ratios))))


# ---------------------------------------------------------------------------------------------
# GEMM


def gemm_efficiency_points(
    rows: Iterable[dict[str, Any]], peak_tflops: float, dtype: str
) -> tuple[list[list[float]], list[str]]:
    """``[[gflop, fraction_of_peak], ...]`` for the profile's ``gpu.gemm_efficiency``.

    Uses the median time of each GEMM shape of ``dtype`` (rows with ``kind == 'gemm'``);
    shapes with the same FLOP count are averaged so the points are strictly increasing.
    Fractions above 1.2 are not physical (the validator refuses them): they are capped and a
    message says the peak is probably wrong.

    Returns:
        The points, sorted by GFLOP, and messages.
    """
    rows = [r for r in rows if r.get("kind") == "gemm" and r.get("dtype") == dtype]
    med = medians_by(rows, ("m", "n", "k"), "time_s")
    by_flop: dict[float, list[float]] = defaultdict(list)
    for (m, n, k), t in med.items():
        flop = 2.0 * m * n * k
        by_flop[flop / 1e9].append(flop / t / (peak_tflops * 1e12))
    msgs: list[str] = []
    points = []
    for gflop in sorted(by_flop):
        frac = sum(by_flop[gflop]) / len(by_flop[gflop])
        if frac > 1.2:
            msgs.append(
                f"GEMM {dtype} at {gflop:.3g} GFLOP reached {frac:.2f} x the peak of {peak_tflops} TFLOP/s: "
                "the peak is probably wrong (capped at 1.2)"
            )
            frac = 1.2
        points.append([gflop, frac])
    return points, msgs


# ---------------------------------------------------------------------------------------------
# CPU


def fit_cpu(rows: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """Median optimizer rate per implementation and memcpy rates from ``raw_cpu`` rows.

    Returns a dict with ``optimizer`` (impl -> params/s, threads, params) and
    ``memcpy_gb_per_s`` per thread count, and ``page_touch_gb_per_s`` where it was measured.
    """
    rows = list(rows)
    out: dict[str, Any] = {"optimizer": {}, "memcpy": {}}
    opt = [r for r in rows if r["kind"] == "optimizer"]
    for impl, v in medians_by(opt, ("impl",), "params_per_s").items():
        sample = next(r for r in opt if r["impl"] == impl[0])
        out["optimizer"][impl[0]] = {
            "params_per_s": v,
            "params": sample["params"],
            "threads": sample["threads"],
        }
    mem = [r for r in rows if r["kind"] == "memcpy"]
    for (threads,), v in medians_by(mem, ("threads",), "gb_per_s").items():
        out["memcpy"][str(threads)] = {"gb_per_s": v, "threads": threads}
    touch = [r for r in rows if r["kind"] == "page_touch"]
    if touch:
        out["page_touch_gb_per_s"] = float(np.median([r["gb_per_s"] for r in touch]))
    return out


#: Preference order when choosing which optimizer rate goes into the profile.
OPTIMIZER_PREFERENCE = ("deepspeed-cpu-adam", "torch-adamw-foreach", "numpy-adamw")


def best_optimizer(cpu_fit: dict[str, Any]) -> tuple[str, float] | None:
    """The optimizer the profile should assume: DeepSpeed CPU-Adam, else torch, else numpy."""
    opts = cpu_fit.get("optimizer", {})
    for impl in OPTIMIZER_PREFERENCE:
        if impl in opts:
            return impl, float(opts[impl]["params_per_s"])
    if opts:
        impl = next(iter(opts))
        return impl, float(opts[impl]["params_per_s"])
    return None


# ---------------------------------------------------------------------------------------------
# NVMe


def detect_write_cache(windows: Sequence[dict[str, float]], *, drop_ratio: float = 0.75) -> dict[str, Any]:
    """Find an SLC/DRAM write-cache exhaustion in a sustained write.

    ``windows`` are consecutive time windows with ``bytes`` written and ``gb_per_s``. The early
    rate is the median of the first fifth, the late rate the median of the last quarter; a
    drop is declared when late < ``drop_ratio`` x early. The cache size is the bytes written
    before the first window after which the rate stays (in median) below the midpoint of the
    two rates.

    Returns:
        ``drop`` (bool), ``early_gb_per_s``, ``late_gb_per_s``, ``cache_bytes`` (None without
        a drop), ``total_bytes``, ``windows``.
    """
    rates = [float(w["gb_per_s"]) for w in windows]
    sizes = [float(w["bytes"]) for w in windows]
    out: dict[str, Any] = {
        "drop": False,
        "early_gb_per_s": None,
        "late_gb_per_s": None,
        "cache_bytes": None,
        "total_bytes": float(sum(sizes)),
        "windows": len(rates),
    }
    if len(rates) < 4:
        return out
    early = median(rates[: max(1, len(rates) // 5)])
    late = median(rates[-max(1, len(rates) // 4) :])
    out["early_gb_per_s"], out["late_gb_per_s"] = early, late
    if early <= 0 or late >= drop_ratio * early:
        return out
    mid = 0.5 * (early + late)
    for i in range(len(rates)):
        if rates[i] < mid and median(rates[i:]) < mid:
            out["drop"] = True
            out["cache_bytes"] = float(sum(sizes[:i]))
            break
    return out


def fit_nvme(rows: Iterable[dict[str, Any]], drives: int) -> dict[str, Any]:
    """Per-drive sequential rates, request latency and the sustained-write behaviour.

    * read / write: the best rate over the block-size x queue-depth sweep (and the layout
      write), divided by ``drives`` (the profile stores one drive's rate).
    * latency: ``t = latency + bs / bandwidth`` fitted to queue-depth-1 reads over the block
      sizes (when at least two were measured).
    * sustained: :func:`detect_write_cache` on the sustained-write windows; the post-cache
      rate and the cache size are per drive.
    """
    rows = list(rows)
    drives = max(1, int(drives))
    sweep = [r for r in rows if r["phase"] in ("sweep", "layout")]
    out: dict[str, Any] = {"drives": drives}
    for op in ("read", "write"):
        pts = [r for r in sweep if r["op"] == op and r["gb_per_s"] > 0]
        if pts:
            best = max(pts, key=lambda r: r["gb_per_s"])
            out[op] = {
                "array_gb_per_s": float(best["gb_per_s"]),
                "per_drive_gb_per_s": float(best["gb_per_s"]) / drives,
                "block_bytes": best["block_bytes"],
                "queue_depth": best["queue_depth"],
                "tool": best["tool"],
            }
    qd1 = [r for r in sweep if r["phase"] == "sweep" and r["op"] == "read" and r["queue_depth"] == 1]
    if len({r["block_bytes"] for r in qd1}) >= 2:
        sizes = [float(r["block_bytes"]) for r in qd1]
        per_req = [float(r["time_s"]) * r["block_bytes"] / r["bytes"] for r in qd1]
        try:
            out["latency"] = fit_latency_bandwidth(sizes, per_req).to_dict()
        except ValueError as exc:
            out["latency_error"] = str(exc)
    windows = [r for r in rows if r["phase"] == "sustained"]
    if windows:
        sus = detect_write_cache(windows)
        if sus["drop"]:
            sus["post_cache_per_drive_gb_per_s"] = sus["late_gb_per_s"] / drives
            sus["cache_per_drive_gb"] = sus["cache_bytes"] / drives / 1e9
        out["sustained"] = sus
    return out


def finite(x: float | None) -> bool:
    """True for a finite, positive number."""
    return x is not None and math.isfinite(x) and x > 0
