"""Chrome / Perfetto trace (``chrome://tracing``, ui.perfetto.dev) of a run.

Layout (Trace Event Format, Google 2016; times in microseconds):

* one process per run, named after the configuration;
* thread 0, *Iterations / phases*: one slice per iteration with the forward, backward and
  optimizer phases of the main (GPU) stream nested inside;
* one thread per resource lane: GPU compute, GPU waiting, PCIe H2D, PCIe D2H, NVMe read, NVMe
  write, CPU optimizer, host copies, GPU-GPU link. A resource that carries several spans at
  once (flows sharing a link, several copy engines) gets extra lanes (``PCIe H2D #2``), so the
  slices on one thread never overlap;
* complete events (``ph: "X"``) named ``<layer> <tensor> (<phase>)``, with iteration, phase,
  kind, layer, bytes and average rate in ``args``;
* counter tracks (``ph: "C"``): GiB resident per memory tier and GB/s on each link.

Spans and memory samples are those simulated (``window=True``): repetitions the steady-state
shortcut skipped are copies of the one before and are left out (``otherData.window`` says how
many), so the trace of a long run is the size of what was simulated. Iterations and phases are
all shown.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from offsim.core import strict_json
from offsim.core._version import __version__
from offsim.report.tracks import (
    LINKS,
    RESOURCE_LABELS,
    RESOURCES,
    TIER_LABELS,
    assign_lanes,
    iteration_windows,
    lane_label,
    link_rate_steps,
    window_note,
)
from offsim.results import RunResult

PID = 1
PHASE_TID = 0


def _us(seconds: float) -> float:
    """Seconds to microseconds, rounded to the nanosecond (keeps the file small)."""
    return round(seconds * 1e6, 3)


def _slice(tid: int, name: str, cat: str, start_s: float, end_s: float,
           args: dict[str, Any]) -> dict[str, Any]:
    ts = _us(start_s)
    return {"ph": "X", "pid": PID, "tid": tid, "name": name, "cat": cat, "ts": ts,
            "dur": max(0.0, round(_us(end_s) - ts, 3)), "args": args}


def _thread(tid: int, name: str) -> list[dict[str, Any]]:
    return [{"ph": "M", "pid": PID, "tid": tid, "name": "thread_name", "args": {"name": name}},
            {"ph": "M", "pid": PID, "tid": tid, "name": "thread_sort_index", "args": {"sort_index": tid}}]


def _phase_events(result: RunResult) -> list[dict[str, Any]]:
    events = _thread(PHASE_TID, "Iterations / phases")
    for k, start, end in iteration_windows(result):
        events.append(_slice(PHASE_TID, f"iteration {k}", "iteration", start, end, {"iteration": k}))
    for k, name, start, end in result.recorder.phases:
        events.append(_slice(PHASE_TID, name, "phase", start, end, {"iteration": k, "phase": name}))
    return events


def _span_events(result: RunResult) -> list[dict[str, Any]]:
    """Metadata for every resource lane, then one slice per span simulated."""
    spans = result.recorder.spans.window()
    lanes = assign_lanes(spans)
    used = sorted({(s.resource, lane) for s, lane in zip(spans, lanes, strict=True)},
                  key=lambda rl: (RESOURCES.index(rl[0]) if rl[0] in RESOURCES else len(RESOURCES), rl))
    tids = {rl: PHASE_TID + 1 + i for i, rl in enumerate(used)}
    events = [e for rl, tid in tids.items() for e in _thread(tid, lane_label(*rl))]
    for s, lane in zip(spans, lanes, strict=True):
        dur = s.end_s - s.start_s
        args: dict[str, Any] = {"iteration": s.iteration, "phase": s.phase, "kind": s.kind, "layer": s.layer}
        if s.bytes:
            args["MB"] = round(s.bytes / 1e6, 6)
            if dur > 0:
                args["GB/s"] = round(s.bytes / dur / 1e9, 6)
        name = f"{s.name} ({s.phase})"
        events.append(_slice(tids[(s.resource, lane)], name, s.kind, s.start_s, s.end_s, args))
    return events


def _counter(name: str, unit: str, points: list[tuple[float, float]]) -> list[dict[str, Any]]:
    """Counter events, one per change (the last value at an instant wins)."""
    last: dict[float, float] = {}
    for t, value in points:
        last[_us(t)] = value
    return [{"ph": "C", "pid": PID, "name": name, "ts": ts, "args": {unit: round(v, 6)}}
            for ts, v in sorted(last.items())]


def _counter_events(result: RunResult) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    for tier, label in TIER_LABELS.items():
        points = [(lv.t_s, lv.bytes / 2**30) for lv in result.recorder.levels.window() if lv.tier == tier]
        if tier == "pfs" and not any(v for _, v in points):
            continue  # no parallel file system in use: no empty counter track
        events += _counter(f"{label}, GiB", "GiB", points)
    for link in LINKS:
        steps = link_rate_steps(result.recorder.spans.window(), link)
        events += _counter(f"{RESOURCE_LABELS[link]}, GB/s", "GB/s", [(t, r / 1e9) for t, r in steps])
    return events


def chrome_trace(result: RunResult) -> dict[str, Any]:
    """The trace as a JSON-serialisable dict (``traceEvents`` plus run metadata)."""
    cfg = result.config
    title = f"offsim: {cfg.workload.name} on {cfg.hardware.name} with {cfg.strategy.name}"
    events: list[dict[str, Any]] = [
        {"ph": "M", "pid": PID, "name": "process_name", "args": {"name": title}},
        {"ph": "M", "pid": PID, "name": "process_sort_index", "args": {"sort_index": PID}},
    ]
    events += _phase_events(result) + _span_events(result) + _counter_events(result)
    other: dict[str, Any] = {"hardware": cfg.hardware.name, "workload": cfg.workload.name,
                             "strategy": cfg.strategy.name, "iterations": cfg.iterations,
                             "warmup_iterations": cfg.warmup_iterations,
                             "iteration_time_s": result.metrics.iteration_time_s,
                             "offsim_version": __version__}
    if note := window_note(result):
        other["window"] = note
    if result.feasible and result.recorder.spans:
        from offsim.report.bottleneck import bottleneck

        other["bottleneck"] = bottleneck(result).sentence
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": other}


def write_chrome_trace(result: RunResult, path: Path) -> Path:
    """Write the trace JSON to ``path`` (strict JSON: a NaN or infinite number is ``null``)."""
    path = Path(path)
    path.write_text(strict_json.dumps(chrome_trace(result), separators=(",", ":")))
    return path
