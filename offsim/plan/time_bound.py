"""A closed-form lower bound on the steady iteration time: a bottleneck model.

:func:`time_lower_bound` is the largest of:

* the GPU's serial work: every layer's forward, backward and recompute (the blocks the
  activation policy checkpoints), times the micro-batches, plus the optimizer step when
  it blocks the GPU stream (a GPU step, or a CPU step after backward without the delayed
  parameter update);
* for each link, the bytes the strategy must move per iteration over the link's peak rate
  (``h2d``, ``d2h``; NVMe reads and writes share the array's time, so their times add;
  host DRAM is touched once per DMA or NVMe byte and by the CPU optimizer's passes);
* the CPU optimizer: the rank's parameters (less the ``optimizer_gpu_fraction`` the GPU updates)
  over its share of ``optimizer_params_per_s``.

Bytes counted are the least the placement forces (a streamed layer's parameters cross at
least once per iteration, gradients leave the GPU once per micro-batch, offloaded activations
go out and back once per micro-batch, as the activation policy places them, NVMe-resident
optimizer state is read and written once per step, less what a DRAM cache can hold);
latencies, contention, duplex losses and stalls only add time, so the simulated time is never
below the bound (``tests/test_sweep_prefilter.py`` checks this with Hypothesis).

The sweep's pre-filter (:mod:`offsim.sweep.prefilter`), ProTrain's knob search
(:mod:`offsim.search.protrain`) and Fuyou's automatic swap amount
(:mod:`offsim.search.swap_amount`) all read it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from offsim.config.run import RunConfig
from offsim.plan.footprint import StateSizes, state_sizes
from offsim.plan.policy_plan import activation_decisions, dram_cache_bytes


@dataclass(frozen=True)
class TimeBound:
    """A lower bound on the steady iteration time.

    Attributes:
        seconds: the bound (the largest term).
        binding: the name of the largest term (``gpu_serial``, ``h2d``, ``d2h``, ``nvme``,
            ``dram``, ``cpu_optimizer``).
        terms_s: every term, seconds.
        traffic_bytes: the least bytes per iteration per link used for the link terms.
    """

    seconds: float
    binding: str
    terms_s: dict[str, float]
    traffic_bytes: dict[str, float]


def _activation_plan(cfg: RunConfig, sz: StateSizes) -> tuple[dict[str, float], float]:
    """Per micro-batch: the activation bytes the policy offloads to each tier (``cpu``,
    ``nvme``), and the GPU seconds of the blocks it recomputes.

    The engine follows the same per-layer decisions (:func:`offsim.plan.policy_plan.activation_decisions`):
    an offloaded layer's kept bytes go out during forward and come back for backward; a
    checkpointed block runs its forward again before its backward."""
    moved = {"cpu": 0.0, "nvme": 0.0}
    recompute_s = 0.0
    for d in activation_decisions(cfg, sz):
        lay = sz.layers[d.layer]
        if d.tier in moved:
            moved[d.tier] += lay.kept_bytes(d.recompute)
        if d.recompute:
            recompute_s += lay.fwd_s
    return moved, recompute_s


def _optimizer_nvme_bytes(cfg: RunConfig, sz: StateSizes) -> tuple[float, float]:
    """Least (read, write) bytes of NVMe-resident optimizer state per step.

    Without a DRAM cache every sub-group is read and written once. A write-back DRAM cache of
    ``C`` bytes can hold at most ``C`` at the start of a step, so at least ``state - C`` is read;
    each of those misses evicts as much once the cache is full, and at most ``C`` of room can be
    free, so at least ``state - 2C`` is written back.
    """
    st = cfg.strategy
    if st.placement.optimizer_states != "nvme" or st.optimizer_device != "cpu":
        return 0.0, 0.0
    state = sz.local_params * sz.optimizer_bytes_per_param / st.grad_compression_ratio
    cache = dram_cache_bytes(cfg, sz)
    return max(0.0, state - cache), max(0.0, state - 2 * cache)


def min_traffic_bytes(cfg: RunConfig, sz: StateSizes) -> dict[str, float]:
    """Least bytes per iteration per rank on each link that the placement forces.

    Gradient compression (LSP-Offload) divides the gradients copied, the parameters the CPU
    updates and the updated parameters sent back by ``grad_compression_ratio``.
    """
    st, pl = cfg.strategy, cfg.strategy.placement
    ga = cfg.workload.training.grad_accumulation
    ratio = st.grad_compression_ratio
    layerwise = st.optimizer_schedule == "layerwise"
    host = 1.0 - st.optimizer_gpu_fraction  # the GPU-updated share's grads and params stay on the GPU
    t = dict.fromkeys(("h2d", "d2h", "nvme_read", "nvme_write"), 0.0)
    bpp_param = sz.param_bytes / sz.params_total
    params_local = sz.param_bytes / sz.param_part * (host if layerwise else 1.0)
    if pl.params in ("cpu", "nvme"):  # streamed: every layer comes to the GPU once per iteration
        t["h2d"] += params_local
        if pl.params == "nvme":
            t["nvme_read"] += params_local
    if st.optimizer_device == "cpu":  # updated 16-bit params go back to their home
        updated = sz.local_params * bpp_param / ratio * host
        if pl.params == "gpu":
            t["h2d"] += updated
        elif pl.params == "nvme":
            t["nvme_write"] += updated
    if pl.grads != "gpu":
        t["d2h"] += ga * sz.grad_bytes / sz.grad_part / ratio * host
        if pl.grads == "nvme" and not layerwise:  # layer-wise updates keep the last gradient in DRAM
            grads = sz.params_total / sz.grad_part * sz.host_grad_bytes_per_param / ratio
            t["nvme_write"] += ga * grads
            t["nvme_read"] += ga * grads  # accumulate reads after the first, plus the optimizer's
    read, write = _optimizer_nvme_bytes(cfg, sz)
    t["nvme_read"] += read
    t["nvme_write"] += write
    moved, _ = _activation_plan(cfg, sz)
    act = ga * (moved["cpu"] + moved["nvme"])
    t["d2h"] += act
    t["h2d"] += act
    t["nvme_read"] += ga * moved["nvme"]
    t["nvme_write"] += ga * moved["nvme"]
    return t


def _streamed_update(cfg: RunConfig, sz: StateSizes) -> tuple[float, float]:
    """Deep Optimizer States (``optimizer_split: perf-model``) may update any sub-group on the
    GPU instead: (the most parameters per second that path adds to the CPU's, its DRAM bytes per
    parameter). Each such parameter crosses H2D (fp32 state and gradient), D2H (the state, and
    the 16-bit parameter when parameters live on the host) and HBM (GPU Adam), each at its peak
    rate. Without the split: (0, inf)."""
    st = cfg.strategy
    if st.optimizer_split != "perf-model":
        return 0.0, math.inf
    hw, link = cfg.hardware, cfg.hardware.host_link
    opt, hg = sz.optimizer_bytes_per_param, sz.host_grad_bytes_per_param
    bpp_param = sz.param_bytes / sz.params_total
    h2d_bpp, d2h_bpp = opt + hg, opt + (bpp_param if st.placement.params != "gpu" else 0.0)
    hbm_bpp = 2 * opt + hg + bpp_param
    rate = min(max(link.h2d.pinned.peak_bytes_per_s, link.h2d.pageable.peak_bytes_per_s) / h2d_bpp,
               max(link.d2h.pinned.peak_bytes_per_s, link.d2h.pageable.peak_bytes_per_s) / d2h_bpp,
               hw.gpu.hbm_bytes_per_s / hbm_bpp)
    return rate, h2d_bpp + d2h_bpp


def _gpu_serial_s(cfg: RunConfig, sz: StateSizes, cpu_step_s: float) -> float:
    """GPU stream work that cannot overlap: compute of every micro-batch, plus an optimizer step
    that blocks the stream (a GPU step; a CPU step after backward without the delayed update)."""
    st = cfg.strategy
    _, recompute_s = _activation_plan(cfg, sz)
    per_micro = sum(lay.fwd_s + lay.bwd_s for lay in sz.layers) + recompute_s
    serial = cfg.workload.training.grad_accumulation * per_micro
    if st.optimizer_device == "gpu":
        bpp = (
            2 * sz.optimizer_bytes_per_param
            + sz.grad_bytes / sz.params_total
            + sz.param_bytes / sz.params_total
        )
        serial += sz.local_params * bpp / cfg.hardware.gpu.hbm_bytes_per_s
    elif not st.delayed_param_update and st.optimizer_schedule == "after-backward":
        serial += cpu_step_s
    return serial


def time_lower_bound(cfg: RunConfig, sz: StateSizes | None = None) -> TimeBound:
    """A lower bound on the simulated steady iteration time of ``cfg`` (module docstring)."""
    sz = sz or state_sizes(cfg)
    hw, st = cfg.hardware, cfg.strategy
    n = sz.ranks_per_node
    traffic = min_traffic_bytes(cfg, sz)
    link = hw.host_link
    terms: dict[str, float] = {
        "h2d": traffic["h2d"] / max(link.h2d.pinned.peak_bytes_per_s, link.h2d.pageable.peak_bytes_per_s),
        "d2h": traffic["d2h"] / max(link.d2h.pinned.peak_bytes_per_s, link.d2h.pageable.peak_bytes_per_s),
    }
    if hw.nvme is not None:
        terms["nvme"] = n * (
            traffic["nvme_read"] / hw.nvme.read_bytes_per_s
            + traffic["nvme_write"] / hw.nvme.write_bytes_per_s
        )
    cpu_step_s = 0.0
    dram_bytes = traffic["h2d"] + traffic["d2h"] + traffic["nvme_read"] + traffic["nvme_write"]
    if st.optimizer_device == "cpu":
        updated = sz.local_params / st.grad_compression_ratio * (1.0 - st.optimizer_gpu_fraction)
        bpp_param = sz.param_bytes / sz.params_total
        cpu_bpp = 2 * sz.optimizer_bytes_per_param + sz.host_grad_bytes_per_param + bpp_param
        gpu_params_per_s, gpu_dram_bpp = _streamed_update(cfg, sz)
        cpu_step_s = updated / (hw.cpu.optimizer_params_per_s / n + gpu_params_per_s)
        terms["cpu_optimizer"] = cpu_step_s
        dram_bytes += updated * min(cpu_bpp, gpu_dram_bpp)
    terms["dram"] = dram_bytes / (hw.dram.bandwidth_bytes_per_s / n)
    terms["gpu_serial"] = _gpu_serial_s(cfg, sz, cpu_step_s)
    binding = max(terms, key=lambda k: terms[k])
    return TimeBound(terms[binding], binding, terms, traffic)
