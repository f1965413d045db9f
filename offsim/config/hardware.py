"""Hardware profiles: GPU, host link (PCIe or NVLink-C2C), CPU, DRAM, NVMe and topology.

Data files name their units (``memory_gib``, ``bandwidth_gb_per_s``, ``latency_us``); the
properties ending in ``_bytes``, ``_bytes_per_s``, ``_s`` and ``_flops`` are the single place
where they are converted into SI, and the rest of offsim uses only those.

Size-dependent transfer rates follow the latency-bandwidth model used by nvbandwidth-style
calibrations (../shared/reference/calibration_practice.md): a transfer of ``n`` bytes alone on
a link takes ``latency + n / bandwidth``; measured ``points`` (size, achieved GB/s), when given,
replace that model by log-linear interpolation.
"""

from __future__ import annotations

import bisect
import math
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, ValidationError, model_validator

from offsim.config.assumed import AssumedRange, check_assumed
from offsim.config.base import Frozen, Provenance
from offsim.plan.cpu_adam import CpuHost, CpuSimd, RateOrigin, node_adam_params_per_s
from offsim.units import GB, TFLOPS, US, GiB

DType = Literal["fp32", "tf32", "fp16", "bf16", "fp8"]
#: An ``[x, y]`` pair in a data file (YAML has no tuples).
Point = Annotated[list[float], Field(min_length=2, max_length=2)]


def _loglinear(points: list[Point], x: float) -> float:
    """Interpolate ``y`` at ``x`` in points sorted by ``x``, linear in ``log(x)``, clamped."""
    xs = [p[0] for p in points]
    if x <= xs[0]:
        return points[0][1]
    if x >= xs[-1]:
        return points[-1][1]
    i = bisect.bisect_right(xs, x)
    (x0, y0), (x1, y1) = points[i - 1], points[i]
    w = (math.log(x) - math.log(x0)) / (math.log(x1) - math.log(x0))
    return y0 + w * (y1 - y0)


def _check_sorted_positive(points: list[Point], what: str) -> None:
    xs = [p[0] for p in points]
    if any(x <= 0 for x in xs) or any(p[1] <= 0 for p in points):
        raise ValueError(f"{what}: sizes and values must be > 0")
    if xs != sorted(xs) or len(set(xs)) != len(xs):
        raise ValueError(f"{what}: sizes must be strictly increasing")


class TransferCurve(Frozen):
    """Achieved rate of one copy direction for one kind of host memory.

    Attributes:
        bandwidth_gb_per_s: asymptotic rate of a large transfer alone on the link (GB/s, 1e9).
        latency_us: fixed cost per transfer (driver call, DMA set-up), microseconds.
        points: optional measured ``[size_bytes, achieved_gb_per_s]`` pairs; when present they
            give the single-transfer rate by size instead of the latency-bandwidth model.
    """

    bandwidth_gb_per_s: float = Field(gt=0)
    latency_us: float = Field(default=10.0, ge=0)
    points: list[Point] | None = None

    @model_validator(mode="after")
    def _check_points(self) -> TransferCurve:
        if self.points is not None:
            if len(self.points) < 2:
                raise ValueError("points: give at least two [size_bytes, gb_per_s] pairs")
            _check_sorted_positive(self.points, "points")
        return self

    @property
    def peak_bytes_per_s(self) -> float:
        """Largest rate a single flow reaches on this curve, bytes/s."""
        if self.points is None:
            return self.bandwidth_gb_per_s * GB
        return max(self.bandwidth_gb_per_s, max(p[1] for p in self.points)) * GB

    @property
    def latency_s(self) -> float:
        """Per-transfer latency, seconds."""
        return self.latency_us * US

    def rate_bytes_per_s(self, size_bytes: float) -> float:
        """Effective rate of one transfer of ``size_bytes`` alone on the link, bytes/s.

        Latency-bandwidth model: ``n / (latency + n / bandwidth)``; or the measured points.
        """
        if size_bytes <= 0:
            return self.peak_bytes_per_s
        if self.points is not None:
            return _loglinear(self.points, size_bytes) * GB
        bw = self.bandwidth_gb_per_s * GB
        return size_bytes / (self.latency_s + size_bytes / bw)


class CopyDirection(Frozen):
    """One PCIe direction (H2D or D2H): pinned and pageable host memory."""

    pinned: TransferCurve
    pageable: TransferCurve

    @model_validator(mode="after")
    def _pageable_not_faster(self) -> CopyDirection:
        if self.pageable.bandwidth_gb_per_s > self.pinned.bandwidth_gb_per_s:
            raise ValueError("pageable.bandwidth_gb_per_s must not exceed pinned.bandwidth_gb_per_s")
        return self


class HostLink(Frozen):
    """The GPU's link to host memory, one curve set per direction.

    H2D and D2H are separate full-duplex channels: each reaches its own rate while the other
    runs (PCIe is full duplex; measured losses under bidirectional load are in
    ../shared/reference/hardware_facts.md §2.4, set ``duplex_efficiency`` to model them).
    """

    kind: Literal["pcie", "nvlink-c2c"] = "pcie"
    generation: int | None = Field(default=None, ge=1, le=7)
    lanes: int | None = Field(default=None, ge=1, le=32)
    h2d: CopyDirection
    d2h: CopyDirection
    duplex_efficiency: float = Field(
        default=1.0, gt=0, le=1.0,
        description="fraction of each direction's rate kept while the other direction is busy",
    )


class GPU(Frozen):
    """One GPU.

    Attributes:
        memory_gib: usable device memory (deviceQuery total), GiB.
        reserved_gib: memory taken before training state (CUDA context, allocator slack,
            framework workspace), GiB.
        hbm_bandwidth_gb_per_s: device memory bandwidth, GB/s.
        peak_tflops: dense peak per dtype (no sparsity), TFLOP/s.
        gemm_efficiency: ``[gflop_per_gemm, fraction_of_peak]`` pairs: achieved fraction of
            peak for one GEMM of that many GFLOP (log-linear between points, clamped).
        copy_engines: CUDA ``asyncEngineCount``: DMA transfers that can run at once.
    """

    model: str
    memory_gib: float = Field(gt=0)
    reserved_gib: float = Field(default=1.0, ge=0)
    hbm_bandwidth_gb_per_s: float = Field(gt=0)
    peak_tflops: dict[DType, float]
    gemm_efficiency: list[Point]
    copy_engines: int = Field(ge=1, le=16)
    power_w: float | None = Field(default=None, gt=0)
    price_usd: float | None = Field(default=None, ge=0)

    @model_validator(mode="after")
    def _check(self) -> GPU:
        if not self.peak_tflops:
            raise ValueError("peak_tflops: give at least one dtype")
        if any(v <= 0 for v in self.peak_tflops.values()):
            raise ValueError("peak_tflops: values must be > 0")
        _check_sorted_positive(self.gemm_efficiency, "gemm_efficiency")
        if any(e > 1.2 for _, e in self.gemm_efficiency):
            raise ValueError("gemm_efficiency: a fraction of peak above 1.2 is not physical")
        if self.reserved_gib >= self.memory_gib:
            raise ValueError("reserved_gib must be below memory_gib")
        return self

    @property
    def memory_bytes(self) -> float:
        """Usable device memory, bytes."""
        return self.memory_gib * GiB

    @property
    def reserved_bytes(self) -> float:
        """Memory taken before any training state, bytes."""
        return self.reserved_gib * GiB

    @property
    def hbm_bytes_per_s(self) -> float:
        """Device memory bandwidth, bytes/s."""
        return self.hbm_bandwidth_gb_per_s * GB

    def peak_flops(self, dtype: str) -> float:
        """Dense peak for ``dtype`` in FLOP/s; bf16 and fp16 stand in for each other."""
        table = self.peak_tflops
        for name in (dtype, {"bf16": "fp16", "fp16": "bf16"}.get(dtype, dtype), "fp32"):
            if name in table:
                return table[name] * TFLOPS  # type: ignore[index]
        raise KeyError(dtype)

    def gemm_fraction(self, flop: float) -> float:
        """Achieved fraction of peak for one GEMM of ``flop`` FLOP."""
        return _loglinear(self.gemm_efficiency, flop / 1e9)


#: one thread's first touch of fresh 4 KiB host pages, GB/s: 1 GiB in 0.3266 s (rapidsai/dask-cuda
#: PR #98, the "alloc" figure of its device_to_host split)
DASK_CUDA_98_PAGE_TOUCH_GB_PER_S = 2**30 / 0.3266 / GB


class CPU(Frozen):
    """Host CPUs of one node.

    Attributes:
        sockets / cores: CPU sockets and physical cores of the node (all sockets).
        simd: the widest vector extension the CPU reports (cpuinfo flags); it lets the CPU Adam
            rate be derived (:mod:`offsim.plan.cpu_adam`).
        clock_ghz: sustained all-core clock, GHz, for the compute bound (None: not known, the
            bound is left out; it binds only with few threads per rank).
        optimizer_params_per_s: the node's CPU Adam rate over fp32 state, all ranks together,
            params/s. A measured figure when the file gives one (``optimizer_rate_origin``
            ``measured``: an override, divided evenly among the node's ranks); otherwise derived
            from ``simd``, ``clock_ghz``, ``cores``, ``sockets`` and the DRAM bandwidth when the
            profile loads (``derived``; per-rank rates then come from the same model).
        optimizer_impl: the optimizer implementation a measured rate was taken with.
        memcpy_gb_per_s: bandwidth of the host copies offsim charges (pageable staging,
            fp32->fp16 casts), GB/s.
        page_touch_gb_per_s: first touch of fresh anonymous host pages by one thread (fault,
            kernel zeroing, page-table entry), GB/s, as a copy into a new pageable temporary
            pays it (:mod:`offsim.plan.host_pages`). Default: 1 GiB in 0.3266 s, 3.29 GB/s, with
            4 KiB pages (rapidsai/dask-cuda PR #98, a new 1 GiB ``numpy.empty`` touched once per
            page on a GV100 workstation); with transparent huge pages ``always`` host memory is
            allocated at about 5 GB/s (dask-cuda issue #106, a DGX-1). Which one a host runs is
            its kernel's THP setting.
    """

    model: str
    sockets: int = Field(default=1, ge=1)
    cores: int = Field(ge=1)
    simd: CpuSimd | None = Field(default=None, strict=False)
    clock_ghz: float | None = Field(default=None, gt=0)
    optimizer_params_per_s: float = Field(
        gt=0, description="measured CPU Adam params/s of the node; omit it and give simd to derive it")
    optimizer_rate_origin: RateOrigin = Field(default=RateOrigin.MEASURED, strict=False)
    optimizer_impl: str = "deepspeed-cpu-adam"
    memcpy_gb_per_s: float = Field(gt=0)
    page_touch_gb_per_s: float = Field(default=DASK_CUDA_98_PAGE_TOUCH_GB_PER_S, gt=0)
    power_w: float | None = Field(default=None, gt=0)
    price_usd: float | None = Field(default=None, ge=0)

    @model_validator(mode="after")
    def _check_derivable(self) -> CPU:
        if self.optimizer_rate_origin is RateOrigin.DERIVED and self.simd is None:
            raise ValueError("a derived optimizer_params_per_s needs simd")
        return self

    @property
    def memcpy_bytes_per_s(self) -> float:
        """Host memcpy bandwidth, bytes/s."""
        return self.memcpy_gb_per_s * GB

    @property
    def page_touch_bytes_per_s(self) -> float:
        """First touch of fresh host pages by one thread, bytes/s."""
        return self.page_touch_gb_per_s * GB

    def adam_host(self, dram_bytes_per_s: float) -> CpuHost:
        """This CPU as :mod:`offsim.plan.cpu_adam` sees it, with the node's DRAM bandwidth (B/s)."""
        if self.simd is None:
            raise ValueError(f"cpu {self.model!r}: simd is needed to derive CPU Adam's rate")
        clock_hz = None if self.clock_ghz is None else self.clock_ghz * 1e9
        return CpuHost(self.cores, self.sockets, clock_hz, self.simd, dram_bytes_per_s)


class _AdamInputs(Frozen):
    """The fields a derived CPU Adam rate reads, checked before the rest of the profile."""

    model_config = ConfigDict(frozen=True, strict=True, extra="ignore", allow_inf_nan=False)

    sockets: int = Field(default=1, ge=1)
    cores: int = Field(ge=1)
    simd: CpuSimd = Field(strict=False)
    clock_ghz: float | None = Field(default=None, gt=0)


def _derive_cpu_adam_rate(data: Any) -> Any:
    """Fill ``cpu.optimizer_params_per_s`` of a raw profile from the CPU Adam model when the file
    gives no measured figure (or the figure is marked derived, so edits to cores or DRAM re-derive
    it); anything malformed is left for normal validation to report."""
    if not isinstance(data, dict):
        return data
    cpu, dram = data.get("cpu"), data.get("dram")
    if isinstance(cpu, CPU):
        cpu = cpu.model_dump()
    if isinstance(dram, DRAM):
        dram = dram.model_dump()
    if not isinstance(cpu, dict) or not isinstance(dram, dict):
        return data
    origin = cpu.get("optimizer_rate_origin", RateOrigin.MEASURED)
    if "optimizer_params_per_s" in cpu and str(origin) != RateOrigin.DERIVED:
        return data
    # An input of the model that is present but malformed is reported by its own field's check;
    # the rate then gets a placeholder so that the report names that field alone (validation
    # fails regardless). An input that is missing (no simd) leaves the rate missing: that error
    # is the one to report.
    placeholder = {**data, "cpu": {"optimizer_params_per_s": 1.0, **cpu}}
    try:
        spec = _AdamInputs.model_validate(cpu)
    except ValidationError as exc:
        return data if all(e["type"] == "missing" for e in exc.errors()) else placeholder
    try:
        dram_bytes_per_s = float(dram["bandwidth_gb_per_s"]) * GB
    except (KeyError, TypeError, ValueError):
        return placeholder
    if not (math.isfinite(dram_bytes_per_s) and dram_bytes_per_s > 0):
        return placeholder
    clock_hz = None if spec.clock_ghz is None else spec.clock_ghz * 1e9
    host = CpuHost(spec.cores, spec.sockets, clock_hz, spec.simd, dram_bytes_per_s)
    rate = node_adam_params_per_s(host)
    return {**data, "cpu": {**cpu, "optimizer_params_per_s": rate, "optimizer_rate_origin": RateOrigin.DERIVED}}


class DRAM(Frozen):
    """Host memory of one node.

    Attributes:
        capacity_gib: installed DRAM, GiB.
        usable_fraction: share of it training may take (the OS and page cache keep the rest).
        bandwidth_gb_per_s: achievable bandwidth (STREAM-like), shared by DMA, the CPU
            optimizer and host copies, GB/s.
        max_pinned_gib: cap on page-locked memory (None: all usable memory may be pinned).
    """

    capacity_gib: float = Field(gt=0)
    usable_fraction: float = Field(default=0.9, gt=0, le=1)
    bandwidth_gb_per_s: float = Field(gt=0)
    max_pinned_gib: float | None = Field(default=None, gt=0)
    price_usd_per_gib: float | None = Field(default=None, ge=0)
    power_w: float | None = Field(default=None, gt=0)

    @property
    def usable_bytes(self) -> float:
        """Bytes of host memory training may use."""
        return self.capacity_gib * GiB * self.usable_fraction

    @property
    def pinned_cap_bytes(self) -> float:
        """Bytes that may be page-locked."""
        cap = self.usable_bytes
        if self.max_pinned_gib is not None:
            cap = min(cap, self.max_pinned_gib * GiB)
        return cap

    @property
    def bandwidth_bytes_per_s(self) -> float:
        """Achievable DRAM bandwidth, bytes/s."""
        return self.bandwidth_gb_per_s * GB


class NVMe(Frozen):
    """NVMe drives of one node, striped as RAID-0 (DeepNVMe/libaio over one array).

    Attributes:
        drives: number of drives in the RAID-0 array.
        read_gb_per_s / write_gb_per_s: sequential rate of one drive with large O_DIRECT
            requests at high queue depth, GB/s.
        post_cache_write_gb_per_s: one drive's write rate once its SLC/DRAM cache is full
            (None: writes never slow down).
        write_cache_gb: bytes one drive absorbs at full rate after an idle period, GB.
        latency_us: per-request latency, microseconds.
        capacity_tb: one drive's capacity, TB (1e12).
        raid_efficiency: fraction of ``drives x per-drive`` rate the array reaches.
    """

    model: str
    drives: int = Field(ge=1)
    read_gb_per_s: float = Field(gt=0)
    write_gb_per_s: float = Field(gt=0)
    post_cache_write_gb_per_s: float | None = Field(default=None, gt=0)
    write_cache_gb: float | None = Field(default=None, gt=0)
    latency_us: float = Field(default=80.0, ge=0)
    capacity_tb: float = Field(gt=0)
    raid_efficiency: float = Field(default=1.0, gt=0, le=1)
    price_usd: float | None = Field(default=None, ge=0)
    power_w: float | None = Field(default=None, gt=0)

    @property
    def read_bytes_per_s(self) -> float:
        """Array read bandwidth, bytes/s."""
        return self.drives * self.read_gb_per_s * GB * self.raid_efficiency

    @property
    def write_bytes_per_s(self) -> float:
        """Array write bandwidth while the drives' write caches absorb it, bytes/s."""
        return self.drives * self.write_gb_per_s * GB * self.raid_efficiency

    @property
    def capacity_bytes(self) -> float:
        """Array capacity, bytes."""
        return self.drives * self.capacity_tb * 1e12

    @property
    def latency_s(self) -> float:
        """Per-request latency, seconds."""
        return self.latency_us * US

    def sustained_write_bytes_per_s(self, bytes_per_burst: float) -> float:
        """Array write rate for a burst of ``bytes_per_burst`` written after an idle period.

        The first ``write_cache_gb`` per drive go at ``write_gb_per_s``, the rest at
        ``post_cache_write_gb_per_s`` (TechPowerUp-style sustained-write curves,
        ../shared/reference/hardware_facts.md §4.2); the result is the burst's average rate.
        """
        if self.post_cache_write_gb_per_s is None or self.write_cache_gb is None:
            return self.write_bytes_per_s
        per_drive = bytes_per_burst / self.drives
        cache = self.write_cache_gb * GB
        if per_drive <= cache:
            return self.write_bytes_per_s
        fast_s = cache / (self.write_gb_per_s * GB)
        slow_s = (per_drive - cache) / (self.post_cache_write_gb_per_s * GB)
        return self.drives * self.raid_efficiency * per_drive / (fast_s + slow_s)


class PFS(Frozen):
    """A shared parallel file system (Lustre, VAST, GPFS) reached over the node's network.

    Rates are what one node's client reaches, shared by the node's ranks; reads and writes run
    on separate directions of the network path (full duplex), each at its own rate.

    Attributes:
        model: the file system and mount, e.g. ``Lustre Grand (/lus/grand)``.
        read_gb_per_s / write_gb_per_s: one node's sustained large-transfer rate, GB/s.
        latency_us: per-request latency (network RPC plus server), microseconds.
        capacity_tb: space the job may use (quota), TB (1e12).
    """

    model: str
    read_gb_per_s: float = Field(gt=0)
    write_gb_per_s: float = Field(gt=0)
    latency_us: float = Field(default=1000.0, ge=0)
    capacity_tb: float = Field(gt=0)

    @property
    def read_bytes_per_s(self) -> float:
        """One node's read rate, bytes/s."""
        return self.read_gb_per_s * GB

    @property
    def write_bytes_per_s(self) -> float:
        """One node's write rate, bytes/s."""
        return self.write_gb_per_s * GB

    @property
    def latency_s(self) -> float:
        """Per-request latency, seconds."""
        return self.latency_us * US

    @property
    def capacity_bytes(self) -> float:
        """Usable capacity, bytes."""
        return self.capacity_tb * 1e12


class GpuLink(Frozen):
    """GPU-to-GPU link used by collectives (all-gather, reduce-scatter).

    ``bandwidth_gb_per_s`` is per GPU per direction (NVLink4: 450; a PCIe peer path: the
    PCIe rate).
    """

    kind: Literal["nvlink", "nvswitch", "pcie", "none"] = "none"
    bandwidth_gb_per_s: float = Field(default=0.0, ge=0)
    latency_us: float = Field(default=10.0, ge=0)

    @model_validator(mode="after")
    def _check(self) -> GpuLink:
        if self.kind != "none" and self.bandwidth_gb_per_s <= 0:
            raise ValueError("bandwidth_gb_per_s must be > 0 unless kind is 'none'")
        return self


class Topology(Frozen):
    """How GPUs of a node share host links.

    Attributes:
        gpus_per_node: GPUs in one node.
        gpus_per_pcie_switch: GPUs behind one PCIe switch or root port.
        switch_uplink_gb_per_s: per-direction rate of that switch's upstream link (None: no
            shared bottleneck above the GPUs' own links).
        gpu_link: GPU-to-GPU link inside the node.
        nodes: nodes available.
        inter_node_gb_per_s: network rate per GPU per direction between nodes.
    """

    gpus_per_node: int = Field(default=1, ge=1)
    gpus_per_pcie_switch: int = Field(default=1, ge=1)
    switch_uplink_gb_per_s: float | None = Field(default=None, gt=0)
    gpu_link: GpuLink = GpuLink()
    nodes: int = Field(default=1, ge=1)
    inter_node_gb_per_s: float | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _check(self) -> Topology:
        if self.gpus_per_node % self.gpus_per_pcie_switch:
            raise ValueError(
                f"gpus_per_pcie_switch ({self.gpus_per_pcie_switch}) must divide "
                f"gpus_per_node ({self.gpus_per_node})"
            )
        return self


class HardwareProfile(Frozen):
    """A whole machine: what offsim needs to know to simulate training on it."""

    schema_version: Literal[1] = 1
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9._-]*$")
    description: str = ""
    provenance: Provenance
    gpu: GPU
    host_link: HostLink
    cpu: CPU
    dram: DRAM
    nvme: NVMe | None = None
    pfs: PFS | None = None  # optional third storage tier shared over the network (MLP-Offload)
    topology: Topology = Topology()
    price_usd_per_hour: float | None = Field(default=None, ge=0)
    assumed: dict[str, AssumedRange] = Field(default_factory=dict, description=(
        "fields that are assumptions (dotted path, e.g. cpu.memcpy_gb_per_s) with their range and "
        "why; offsim run --samples draws them (offsim.config.assumed)"))

    @model_validator(mode="before")
    @classmethod
    def _cpu_adam_rate(cls, data: Any) -> Any:
        return _derive_cpu_adam_rate(data)

    @model_validator(mode="after")
    def _check_assumed(self) -> HardwareProfile:
        check_assumed(self, self.assumed)
        return self
