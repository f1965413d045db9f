"""Pure functions from a trace to RunMetrics (steady state: warm-up iterations excluded)."""

from __future__ import annotations

from dataclasses import dataclass, field

from pydantic import BaseModel, Field

from offsim.cache_stats import CacheStats
from offsim.config.run import RunConfig
from offsim.plan.model import model_flop_per_iteration
from offsim.trace import Recorder, RecordLog, Repeat, Span, copy_offsets

LINKS = ("h2d", "d2h", "nvme_read", "nvme_write")
EXTRA_LINKS = ("gpu_link", "dram_copy", "pfs_read", "pfs_write")


class Phases(BaseModel):
    """Seconds per iteration the GPU stream spent in each phase (sum = iteration time, except
    that with the delayed parameter update ``optimizer`` is only the exposed part of the step)."""

    forward: float = 0.0
    backward: float = 0.0
    optimizer: float = 0.0


class PeakBytes(BaseModel):
    """Peak bytes per tier: ``gpu`` per GPU; ``host_pinned``, ``host`` (pinned included) and
    ``nvme`` per node."""

    gpu: float = 0.0
    host_pinned: float = 0.0
    host: float = 0.0
    nvme: float = 0.0
    pfs: float = 0.0  # parallel file system (MLP-Offload), whole job


class Traffic(BaseModel):
    """Bytes moved per iteration per GPU on each link."""

    h2d: float = 0.0
    d2h: float = 0.0
    nvme_read: float = 0.0
    nvme_write: float = 0.0
    gpu_link: float = 0.0
    dram_copy: float = 0.0
    pfs_read: float = 0.0
    pfs_write: float = 0.0


class RunMetrics(BaseModel):
    """Headline results of one simulated configuration (the ``--json`` output)."""

    feasible: bool
    infeasible_reason: str | None = None
    infeasible_tier: str | None = None
    iteration_time_s: float | None = None
    tokens_per_s: float | None = None
    tflops_per_gpu: float | None = Field(default=None, description="model FLOPs (no recompute) per second per GPU")
    hardware_tflops_per_gpu: float | None = Field(default=None, description="FLOPs executed, recompute included")
    phases_s: Phases = Phases()
    optimizer_step_s: float | None = None
    cpu_optimizer_busy_s: float | None = Field(default=None, description="CPU optimizer compute per iteration")
    stall_s: float | None = None
    gpu_busy_fraction: float | None = None
    peak_bytes: PeakBytes = PeakBytes()
    traffic_bytes: Traffic = Traffic()
    iteration_times_s: list[float] = []
    cache: dict[str, CacheStats] = Field(default={}, description="per-cache statistics (offsim.cache_stats)")
    activation_policy: str | None = Field(default=None, description="the activation policy as run (e.g. the "
                                          "swap amount auto-swap chose); None: the strategy's placement")


def steady_iterations(cfg: RunConfig, rec: Recorder) -> tuple[list[int], list[float]]:
    """Indices and durations of the iterations the metrics average over.

    An iteration lasts from its start to the next one's (the last ends when all work ends).
    The system's trailing iterations (``cfg.tail_iterations``: with the delayed parameter update
    the last step, which no next iteration overlaps) are left out.
    """
    bounds = [*rec.iteration_starts_s, rec.end_s]
    idx = list(cfg.measured_range)
    return idx, [bounds[k + 1] - bounds[k] for k in idx]


def summarize(cfg: RunConfig, rec: Recorder, peaks: dict[str, float]) -> RunMetrics:
    """Steady-state metrics of a finished run."""
    idx, times = steady_iterations(cfg, rec)
    steady = set(idx)
    n = len(idx)
    it_s = sum(times) / n
    phases = dict.fromkeys(("forward", "backward", "optimizer"), 0.0)
    for it, name, start, end in rec.phases:
        if it in steady:
            phases[name] += (end - start) / n
    sums = _span_sums(rec, steady, n)
    traffic, recomputed, step_bounds = sums.traffic, sums.recomputed, sums.step_bounds
    busy, stall, cpu_busy = sums.busy_s, sums.stall_s, sums.cpu_busy_s
    wl = cfg.workload
    model_flop = model_flop_per_iteration(wl)
    recompute = _recompute_flop(cfg, recomputed)
    step_s = sum(b[1] - b[0] for b in step_bounds.values()) / n if step_bounds else 0.0
    return RunMetrics(
        feasible=True,
        iteration_time_s=it_s,
        tokens_per_s=wl.tokens_per_iteration / it_s,
        tflops_per_gpu=model_flop / it_s / 1e12,
        hardware_tflops_per_gpu=(model_flop + recompute) / it_s / 1e12,
        phases_s=Phases(**phases),
        optimizer_step_s=step_s,
        cpu_optimizer_busy_s=cpu_busy,
        stall_s=stall,
        gpu_busy_fraction=min(1.0, busy / it_s),
        peak_bytes=PeakBytes(**peaks),
        traffic_bytes=Traffic(**traffic),
        iteration_times_s=times,
    )


@dataclass
class _SpanSums:
    """Per-iteration averages over the steady iterations, from the spans."""

    traffic: dict[str, float] = field(default_factory=lambda: dict.fromkeys(LINKS + EXTRA_LINKS, 0.0))
    busy_s: float = 0.0
    stall_s: float = 0.0
    cpu_busy_s: float = 0.0
    recomputed: dict[int, float] = field(default_factory=dict)  # layer -> forward passes repeated
    step_bounds: dict[int, list[float]] = field(default_factory=dict)  # iteration -> optimizer [start, end]


@dataclass
class _Group:
    """The held spans of one iteration that share their copies (one chain of repeats), summed."""

    traffic: dict[str, float] = field(default_factory=dict)
    busy_s: float = 0.0
    stall_s: float = 0.0
    cpu_busy_s: float = 0.0
    recomputed: dict[int, int] = field(default_factory=dict)
    step: list[float] | None = None  # optimizer phase: [least start, most end]

    def add(self, s: Span, links: dict[str, float]) -> None:
        if s.resource in links:
            self.traffic[s.resource] = self.traffic.get(s.resource, 0.0) + s.bytes
        elif s.resource == "gpu":
            self.busy_s += s.end_s - s.start_s
            if s.kind == "recompute":
                self.recomputed[s.layer] = self.recomputed.get(s.layer, 0) + 1
        elif s.resource == "gpu_stall":
            self.stall_s += s.end_s - s.start_s
        elif s.resource == "cpu":
            self.cpu_busy_s += s.end_s - s.start_s
        if s.phase == "optimizer" and s.resource != "gpu_stall":  # the GPU waiting for the step is not the step
            if self.step is None:
                self.step = [s.start_s, s.end_s]
            else:
                self.step[0], self.step[1] = min(self.step[0], s.start_s), max(self.step[1], s.end_s)

    def apply(self, out: _SpanSums, iteration: int, count: int, n: int, shifts_s: tuple[float, float]) -> None:
        """Add ``count`` copies in ``iteration`` (shifted by ``shifts_s``, least and most),
        averaged over ``n`` iterations."""
        w = count / n
        for resource, nbytes in self.traffic.items():
            out.traffic[resource] += nbytes * w
        out.busy_s += self.busy_s * w
        out.stall_s += self.stall_s * w
        out.cpu_busy_s += self.cpu_busy_s * w
        for layer, k in self.recomputed.items():
            out.recomputed[layer] = out.recomputed.get(layer, 0.0) + k * w
        if self.step is not None:
            low, high = self.step[0] + shifts_s[0], self.step[1] + shifts_s[1]
            b = out.step_bounds.setdefault(iteration, [low, high])
            b[0], b[1] = min(b[0], low), max(b[1], high)


def _span_sums(rec: Recorder, steady: set[int], n: int) -> _SpanSums:
    """The sums of :func:`_sum_spans`, kept with the spans until more are recorded
    (:meth:`~offsim.trace.RecordLog.derived`): a run the sweep's memo hands out again
    (:mod:`offsim.engine.reuse`) shares its records with the run that made them, so the sums are
    worked out once for all of its points (issue 16; the caller only reads them)."""
    key = f"metrics._span_sums {sorted(steady)} {n}"
    sums = rec.spans.derived(key, lambda spans: _sum_spans(spans, steady, n))
    assert isinstance(sums, _SpanSums)
    return sums


def _sum_spans(spans: RecordLog[Span], steady: set[int], n: int) -> _SpanSums:
    """Sum the spans of the ``steady`` iterations: the held spans of one iteration that share
    their copies (the steady-state shortcut's :class:`~offsim.trace.Repeat` s,
    :meth:`~offsim.trace.RecordLog.weighted`) are summed once, then counted for every copy."""
    out = _SpanSums()
    groups: dict[tuple[tuple[int, ...], int], _Group] = {}
    chains: dict[tuple[int, ...], tuple[Repeat, ...]] = {}
    for s, chain in spans.weighted():
        key = tuple(id(r) for r in chain)
        chains.setdefault(key, chain)
        group = groups.get((key, s.iteration))
        if group is None:
            group = groups[(key, s.iteration)] = _Group()
        group.add(s, out.traffic)
    offsets = {key: copy_offsets(chain) for key, chain in chains.items()}
    for (key, iteration), group in groups.items():
        for d_iteration, (count, low_s, high_s) in offsets[key].items():
            if iteration + d_iteration in steady:
                group.apply(out, iteration + d_iteration, count, n, (low_s, high_s))
    return out


#: per (workload, GPU) as JSON, each layer's forward FLOPs: a sweep summarises thousands of points
#: of a few workloads (building the layers ~0.2 ms against ~0.01 ms for the key; issue 16)
_FWD_FLOP: dict[tuple[str, str], dict[int, float]] = {}


def _recompute_flop(cfg: RunConfig, recomputed: dict[int, float]) -> float:
    """FLOPs of the forward passes the engine repeated in one iteration: the forward FLOPs of
    each layer times how often its recompute span ran (checkpointing or a per-layer policy)."""
    from offsim.plan.model import build_layers

    if not recomputed:  # nothing repeated: no layers to build (a sweep's every point, issue 16)
        return 0.0
    key = (cfg.workload.model_dump_json(), cfg.hardware.gpu.model_dump_json())
    fwd_flop = _FWD_FLOP.get(key)
    if fwd_flop is None:
        if len(_FWD_FLOP) >= 256:
            _FWD_FLOP.clear()
        fwd_flop = _FWD_FLOP[key] = {lay.index: lay.fwd_flop for lay in build_layers(cfg.workload, cfg.hardware.gpu)}
    return sum(fwd_flop.get(index, 0.0) * count for index, count in recomputed.items())
