"""Data paths: turn "move n bytes from here to there" into a :class:`~offsim.schedule.ops.Flow`.

The only code that knows transfer curves, pinned vs pageable copies, PCIe switches, NVMe and PFS
rates, ring collectives and the CPU optimizer's cost per byte. Each function returns the flow's
resource usage (per byte/s of its rate), its own cap (the single-transfer rate of its size, which
carries the per-transfer latency) and the traffic columns its bytes count on. The engine shares
resources max-min fair among running flows (:mod:`offsim.engine.flows`).

Resources and capacities per simulated rank (node-shared ones divided among the node's ranks,
which run the same schedule):

=============  =========================================================  ==================
resource       capacity                                                    used by
=============  =========================================================  ==================
h2d / d2h      the GPU's own PCIe (or C2C) rate per direction              host<->GPU copies
switch_h2d/d2h uplink rate / GPUs behind the switch                        host<->GPU copies
dram           DRAM bandwidth / ranks per node                             DMA, copies, CPU Adam
memcpy         host copy bandwidth / ranks per node                        pageable staging, casts
cpu            CPU Adam params/s of one rank (:func:`cpu_adam_rank_rate`)      CPU Adam
nvme           1 / ranks per node (share of the array's time)              NVMe reads and writes
pfs_read/write PFS node rate per direction / ranks per node                optimizer state striped
gpu_link_tx/rx GPU-GPU link per direction                                  all-gather, reduce-scatter
=============  =========================================================  ==================
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

from offsim.config.run import RunConfig
from offsim.config.workload import DTYPE_BYTES
from offsim.core.enums import Link, Res
from offsim.plan import cpu_adam
from offsim.plan.cpu_adam import DEFAULT_LP_COPY, LpCopy, RateOrigin
from offsim.schedule.ops import Flow

UNCAPPED_BYTES_PER_S = 1e30  # a flow limited only by the resources it uses


def resource_capacities(cfg: RunConfig, ranks_per_node: int, dp: int) -> dict[Res, float]:
    """Capacity of each resource for one simulated rank (see the module table)."""
    hw = cfg.hardware
    n = ranks_per_node
    link = hw.host_link
    cap = {
        Res.H2D: link.h2d.pinned.peak_bytes_per_s,
        Res.D2H: link.d2h.pinned.peak_bytes_per_s,
        Res.DRAM: hw.dram.bandwidth_bytes_per_s / n,
        Res.MEMCPY: hw.cpu.memcpy_bytes_per_s / n,
        Res.CPU: cpu_adam_rank_rate(cfg, n),
    }
    if hw.nvme is not None:
        cap[Res.NVME] = 1.0 / n
    if hw.pfs is not None:
        cap[Res.PFS_READ] = hw.pfs.read_bytes_per_s / n
        cap[Res.PFS_WRITE] = hw.pfs.write_bytes_per_s / n
    topo = hw.topology
    sharers = min(topo.gpus_per_pcie_switch, n)
    if topo.switch_uplink_gb_per_s is not None and sharers > 1:
        cap[Res.SWITCH_H2D] = cap[Res.SWITCH_D2H] = topo.switch_uplink_gb_per_s * 1e9 / sharers
    if dp > 1 or cfg.workload.training.tensor_parallel > 1:
        cap[Res.GPU_LINK_TX] = cap[Res.GPU_LINK_RX] = gpu_link_bytes_per_s(cfg)
    return cap


def cpu_adam_rank_rate(cfg: RunConfig, ranks_per_node: int) -> float:
    """CPU Adam params/s of one rank while all ``ranks_per_node`` ranks step together.

    A measured profile figure (``cpu.optimizer_rate_origin`` measured) is the node's total,
    divided evenly among its ranks. Otherwise :func:`offsim.plan.cpu_adam.rank_adam_params_per_s`:
    threads = the strategy's ``cpu_adam_threads_per_rank`` (None: the rank's share of the cores),
    DRAM = its socket's share, 28 B per fp32 element.
    """
    hw = cfg.hardware
    if hw.cpu.optimizer_rate_origin is RateOrigin.MEASURED:
        return hw.cpu.optimizer_params_per_s / ranks_per_node
    host = hw.cpu.adam_host(hw.dram.bandwidth_bytes_per_s)
    return cpu_adam.rank_adam_params_per_s(host, ranks_per_node, cfg.strategy.cpu_adam_threads_per_rank)


def gpu_link_bytes_per_s(cfg: RunConfig) -> float:
    """Per-direction rate of the ring used by collectives: without a GPU-GPU link the ring goes
    through host memory at the slower PCIe direction; a ring spanning nodes runs at the slower of
    the node link and the network."""
    hw = cfg.hardware
    topo = hw.topology
    if topo.gpu_link.kind == "none":
        rate = min(hw.host_link.h2d.pinned.peak_bytes_per_s, hw.host_link.d2h.pinned.peak_bytes_per_s)
    else:
        rate = topo.gpu_link.bandwidth_gb_per_s * 1e9
    if cfg.workload.training.data_parallel > topo.gpus_per_node and topo.inter_node_gb_per_s:
        rate = min(rate, topo.inter_node_gb_per_s * 1e9)
    return rate


@dataclass(frozen=True)
class Paths:
    """Flow builders for one run configuration.

    Attributes:
        cfg: the run configuration (hardware rates).
        capacity: resource capacities per rank (:func:`resource_capacities`).
        nvme_write: the array's sustained write rate at this run's write volume (bytes/s), or a
            function giving it, called once, on the first NVMe write flow built: a run that writes
            nothing to NVMe then reads none of the drives' fields (the sweep's composition memo
            keys a composition by the fields it reads, issue 16).
    """

    cfg: RunConfig
    capacity: dict[Res, float]
    nvme_write: float | Callable[[], float]

    @cached_property
    def nvme_write_bytes_per_s(self) -> float:
        """The array's sustained write rate (bytes/s), worked out on first use."""
        return self.nvme_write() if callable(self.nvme_write) else self.nvme_write

    @property
    def _has_switch(self) -> bool:
        return Res.SWITCH_H2D in self.capacity

    def dma(self, h2d: bool, nbytes: int, pinned: bool = True) -> Flow:
        """Host <-> GPU copy: the PCIe direction, DRAM, the switch uplink when there is one; a
        pageable copy is staged through a pinned bounce buffer (a host memcpy reads and writes
        DRAM twice more)."""
        link = self.cfg.hardware.host_link
        curves = link.h2d if h2d else link.d2h
        curve = curves.pinned if pinned else curves.pageable
        direction, switch = (Res.H2D, Res.SWITCH_H2D) if h2d else (Res.D2H, Res.SWITCH_D2H)
        usage = {direction: 1.0, Res.DRAM: 1.0}
        if self._has_switch:
            usage[switch] = 1.0
        if not pinned:
            usage[Res.DRAM] += 2.0
            usage[Res.MEMCPY] = 2.0
        return Flow(nbytes, tuple(usage.items()), curve.rate_bytes_per_s(nbytes),
                    (Link.H2D if h2d else Link.D2H,), copy_engine=True)

    def _nvme_rate(self, read: bool) -> float:
        nv = self.cfg.hardware.nvme
        assert nv is not None  # RunConfig refuses nvme placement without an nvme block
        return nv.read_bytes_per_s if read else self.nvme_write_bytes_per_s

    def _nvme_cap(self, nbytes: int, rate: float) -> float:
        nv = self.cfg.hardware.nvme
        assert nv is not None
        return nbytes / (nv.latency_s + nbytes / rate)

    def nvme(self, read: bool, nbytes: int) -> Flow:
        """NVMe <-> host memory (libaio into pinned buffers): the array's time and DRAM."""
        rate = self._nvme_rate(read)
        usage = ((Res.NVME, 1.0 / rate), (Res.DRAM, 1.0))
        return Flow(nbytes, usage, self._nvme_cap(nbytes, rate), (Link.NVME_READ if read else Link.NVME_WRITE,))

    def gds(self, read: bool, nbytes: int) -> Flow:
        """GPUDirect Storage: GPU <-> NVMe with no host bounce buffer (NVIDIA cuFile): the GPU's
        PCIe direction and the array at once, no DRAM; counted as NVMe and PCIe traffic."""
        rate = self._nvme_rate(read)
        link = self.cfg.hardware.host_link
        pcie, switch, curve = ((Res.H2D, Res.SWITCH_H2D, link.h2d.pinned) if read
                               else (Res.D2H, Res.SWITCH_D2H, link.d2h.pinned))
        usage = {Res.NVME: 1.0 / rate, pcie: 1.0}
        if self._has_switch:
            usage[switch] = 1.0
        cap = min(self._nvme_cap(nbytes, rate), curve.rate_bytes_per_s(nbytes))
        links = (Link.NVME_READ, Link.H2D) if read else (Link.NVME_WRITE, Link.D2H)
        return Flow(nbytes, tuple(usage.items()), cap, links)

    def pfs(self, read: bool, nbytes: int) -> Flow:
        """One parallel-file-system transfer: alone it reaches the node's rate less the request
        latency; the node's ranks share the direction's rate."""
        pfs = self.cfg.hardware.pfs
        assert pfs is not None
        rate = pfs.read_bytes_per_s if read else pfs.write_bytes_per_s
        cap = nbytes / (pfs.latency_s + nbytes / rate)
        res, link = (Res.PFS_READ, Link.PFS_READ) if read else (Res.PFS_WRITE, Link.PFS_WRITE)
        return Flow(nbytes, ((res, 1.0), (Res.DRAM, 1.0)), cap, (link,))

    def host_copy(self, dram_bytes: int) -> Flow:
        """A host-side copy or cast that touches ``dram_bytes`` of DRAM (reads plus writes)."""
        return Flow(dram_bytes, ((Res.MEMCPY, 1.0), (Res.DRAM, 1.0)), UNCAPPED_BYTES_PER_S, (Link.DRAM_COPY,))

    def cpu_optimizer(self, dram_bytes: int, dram_bytes_per_param: float) -> Flow:
        """CPU Adam touching ``dram_bytes``: bound by the rank's CPU Adam rate (params/s, from
        :func:`cpu_adam_rank_rate`: SIMD build, threads, the socket's DRAM share) and by DRAM,
        which it shares with the copies running beside it."""
        usage = ((Res.CPU, 1.0 / dram_bytes_per_param), (Res.DRAM, 1.0))
        return Flow(dram_bytes, usage, UNCAPPED_BYTES_PER_S, (Link.CPU,))

    def cpu_step_passes(self, params: float, lp_copy: LpCopy = DEFAULT_LP_COPY) -> tuple[Flow, ...]:
        """The host passes a ZeRO offload step runs over ``params`` parameters besides Adam
        (:func:`offsim.plan.cpu_adam.step_passes`: unscale of the fp32 gradient, then, unless the
        step and copy are fused, the cast of the master into the fp16/bf16 upload buffer), in
        order. Each is a PyTorch CPU op (``mul_``, ``copy_``) that ATen splits over the intra-op
        threads (``at::parallel_for``), so it streams at the rank's DRAM share, which it shares
        with the transfers running beside it; it is not a single-thread memcpy. Its bytes count as
        host copies (``dram_copy``), not as CPU Adam's busy time."""
        pr = self.cfg.workload.precision
        passes = cpu_adam.step_passes(lp_copy, DTYPE_BYTES[pr.optimizer_grads], DTYPE_BYTES[pr.master_params],
                                      DTYPE_BYTES[pr.params])
        return tuple(Flow(round(params * p.dram_bytes_per_param), ((Res.DRAM, 1.0),), UNCAPPED_BYTES_PER_S,
                          (Link.DRAM_COPY,)) for p in passes)

    def ring(self, nbytes: int, latency_steps: float) -> Flow:
        """Ring traffic of ``nbytes`` each way per rank over the GPU link, plus ``latency_steps``
        link latencies (Patarasuk & Yuan, JPDC 2009)."""
        rate = self.capacity[Res.GPU_LINK_TX]
        latency_s = latency_steps * self.cfg.hardware.topology.gpu_link.latency_us * 1e-6
        cap = nbytes / (latency_s + nbytes / rate)
        return Flow(nbytes, ((Res.GPU_LINK_TX, 1.0), (Res.GPU_LINK_RX, 1.0)), cap, (Link.GPU_LINK,))
