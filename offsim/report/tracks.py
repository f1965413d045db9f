"""What the views share: resource and tier names, lanes for overlapping spans, iteration windows
and link throughput as a step function.

A resource (``h2d``, ``cpu``, ...) can carry several spans at once: concurrent flows share a
link, and a GPU has several copy engines. A timeline draws each resource as one or more
*lanes* so that spans on one lane never overlap (Chrome's trace format needs this: slices on
one thread must nest).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence

from offsim.metrics import steady_iterations
from offsim.results import RunResult
from offsim.trace import Span

#: Resources in drawing order (top to bottom).
RESOURCES = ("gpu", "gpu_stall", "h2d", "d2h", "nvme_read", "nvme_write", "pfs_read", "pfs_write", "cpu",
             "host", "dram_copy", "gpu_link")
RESOURCE_LABELS = {
    "gpu": "GPU compute", "gpu_stall": "GPU waiting", "h2d": "PCIe H2D", "d2h": "PCIe D2H",
    "nvme_read": "NVMe read", "nvme_write": "NVMe write", "cpu": "CPU optimizer",
    "host": "Host thread (kernel issue, hooks)",
    "dram_copy": "Host copies (DRAM)", "gpu_link": "GPU-GPU link",
    "pfs_read": "Parallel FS read", "pfs_write": "Parallel FS write",
}
#: Resources that move bytes: their throughput is drawn per direction.
LINKS = ("h2d", "d2h", "nvme_read", "nvme_write", "pfs_read", "pfs_write", "gpu_link", "dram_copy")
TIERS = ("gpu", "host_pinned", "host", "nvme", "pfs")
TIER_LABELS = {"gpu": "GPU memory (per GPU)", "host_pinned": "Host pinned (per node)",
               "host": "Host DRAM, pinned included (per node)", "nvme": "NVMe (per node)",
               "pfs": "Parallel file system (job)"}
KIND_LABELS = {
    "forward": "forward", "backward": "backward", "recompute": "recompute", "optimizer": "Adam step",
    "stall": "stall", "param_fetch": "parameter fetches", "act_offload": "activation offloads",
    "act_fetch": "activation fetches", "grad_offload": "gradient offloads",
    "grad_reduce": "gradient reduction", "grad_accumulate": "gradient accumulation",
    "grad_cast": "gradient casts", "param_update": "updated-parameter copies",
    "param_allgather": "parameter all-gathers", "optimizer_swap_in": "optimizer-state reads",
    "optimizer_swap_out": "optimizer-state writes",
}
PHASE_COLORS = {"forward": "rgba(31,119,180,0.10)", "backward": "rgba(255,127,14,0.10)",
                "optimizer": "rgba(44,160,44,0.12)"}

#: Tolerance (seconds) when comparing span boundaries computed on one SimPy clock.
EPS_S = 1e-12


def kind_label(kind: str) -> str:
    """A readable label for a span ``kind``."""
    return KIND_LABELS.get(kind, kind.replace("_", " "))


def assign_lanes(spans: Sequence[Span]) -> list[int]:
    """Lane per span such that spans of one resource on one lane never overlap.

    Greedy interval partitioning (earliest start first, reuse the lane freed earliest), which
    uses the fewest lanes possible. Returns the lane index (0-based) of each span, in input order.
    """
    lanes = [0] * len(spans)
    free: dict[str, list[tuple[float, int]]] = {}  # resource -> heap of (lane end_s, lane)
    count: dict[str, int] = {}
    for i in sorted(range(len(spans)), key=lambda k: (spans[k].start_s, spans[k].end_s)):
        s = spans[i]
        heap = free.setdefault(s.resource, [])
        if heap and heap[0][0] <= s.start_s + EPS_S:
            _, lane = heapq.heappop(heap)
        else:
            lane = count.get(s.resource, 0)
            count[s.resource] = lane + 1
        lanes[i] = lane
        heapq.heappush(heap, (s.end_s, lane))
    return lanes


def lane_label(resource: str, lane: int) -> str:
    """Track name of one lane: ``PCIe H2D``, ``PCIe H2D #2``, ..."""
    base = RESOURCE_LABELS.get(resource, resource)
    return base if lane == 0 else f"{base} #{lane + 1}"


def window_note(result: RunResult) -> str:
    """Empty when every span was simulated; else what a trace or figure of the simulated spans
    (``window=True``) leaves out: the repetitions the steady-state shortcut skipped, whose
    records are copies of the last one simulated (issue 16: a trace of a long run stays the size
    of what was simulated)."""
    held, every = len(result.recorder.spans.window()), len(result.recorder.spans)
    if held == every:
        return ""
    return (f"{held:,} of {every:,} spans shown, those simulated; the other {every - held:,} are copies in the "
            "repetitions the steady-state shortcut skipped (each repeats the one before)")


def iteration_windows(result: RunResult) -> list[tuple[int, float, float]]:
    """``(iteration, start_s, end_s)`` of every iteration: each lasts until the next starts; the
    last ends when all work ends (the convention of :func:`offsim.metrics.steady_iterations`)."""
    rec = result.recorder
    bounds = [*rec.iteration_starts_s, rec.end_s]
    return [(k, bounds[k], bounds[k + 1]) for k in range(len(rec.iteration_starts_s))]


def steady_windows(result: RunResult) -> list[tuple[int, float, float]]:
    """The iterations the metrics average over (warm-up and, with the delayed parameter
    update, the unoverlapped last step left out)."""
    idx, _ = steady_iterations(result.config, result.recorder)
    windows = iteration_windows(result)
    return [windows[k] for k in idx]


def link_rate_steps(spans: Iterable[Span], link: str) -> list[tuple[float, float]]:
    """Throughput on ``link`` as a step function: ``(t_s, bytes_per_s from t_s on)``.

    Each span contributes its average rate (bytes over duration) while it lasts; concurrent
    spans add up. Points at the same instant are merged, so the list is strictly increasing in t.
    """
    changes: list[tuple[float, float]] = []
    for s in spans:
        if s.resource == link and s.end_s > s.start_s and s.bytes > 0:
            rate = s.bytes / (s.end_s - s.start_s)
            changes += [(s.start_s, rate), (s.end_s, -rate)]
    steps: list[tuple[float, float]] = []
    level = 0.0
    for t, delta in sorted(changes):
        level += delta
        value = level if level > 1.0 else 0.0  # float residue (B/s) once every span has ended
        if steps and abs(steps[-1][0] - t) <= EPS_S:
            steps[-1] = (steps[-1][0], value)
        else:
            steps.append((t, value))
    return steps
