"""Chrome / Perfetto trace (``chrome://tracing``, ui.perfetto.dev) of a run.

One track (``tid``) per resource, complete events (``ph: "X"``, microseconds) for spans, and
counter tracks (``ph: "C"``) for bytes resident per tier and throughput per link. Format:
the Trace Event Format document (Google, "Trace Event Format", 2016).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from offsim.results import RunResult

TRACKS = ["gpu", "gpu_stall", "h2d", "d2h", "nvme_read", "nvme_write", "cpu", "dram_copy", "gpu_link"]
TRACK_LABELS = {
    "gpu": "GPU compute", "gpu_stall": "GPU waiting for data", "h2d": "PCIe H2D", "d2h": "PCIe D2H",
    "nvme_read": "NVMe read", "nvme_write": "NVMe write", "cpu": "CPU optimizer",
    "dram_copy": "Host copies (DRAM)", "gpu_link": "GPU-GPU link",
}
_US = 1e6


def _metadata(pid: int) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = [{"ph": "M", "pid": pid, "name": "process_name", "args": {"name": "offsim rank 0"}}]
    for tid, track in enumerate(TRACKS):
        events.append({"ph": "M", "pid": pid, "tid": tid, "name": "thread_name", "args": {"name": TRACK_LABELS[track]}})
        events.append({"ph": "M", "pid": pid, "tid": tid, "name": "thread_sort_index", "args": {"sort_index": tid}})
    return events


def _link_throughput(result: RunResult, pid: int) -> list[dict[str, Any]]:
    """Counter events: GB/s on each link, stepping at every span start and end."""
    events: list[dict[str, Any]] = []
    for link in ("h2d", "d2h", "nvme_read", "nvme_write"):
        changes: list[tuple[float, float]] = []
        for s in result.recorder.spans:
            if s.resource == link and s.end_s > s.start_s:
                rate = s.bytes / (s.end_s - s.start_s) / 1e9
                changes += [(s.start_s, rate), (s.end_s, -rate)]
        level = 0.0
        for t, delta in sorted(changes):
            level = max(0.0, level + delta)
            events.append({"ph": "C", "pid": pid, "name": f"{link} GB/s", "ts": t * _US, "args": {"GB/s": round(level, 6)}})
    return events


def chrome_trace(result: RunResult) -> dict[str, Any]:
    """The trace as a JSON-serialisable dict (``traceEvents`` plus run metadata)."""
    pid = 0
    events = _metadata(pid)
    tids = {t: i for i, t in enumerate(TRACKS)}
    for s in result.recorder.spans:
        events.append({
            "ph": "X", "pid": pid, "tid": tids.get(s.resource, len(TRACKS)), "name": s.name,
            "cat": f"{s.phase},{s.kind}", "ts": s.start_s * _US, "dur": max(0.0, s.end_s - s.start_s) * _US,
            "args": {"iteration": s.iteration, "phase": s.phase, "kind": s.kind, "layer": s.layer, "bytes": s.bytes},
        })
    for lv in result.recorder.levels:
        events.append({"ph": "C", "pid": pid, "name": f"{lv.tier} memory GiB", "ts": lv.t_s * _US,
                       "args": {"GiB": round(lv.bytes / 2**30, 6)}})
    events += _link_throughput(result, pid)
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {"hardware": result.config.hardware.name, "workload": result.config.workload.name,
                      "strategy": result.config.strategy.name,
                      "iteration_time_s": result.metrics.iteration_time_s},
    }


def write_chrome_trace(result: RunResult, path: Path) -> Path:
    """Write the trace JSON to ``path``."""
    path.write_text(json.dumps(chrome_trace(result)))
    return path
