"""Closed-form pre-filter: memory fit, a lower bound on iteration time, and dominance.

Before a point is simulated, three cheap checks can settle it:

1. **Memory fit.** :func:`offsim.plan.footprint.check_fit`, the same check :func:`offsim.simulate`
   makes first, so a point marked infeasible here is infeasible in the simulator, with the same
   reason.
2. **A lower bound on the steady iteration time** (:func:`time_lower_bound`), the largest of:

   * the GPU's serial work: every layer's forward, backward and (with checkpointing under the
     default activation policy) recompute, times the micro-batches, plus the optimizer step when
     it blocks the GPU stream (a GPU step, or a CPU step after backward without the delayed
     parameter update);
   * for each link, the bytes the strategy must move per iteration over the link's peak rate
     (``h2d``, ``d2h``; NVMe reads and writes share the array's time, so their times add;
     host DRAM is touched once per DMA or NVMe byte and by the CPU optimizer's passes);
   * the CPU optimizer: the rank's parameters (less the ``optimizer_gpu_fraction`` the GPU updates)
     over its share of ``optimizer_params_per_s``.

   Bytes counted are the least the placement forces (a streamed layer's parameters cross at
   least once per iteration, gradients leave the GPU once per micro-batch, offloaded activations
   go out and back once per micro-batch under the default activation policy, NVMe-resident
   optimizer state is read and written once per step, less what a DRAM cache can hold);
   latencies, contention, duplex losses and stalls only add time, so the simulated time is never
   below the bound (``tests/test_sweep_prefilter.py`` checks this with Hypothesis).
3. **Dominance.** A point is *clearly dominated* when an already simulated point of the same
   workload costs no more per hour and delivers at least the tokens/s that this point could at
   best reach (tokens per iteration / lower bound). Such a point can be neither faster nor
   cheaper, so it is not simulated; its row keeps the bound and names the dominating point.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from offsim.config.run import RunConfig
from offsim.plan.footprint import StateSizes, state_sizes
from offsim.plan.policy_plan import dram_cache_bytes


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


def _default_activations(cfg: RunConfig) -> bool:
    """True under the default activation policy (the strategy's placement and checkpointing);
    another policy may keep, recompute or offload any layer, so its bytes are not counted."""
    return cfg.strategy.policies.activations.kind == "placement"


def _activation_bytes(cfg: RunConfig, sz: StateSizes) -> float:
    """Bytes of activations one micro-batch offloads (the default policy keeps the last
    ``prefetch_depth + 1`` layers on the GPU for the turn to backward)."""
    st = cfg.strategy
    if st.placement.activations == "gpu" or not _default_activations(cfg):
        return 0.0
    n = len(sz.layers)
    ckpt = cfg.activation_checkpointing
    return sum(
        (lay.act_ckpt_bytes if ckpt and lay.is_block else lay.act_full_bytes)
        for lay in sz.layers
        if n - 1 - lay.index > st.prefetch_depth
    )


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
    act = ga * _activation_bytes(cfg, sz)
    t["d2h"] += act
    t["h2d"] += act
    if pl.activations == "nvme":
        t["nvme_read"] += act
        t["nvme_write"] += act
    return t


def _gpu_serial_s(cfg: RunConfig, sz: StateSizes, cpu_step_s: float) -> float:
    """GPU stream work that cannot overlap: compute of every micro-batch, plus an optimizer step
    that blocks the stream (a GPU step; a CPU step after backward without the delayed update)."""
    st = cfg.strategy
    recompute = cfg.activation_checkpointing and _default_activations(cfg)
    per_micro = sum(
        lay.fwd_s + lay.bwd_s + (lay.fwd_s if recompute and lay.is_block else 0.0) for lay in sz.layers
    )
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
        cpu_step_s = updated / (hw.cpu.optimizer_params_per_s / n)
        terms["cpu_optimizer"] = cpu_step_s
        bpp_param = sz.param_bytes / sz.params_total
        dram_bytes += updated * (2 * sz.optimizer_bytes_per_param + sz.host_grad_bytes_per_param + bpp_param)
    terms["dram"] = dram_bytes / (hw.dram.bandwidth_bytes_per_s / n)
    terms["gpu_serial"] = _gpu_serial_s(cfg, sz, cpu_step_s)
    binding = max(terms, key=lambda k: terms[k])
    return TimeBound(terms[binding], binding, terms, traffic)


@dataclass
class Frontier:
    """Simulated points, per workload, as a cost-sorted staircase of the best tokens/s so far.

    Plain data, so it travels to worker processes with each chunk of points.
    """

    groups: dict[str, tuple[list[float], list[float], list[str]]] = field(default_factory=dict)

    @classmethod
    def from_rows(cls, rows: Iterable[Mapping[str, Any]]) -> Frontier:
        """Build from result rows: feasible simulated rows with a known hourly price."""
        by_group: dict[str, list[tuple[float, float, str]]] = {}
        for r in rows:
            if r.get("status") == "ok" and r.get("usd_per_hour") is not None and r.get("tokens_per_s"):
                by_group.setdefault(r["workload_id"], []).append(
                    (r["usd_per_hour"], r["tokens_per_s"], r["point_id"])
                )
        out = cls()
        for g, items in by_group.items():
            items.sort(key=lambda x: (x[0], -x[1], x[2]))
            costs, best, ids = [], [], []
            for cost, tps, pid in items:  # keep the staircase corners: where the best tokens/s rises
                if not best or tps > best[-1]:
                    costs.append(cost)
                    best.append(tps)
                    ids.append(pid)
            out.groups[g] = (costs, best, ids)
        return out

    def dominated_by(self, group: str, usd_per_hour: float, tokens_per_s_upper: float) -> str | None:
        """The id of a simulated point no dearer and at least as fast as this point can be."""
        if group not in self.groups:
            return None
        costs, best, ids = self.groups[group]
        i = bisect.bisect_right(costs, usd_per_hour) - 1
        if i >= 0 and best[i] >= tokens_per_s_upper:
            return ids[i]
        return None

    def __len__(self) -> int:
        return sum(len(v[0]) for v in self.groups.values())
