"""Shared pieces of the calibration harness: part results, settings, small statistics, host facts.

Nothing here imports PyTorch; the GPU and CPU parts import it lazily so that the harness runs
(CPU with numpy, NVMe) on a machine without it.
"""

from __future__ import annotations

import dataclasses
import os
import platform
import socket
import statistics
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from offsim.units import GiB, KiB, MiB

Progress = Callable[[str], None]
Status = Literal["ok", "partial", "skipped", "failed"]

#: Parts of the harness, in the order they run.
PARTS: tuple[str, ...] = ("gpu", "cpu", "nvme")

#: Raw-measurement tables and the CSV file each is written to.
TABLE_FILES: dict[str, str] = {
    "transfers": "raw_transfers.csv",
    "gemm": "raw_gemm.csv",
    "hbm": "raw_hbm.csv",
    "pinning": "raw_pinning.csv",
    "cpu": "raw_cpu.csv",
    "nvme": "raw_nvme.csv",
}


@dataclass
class PartResult:
    """What one part of the harness measured.

    Attributes:
        part: ``gpu``, ``cpu`` or ``nvme``.
        status: ``ok``; ``partial`` (some measurements failed, the rest stand); ``skipped``
            (nothing measured, ``messages`` says why); ``failed`` (an unexpected error).
        messages: user-facing lines: why something was skipped, fell back or looks wrong.
        tables: raw rows per table name (see :data:`TABLE_FILES`), one row per measurement,
            units in the column names.
        info: facts read from the machine (device names, versions, settings actually used).
    """

    part: str
    status: Status = "ok"
    messages: list[str] = field(default_factory=list)
    tables: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)

    def rows(self, table: str) -> list[dict[str, Any]]:
        """The rows of ``table`` (created empty on first use)."""
        return self.tables.setdefault(table, [])

    def degrade(self) -> None:
        """Mark the part ``partial`` after one of its measurements failed."""
        if self.status == "ok":
            self.status = "partial"


class Reporter:
    """Forwards progress lines to the caller and keeps the messages a user must see."""

    def __init__(self, progress: Progress | None) -> None:
        self._progress = progress
        self.messages: list[str] = []

    def say(self, line: str) -> None:
        """A progress line (not kept in the report)."""
        if self._progress is not None:
            self._progress(line)

    def warn(self, line: str, part: PartResult | None = None) -> None:
        """A message the report keeps: a skip, a fallback, a suspicious result."""
        self.messages.append(line)
        if part is not None:
            part.messages.append(line)
        self.say(line)


@dataclass(frozen=True)
class CalibrationSettings:
    """Every knob of the harness; :meth:`preset` gives the full and quick defaults.

    Sizes are bytes, times seconds. Tests pass much smaller values than either preset.
    """

    quick: bool = False
    device_index: int = 0
    # GPU: host<->device copies
    transfer_sizes: tuple[int, ...] = tuple(4 * KiB * 4**i for i in range(11))  # 4 KiB .. 4 GiB, cut below
    transfer_repeats: int = 7
    transfer_warmup: int = 3
    bidirectional: bool = True
    # GPU: compute
    gemm_shapes: tuple[tuple[int, int, int], ...] = tuple(
        (n, n, n) for n in (256, 512, 1024, 2048, 4096, 8192, 16384)
    )
    gemm_dtypes: tuple[str, ...] = ("bf16",)
    gemm_repeats: int = 7
    gemm_warmup: int = 3
    l2_flush_bytes: int = 256 * MiB
    block_shape: tuple[int, int, int, int, int] = (1, 2048, 4096, 32, 16384)  # batch, seq, hidden, heads, ffn
    block_dtype: str = "bf16"
    block_repeats: int = 5
    hbm_bytes: int = 1 * GiB
    pin_sizes: tuple[int, ...] = (64 * MiB, 256 * MiB, 1 * GiB)
    pin_repeats: int = 3
    peak_tflops: dict[str, float] | None = None
    # CPU
    cpu_optimizer_params: int = 2**27
    cpu_optimizer_chunk: int = 2**24
    cpu_optimizer_steps: int = 5
    cpu_threads: int | None = None
    try_deepspeed: bool = True
    memcpy_bytes: int = 256 * MiB
    memcpy_repeats: int = 5
    memcpy_threads: int | None = None
    # NVMe
    nvme_file_bytes: int | None = None  # None: 8 GiB (quick 256 MiB); more when O_DIRECT is missing
    nvme_block_sizes: tuple[int, ...] = (128 * KiB, 1 * MiB, 8 * MiB)
    nvme_queue_depths: tuple[int, ...] = (1, 4, 16, 64)
    nvme_point_bytes: int = 2 * GiB
    nvme_point_seconds: float = 10.0
    sustained_seconds: float = 60.0
    sustained_window_s: float = 0.5
    sustained_block: int = 1 * MiB
    sustained_queue_depth: int = 4
    sustained_idle_s: float = 30.0
    nvme_drives: int | None = None
    use_fio: bool = True
    fio_ioengine: str = "libaio"
    free_disk_margin_bytes: int = 256 * MiB

    @classmethod
    def preset(cls, quick: bool = False, **overrides: Any) -> CalibrationSettings:
        """Full defaults, or the quick ones (a few sizes, small buffers, short runs)."""
        base = cls()
        if quick:
            base = dataclasses.replace(
                base,
                quick=True,
                transfer_sizes=(4 * KiB, 64 * KiB, 1 * MiB, 16 * MiB, 64 * MiB),
                transfer_repeats=5,
                transfer_warmup=2,
                gemm_shapes=tuple((n, n, n) for n in (512, 2048, 4096)),
                gemm_repeats=5,
                gemm_warmup=2,
                block_shape=(1, 1024, 2048, 16, 8192),
                block_repeats=3,
                hbm_bytes=256 * MiB,
                pin_sizes=(64 * MiB, 256 * MiB),
                pin_repeats=2,
                cpu_optimizer_params=2**23,
                cpu_optimizer_chunk=2**21,
                cpu_optimizer_steps=3,
                memcpy_bytes=64 * MiB,
                memcpy_repeats=3,
                nvme_block_sizes=(128 * KiB, 1 * MiB),
                nvme_queue_depths=(1, 8),
                nvme_point_bytes=128 * MiB,
                nvme_point_seconds=3.0,
                sustained_seconds=2.0,
                sustained_window_s=0.25,
                sustained_idle_s=0.0,
            )
        else:
            base = dataclasses.replace(base, transfer_sizes=tuple(s for s in base.transfer_sizes if s <= GiB))
        return dataclasses.replace(base, **overrides) if overrides else base

    def as_dict(self) -> dict[str, Any]:
        """The settings as plain JSON-friendly values."""
        out = dataclasses.asdict(self)
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in out.items()}


def median(values: Iterable[float]) -> float:
    """Median of the values (the statistic every timing here reports)."""
    return float(statistics.median(list(values)))


def fmt_bytes(n: float) -> str:
    """``4 KiB``, ``64 MiB``, ``1 GiB``: binary units for buffer sizes."""
    for unit, size in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if n >= size:
            v = n / size
            return f"{v:.0f} {unit}" if v == int(v) else f"{v:.1f} {unit}"
    return f"{n:.0f} B"


def meminfo() -> dict[str, int]:
    """``/proc/meminfo`` in bytes (empty where it cannot be read)."""
    out: dict[str, int] = {}
    try:
        text = Path("/proc/meminfo").read_text()
    except OSError:
        return out
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            mult = 1024 if len(parts) > 1 and parts[1].lower() == "kb" else 1
            out[key.strip()] = int(parts[0]) * mult
    return out


def available_memory_bytes() -> int | None:
    """Host memory that can be allocated without swapping (``MemAvailable``), or None."""
    info = meminfo()
    if "MemAvailable" in info:
        return info["MemAvailable"]
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return None


def cpu_facts() -> dict[str, Any]:
    """CPU model, sockets, physical and logical cores, read from ``/proc/cpuinfo``."""
    facts: dict[str, Any] = {"model": None, "logical_cpus": os.cpu_count() or 1}
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        text = ""
    sockets: set[str] = set()
    cores: set[tuple[str, str]] = set()
    phys = core = ""
    for line in text.splitlines():
        key, _, val = (s.strip() for s in line.partition(":"))
        if key == "model name" and facts["model"] is None:
            facts["model"] = val
        elif key == "physical id":
            phys = val
            sockets.add(val)
        elif key == "core id":
            core = val
            cores.add((phys, core))
    if not facts["model"]:
        facts["model"] = platform.processor() or platform.machine() or "unknown"
    facts["sockets"] = max(1, len(sockets))
    facts["physical_cores"] = len(cores) if cores else facts["logical_cpus"]
    try:
        facts["affinity_cpus"] = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        facts["affinity_cpus"] = facts["logical_cpus"]
    return facts


def system_facts() -> dict[str, Any]:
    """Host name, OS, Python and library versions: the environment every profile records."""
    import numpy as np

    import offsim

    facts: dict[str, Any] = {
        "host": socket.gethostname(),
        "os": platform.platform(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "offsim": offsim.__version__,
        "cpu": cpu_facts(),
        "memory_total_bytes": meminfo().get("MemTotal"),
    }
    try:
        import torch

        facts["torch"] = torch.__version__
        facts["torch_cuda"] = torch.version.cuda
    except Exception:  # torch is optional; a broken install counts as absent
        facts["torch"] = None
    return facts
