"""The shared resources of one rank and the transfers over them.

Resources and their capacities per rank: :mod:`offsim.plan.paths` (the one place that defines them).

Every transfer is a generator for ``yield from``; it acquires a copy engine when it is a DMA.

Optimizer-state transfers (kinds ``optimizer_swap_in``/``optimizer_swap_out``) may be striped
over two storage paths at once (MLP-Offload, Maurya et al., SC 2025, arXiv 2509.02480): a share
``strategy.pfs_share`` of each transfer's bytes goes to the parallel file system, the rest to
NVMe, and the transfer ends when both parts have; ``strategy.io_concurrency`` caps how many such
parts one rank keeps in flight on each path. With no share and no cap they are plain NVMe flows.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import simpy

from offsim.config.hardware import TransferCurve
from offsim.config.run import RunConfig
from offsim.engine import execute
from offsim.engine.flows import FlowNetwork
from offsim.plan import paths
from offsim.plan.footprint import StateSizes

_UNCAPPED = 1e30  # bytes/s: a flow limited only by the resources it uses
#: flow kinds that carry optimizer state to and from storage (striped when pfs_share > 0)
OPTIMIZER_IO_KINDS = ("optimizer_swap_in", "optimizer_swap_out")


def resource_capacities(cfg: RunConfig, sz: StateSizes) -> dict[str, float]:
    """Capacity of each resource for one simulated rank (:func:`offsim.plan.paths.resource_capacities`;
    its keys are string enums, equal to the names used here)."""
    return {str(r): c for r, c in paths.resource_capacities(cfg, sz.ranks_per_node, sz.dp).items()}


duplex_rule = execute.duplex_rule  # one definition, with the executor's


class Transfers:
    """Starts flows on the network for each kind of movement, with copy-engine limits."""

    def __init__(self, env: simpy.Environment, net: FlowNetwork, cfg: RunConfig, sz: StateSizes,
                 nvme_write_bytes_per_s: float) -> None:
        self.env = env
        self.net = net
        self.cfg = cfg
        self.sz = sz
        self.copy_engines = simpy.Resource(env, capacity=cfg.hardware.gpu.copy_engines)
        self.nvme_write_bytes_per_s = nvme_write_bytes_per_s
        self.has_switch = "switch_h2d" in net.capacity
        st = cfg.strategy
        # on a machine without a PFS the one remaining path (NVMe) takes every byte
        self.pfs_share = st.pfs_share if cfg.hardware.pfs is not None else 0.0
        cap = st.io_concurrency
        self.io_slots: dict[str, simpy.Resource] = {}
        if cap is not None:
            self.io_slots = {path: simpy.Resource(env, capacity=cap) for path in ("nvme", "pfs")}

    def _dma(self, direction: str, nbytes: float, pinned: bool, meta: dict[str, Any]) -> Generator:
        link = self.cfg.hardware.host_link
        curves = link.h2d if direction == "h2d" else link.d2h
        curve: TransferCurve = curves.pinned if pinned else curves.pageable
        usage = {direction: 1.0, "dram": 1.0}
        if self.has_switch:
            usage[f"switch_{direction}"] = 1.0
        if not pinned:  # staged through a pinned bounce buffer: a host memcpy reads and writes DRAM
            usage["dram"] += 2.0
            usage["memcpy"] = 2.0
        with self.copy_engines.request() as req:
            yield req
            yield self.net.start(nbytes, usage, curve.rate_bytes_per_s(nbytes), {**meta, "resource": direction})

    def h2d(self, nbytes: float, pinned: bool = True, **meta: Any) -> Generator:
        """Host -> GPU copy of ``nbytes``."""
        yield from self._dma("h2d", nbytes, pinned, meta)

    def d2h(self, nbytes: float, pinned: bool = True, **meta: Any) -> Generator:
        """GPU -> host copy of ``nbytes``."""
        yield from self._dma("d2h", nbytes, pinned, meta)

    def gds(self, direction: str, nbytes: float, **meta: Any) -> Generator:
        """GPUDirect Storage: ``nbytes`` between GPU memory and the NVMe array with no host
        bounce buffer (NVIDIA GDS, cuFile). The flow holds the GPU's PCIe direction (``d2h`` for
        a write, ``h2d`` for a read) and the array at once, not host DRAM; its bytes are
        recorded as NVMe and as PCIe traffic."""
        nv = self.cfg.hardware.nvme
        assert nv is not None  # RunConfig refuses nvme placement without an nvme block
        link = self.cfg.hardware.host_link
        pcie = "d2h" if direction == "write" else "h2d"
        curve = (link.d2h if pcie == "d2h" else link.h2d).pinned
        rate = nv.read_bytes_per_s if direction == "read" else self.nvme_write_bytes_per_s
        usage = {"nvme": 1.0 / rate, pcie: 1.0}
        if self.has_switch:
            usage[f"switch_{pcie}"] = 1.0
        cap = min(self._nvme_cap(nbytes, rate), curve.rate_bytes_per_s(nbytes))
        yield self.net.start(nbytes, usage, cap, {**meta, "resource": f"nvme_{direction}", "also_on": (pcie,)})

    def _nvme_cap(self, nbytes: float, array_rate: float) -> float:
        nv = self.cfg.hardware.nvme
        assert nv is not None  # RunConfig refuses nvme placement without an nvme block
        return nbytes / (nv.latency_s + nbytes / array_rate)

    def nvme_read(self, nbytes: float, **meta: Any) -> Generator:
        """NVMe -> host memory read of ``nbytes`` (libaio into pinned buffers); optimizer state
        goes through the storage paths (:meth:`_storage_io`)."""
        if self._multi_path(meta):
            yield from self._storage_io("read", nbytes, meta)
            return
        yield from self._nvme_flow("read", nbytes, meta)

    def nvme_write(self, nbytes: float, **meta: Any) -> Generator:
        """Host memory -> NVMe write of ``nbytes``; optimizer state goes through the storage
        paths (:meth:`_storage_io`)."""
        if self._multi_path(meta):
            yield from self._storage_io("write", nbytes, meta)
            return
        yield from self._nvme_flow("write", nbytes, meta)

    def _nvme_flow(self, direction: str, nbytes: float, meta: dict[str, Any]) -> Generator:
        nv = self.cfg.hardware.nvme
        assert nv is not None  # RunConfig refuses nvme placement without an nvme block
        rate = nv.read_bytes_per_s if direction == "read" else self.nvme_write_bytes_per_s
        usage = {"nvme": 1.0 / rate, "dram": 1.0}
        cap = self._nvme_cap(nbytes, rate)
        yield self.net.start(nbytes, usage, cap, {**meta, "resource": f"nvme_{direction}"})

    def _pfs_flow(self, direction: str, nbytes: float, meta: dict[str, Any]) -> Generator:
        """One PFS transfer: alone it reaches the node's rate (less the request latency); the
        node's ranks share ``pfs_read``/``pfs_write``."""
        pfs = self.cfg.hardware.pfs
        assert pfs is not None  # pfs_share is 0 without a pfs block
        rate = pfs.read_bytes_per_s if direction == "read" else pfs.write_bytes_per_s
        cap = nbytes / (pfs.latency_s + nbytes / rate)
        resource = f"pfs_{direction}"
        yield self.net.start(nbytes, {resource: 1.0, "dram": 1.0}, cap, {**meta, "resource": resource})

    def _multi_path(self, meta: dict[str, Any]) -> bool:
        """True when this transfer is optimizer state and striping or a concurrency cap applies."""
        return (self.pfs_share > 0 or bool(self.io_slots)) and meta.get("kind") in OPTIMIZER_IO_KINDS

    def storage_split(self, nbytes: float) -> dict[str, float]:
        """Bytes of one optimizer-state transfer on each storage path (``nvme``, ``pfs``)."""
        pfs = nbytes * self.pfs_share
        return {"nvme": nbytes - pfs, "pfs": pfs}

    def _storage_io(self, direction: str, nbytes: float, meta: dict[str, Any]) -> Generator:
        """Optimizer state striped over NVMe and the PFS: both parts run at once, each under
        its path's concurrency cap; done when the slower part is."""
        parts = [(path, b) for path, b in self.storage_split(nbytes).items() if b > 0]
        procs = [self.env.process(self._on_path(path, direction, b, meta)) for path, b in parts]
        yield simpy.AllOf(self.env, procs)

    def _on_path(self, path: str, direction: str, nbytes: float, meta: dict[str, Any]) -> Generator:
        flow = self._nvme_flow if path == "nvme" else self._pfs_flow
        slots = self.io_slots.get(path)
        if slots is None:
            yield from flow(direction, nbytes, meta)
            return
        with slots.request() as req:
            yield req
            yield from flow(direction, nbytes, meta)

    def host_copy(self, dram_bytes: float, **meta: Any) -> Generator:
        """A host-side copy or cast that touches ``dram_bytes`` of DRAM (reads plus writes)."""
        yield self.net.start(dram_bytes, {"memcpy": 1.0, "dram": 1.0}, _UNCAPPED, {**meta, "resource": "dram_copy"})

    def cpu_optimizer(self, params: float, dram_bytes_per_param: float, **meta: Any) -> Generator:
        """CPU optimizer over ``params``: bound by the CPU's params/s and by the DRAM it shares."""
        usage = {"cpu": 1.0 / dram_bytes_per_param, "dram": 1.0}
        yield self.net.start(params * dram_bytes_per_param, usage, _UNCAPPED, {**meta, "resource": "cpu"})

    def collective(self, nbytes_full: float, factor: float, **meta: Any) -> Generator:
        """Ring collective over the data-parallel ranks moving ``factor x (dp-1)/dp x nbytes_full``
        each way per rank.

        ``factor`` is 1 for all-gather and reduce-scatter, 2 for all-reduce (Patarasuk & Yuan,
        "Bandwidth optimal all-reduce algorithms", JPDC 2009).
        """
        if self.cfg.strategy.replicated_param_swap:
            return  # per-GPU swapping has no GPU-to-GPU path: each rank's full gradient is summed in host memory
        dp = self.sz.dp
        yield from self._ring(factor * (dp - 1) / dp * nbytes_full, factor * (dp - 1), meta)

    def tensor_parallel_allreduce(self, nbytes_full: float, count: int, **meta: Any) -> Generator:
        """``count`` ring all-reduces of ``nbytes_full`` each over the tensor-parallel group, one
        after the other on the compute stream (Megatron-LM's blocking all-reduces after the
        attention and MLP row-parallel GEMMs, and of their input gradients in backward)."""
        tp = self.cfg.workload.training.tensor_parallel
        if tp > 1 and count > 0:
            yield from self._ring(count * 2.0 * (tp - 1) / tp * nbytes_full, count * 2.0 * (tp - 1), meta)

    def _ring(self, nbytes: float, latency_steps: float, meta: dict[str, Any]) -> Generator:
        """Ring traffic of ``nbytes`` each way per rank over the GPU link, plus ``latency_steps``
        link latencies."""
        rate = self.net.capacity["gpu_link_tx"]
        latency = latency_steps * self.cfg.hardware.topology.gpu_link.latency_us * 1e-6
        cap = nbytes / (latency + nbytes / rate)
        yield self.net.start(nbytes, {"gpu_link_tx": 1.0, "gpu_link_rx": 1.0}, cap, {**meta, "resource": "gpu_link"})
