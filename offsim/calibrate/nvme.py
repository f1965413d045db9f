"""NVMe measurements: sequential read/write over block sizes and queue depths, and a sustained
write long enough to show a write-cache drop.

Method (../shared/reference/calibration_practice.md §1.4, §3 pitfalls 2 and 12):

* O_DIRECT reads and writes (no page cache) into page-aligned ``mmap`` buffers at offsets that
  are multiples of the block size. A queue depth of Q is Q threads each issuing synchronous
  ``preadv``/``pwritev`` (the GIL is released during the system call), walking the file
  sequentially through a shared offset counter.
* ``fio`` is used for the sweep when it is on PATH (``--direct=1``, libaio, JSON output);
  offsim's own reader/writer otherwise, or when fio fails.
* Write points end with ``fsync`` (inside the timed region), as fio's ``end_fsync``.
* The sustained write cycles over the test file with 1 MiB blocks and samples the bytes written
  per time window (TechPowerUp samples twice per second).
* Without O_DIRECT: buffered I/O, ``fsync`` after writes, ``posix_fadvise(DONTNEED)`` before
  reads, ``O_DSYNC`` for the sustained write, a file larger than RAM unless quick, and a
  message saying so.

Before anything is written the target is checked, each failure giving one message and skipping
only this part: the folder exists, can be written, is not RAM-backed (tmpfs/ramfs/zram) and has
room for the test file. The test file is always removed (``try/finally``).
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import mmap
import os
import secrets
import shutil
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from offsim.calibrate.common import CalibrationSettings, PartResult, Reporter, fmt_bytes, meminfo
from offsim.units import GiB, MiB

#: File systems whose data live in RAM: measuring them measures memory, not a drive.
RAM_FILESYSTEMS = frozenset({"tmpfs", "ramfs", "devtmpfs", "hugetlbfs"})
ALIGN = 4096
TEST_FILE_PREFIX = ".offsim-calibrate-"


class NvmeTargetError(Exception):
    """The target cannot be measured; the message says why (one line, shown to the user)."""


# ---------------------------------------------------------------------------------------------
# Checks on the target folder


def _unescape_mount(field: str) -> str:
    """``/proc/mounts`` writes space, tab, newline and backslash as octal escapes."""
    for esc, ch in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(esc, ch)
    return field


def mount_of(path: Path, mounts_text: str | None = None) -> dict[str, str] | None:
    """The mount holding ``path``: ``mount_point``, ``fstype``, ``source``; None if unknown.

    The longest mount point that is a prefix of the resolved path wins; among equal ones the
    last listed (a later mount hides an earlier one).
    """
    if mounts_text is None:
        try:
            mounts_text = Path("/proc/mounts").read_text()
        except OSError:
            return None
    real = os.path.realpath(path)
    best: dict[str, str] | None = None
    for line in mounts_text.splitlines():
        parts = line.split()
        if len(parts) < 3:
            continue
        source, mnt, fstype = _unescape_mount(parts[0]), _unescape_mount(parts[1]), parts[2]
        inside = mnt == "/" or real == mnt or real.startswith(mnt.rstrip("/") + "/")
        if inside and (best is None or len(mnt) >= len(best["mount_point"])):
            best = {"mount_point": mnt, "fstype": fstype, "source": source}
    return best


def ram_backed(mount: dict[str, str] | None) -> bool:
    """True for tmpfs/ramfs-like file systems and for a zram block device."""
    if mount is None:
        return False
    return mount["fstype"] in RAM_FILESYSTEMS or os.path.basename(mount["source"]).startswith("zram")


def block_device_info(path: Path) -> dict[str, Any]:
    """Model, rotational flag and RAID members of the block device under ``path`` (sysfs)."""
    info: dict[str, Any] = {}
    try:
        st = os.stat(path)
        sysdir = Path(f"/sys/dev/block/{os.major(st.st_dev)}:{os.minor(st.st_dev)}").resolve(strict=True)
    except OSError:
        return info
    if (sysdir / "partition").exists():
        sysdir = sysdir.parent
    info["block_device"] = sysdir.name
    for key, rel in (
        ("model", "device/model"),
        ("rotational", "queue/rotational"),
        ("logical_block_bytes", "queue/logical_block_size"),
    ):
        with contextlib.suppress(OSError):
            info[key] = (sysdir / rel).read_text().strip()
    try:
        slaves = sorted(p.name for p in (sysdir / "slaves").iterdir())
    except OSError:
        slaves = []
    if slaves:
        info["members"] = slaves
    return info


def direct_io_flag() -> int | None:
    """``os.O_DIRECT`` where the platform has it."""
    return getattr(os, "O_DIRECT", None)


def check_target(folder: Path) -> dict[str, Any]:
    """Checks that need no test file: the folder exists, is writable, is not in RAM.

    Raises:
        NvmeTargetError: with the one message to show.
    """
    if not folder.is_dir():
        raise NvmeTargetError(f"NVMe part skipped: {folder} does not exist or is not a folder")
    if not os.access(folder, os.W_OK):
        raise NvmeTargetError(f"NVMe part skipped: no write permission in {folder}")
    mount = mount_of(folder)
    if ram_backed(mount):
        assert mount is not None
        raise NvmeTargetError(
            f"NVMe part skipped: {folder} is on a RAM-backed file system ({mount['fstype']} at "
            f"{mount['mount_point']}); the results would measure RAM, not a drive. "
            "Give a folder on the NVMe drive (--nvme-dir)"
        )
    return {"mount": mount}


def check_space(folder: Path, need_bytes: int) -> int:
    """Free bytes in ``folder``; raises :class:`NvmeTargetError` when below ``need_bytes``."""
    free = shutil.disk_usage(folder).free
    if free < need_bytes:
        raise NvmeTargetError(
            f"NVMe part skipped: too little free disk in {folder}: the test needs {fmt_bytes(need_bytes)} "
            f"(test file and margin), {fmt_bytes(free)} free. Free space, or use --quick"
        )
    return free


# ---------------------------------------------------------------------------------------------
# The test file


@dataclass
class BenchFile:
    """An open test file: descriptor, whether it is O_DIRECT, and why not."""

    path: Path
    fd: int
    direct: bool
    why_not_direct: str = ""
    extra_fds: list[int] = field(default_factory=list)

    def close(self) -> None:
        for fd in [self.fd, *self.extra_fds]:
            with contextlib.suppress(OSError):
                os.close(fd)


def _aligned_buffer(nbytes: int, fill: bytes | None = None) -> mmap.mmap:
    buf = mmap.mmap(-1, nbytes)  # page-aligned, as O_DIRECT requires
    if fill:
        for off in range(0, nbytes, len(fill)):
            n = min(len(fill), nbytes - off)
            buf[off : off + n] = fill[:n]
    return buf


def open_test_file(path: Path) -> BenchFile:
    """Create ``path`` (it must not exist) with O_DIRECT when the file system accepts it.

    A 4 KiB aligned write probes O_DIRECT; EINVAL from ``open`` or the write means the file
    system refuses it and the file is reopened buffered.

    Raises:
        NvmeTargetError: the file cannot be created for lack of permission.
    """
    base = os.O_RDWR | os.O_CREAT | os.O_EXCL
    flag = direct_io_flag()
    why = ""
    try:
        if flag is None:
            why = "O_DIRECT is not available on this platform"
            fd = os.open(path, base, 0o600)
        else:
            try:
                fd = os.open(path, base | flag, 0o600)
            except OSError as exc:
                if exc.errno != errno.EINVAL:
                    raise
                why = f"the file system refused O_DIRECT ({exc.strerror})"
                fd = os.open(path, base, 0o600)
            else:
                probe = _aligned_buffer(ALIGN, b"\0")
                try:
                    os.pwritev(fd, [probe], 0)
                except OSError as exc:
                    if exc.errno != errno.EINVAL:
                        raise
                    os.close(fd)
                    why = f"O_DIRECT writes failed ({exc.strerror})"
                    fd = os.open(path, os.O_RDWR, 0o600)
                finally:
                    probe.close()
    except OSError as exc:
        if isinstance(exc, PermissionError) or exc.errno == errno.EROFS:
            raise NvmeTargetError(
                f"NVMe part skipped: no write permission in {path.parent} ({exc.strerror})"
            ) from None
        raise
    return BenchFile(path, fd, direct=not why, why_not_direct=why)


def _drop_cache(fd: int) -> None:
    if hasattr(os, "posix_fadvise"):
        with contextlib.suppress(OSError):
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)


def _block_limit(region_bytes: int, block: int, total_bytes: float, wrap: bool) -> tuple[int, float]:
    """Blocks in the region, and how many requests to issue in all (``inf``: until the deadline)."""
    blocks = region_bytes // block
    if blocks < 1:
        raise ValueError(f"region of {region_bytes} B is smaller than one {block} B block")
    limit: float = math.inf if wrap else blocks
    if math.isfinite(total_bytes):
        limit = min(limit, max(1, int(total_bytes // block)))
    return blocks, limit


def _sample_windows(
    futures: list[Any], done: list[int], t0: float, window_s: float
) -> list[tuple[float, float, int]]:
    """Bytes done per ``window_s`` window, sampled until every worker has returned."""
    windows: list[tuple[float, float, int]] = []
    last_t, last_b, k = t0, 0, 1
    while not all(f.done() for f in futures):
        time.sleep(max(0.0, t0 + k * window_s - time.perf_counter()))
        k += 1
        now, total = time.perf_counter(), sum(done)
        windows.append((last_t - t0, now - t0, total - last_b))
        last_t, last_b = now, total
    return windows


class _Requests:
    """The requests of one :func:`run_io`: ``qd`` threads take the next block in turn.

    Block ``b`` is at offset ``(b % blocks) * block`` (wrapping around the region); no request
    is issued past ``limit`` blocks or after ``deadline``. A thread that fails sets ``stop``, so
    the others stop too.
    """

    def __init__(self, fd: int, op: str, block: int, blocks: int, limit: float, deadline: float,
                 bufs: list[mmap.mmap]) -> None:
        self.fd, self.op, self.block, self.blocks, self.limit, self.deadline = fd, op, block, blocks, limit, deadline
        self.bufs = bufs
        self.io = os.preadv if op == "read" else os.pwritev
        self.done = [0] * len(bufs)  # bytes done per thread
        self.next = 0
        self.lock = threading.Lock()
        self.stop = threading.Event()

    def _take(self) -> int | None:
        """The next block to do, or None when the run is over."""
        with self.lock:
            b = self.next
            if b >= self.limit or time.perf_counter() >= self.deadline:
                return None
            self.next = b + 1
            return b

    def worker(self, i: int) -> None:
        """Thread ``i``: synchronous requests on its own buffer until the run is over."""
        buf = self.bufs[i]
        try:
            while not self.stop.is_set():
                b = self._take()
                if b is None:
                    return
                off = (b % self.blocks) * self.block
                n = self.io(self.fd, [buf], off)
                if n != self.block:
                    raise OSError(errno.EIO, f"short {self.op} at offset {off}: {n} of {self.block} bytes")
                self.done[i] += n
        except BaseException:
            self.stop.set()  # the other threads stop too
            raise


def run_io(
    fd: int,
    op: str,
    block: int,
    qd: int,
    region_bytes: int,
    total_bytes: float,
    seconds: float,
    *,
    wrap: bool = False,
    sync: bool = True,
    direct: bool = True,
    window_s: float | None = None,
) -> dict[str, Any]:
    """Sequential ``op`` ('read' or 'write') with ``qd`` threads of synchronous requests.

    Walks ``region_bytes`` of the file in ``block`` steps (wrapping around when ``wrap``),
    stopping after ``total_bytes`` or ``seconds``. Writes end with ``fsync`` when ``sync``;
    without O_DIRECT the file's cached pages are dropped before reads.

    Returns:
        ``bytes``, ``time_s`` and, with ``window_s``, ``windows``: consecutive
        (start_s, end_s, bytes) samples of the bytes done.
    """
    blocks, limit = _block_limit(region_bytes, block, total_bytes, wrap)
    pattern = secrets.token_bytes(min(block, MiB))
    bufs = [_aligned_buffer(block, pattern if op == "write" else None) for _ in range(qd)]
    if op == "read" and not direct:
        _drop_cache(fd)

    t0 = time.perf_counter()
    requests = _Requests(fd, op, block, blocks, limit, t0 + seconds, bufs)
    windows: list[tuple[float, float, int]] = []
    try:
        with ThreadPoolExecutor(qd) as pool:
            futures = [pool.submit(requests.worker, i) for i in range(qd)]
            if window_s:
                windows = _sample_windows(futures, requests.done, t0, window_s)
            for f in futures:
                f.result()
        if op == "write" and sync:
            os.fsync(fd)
    finally:
        requests.stop.set()
        for b in bufs:
            b.close()
    elapsed = time.perf_counter() - t0
    # keep whole windows inside the run; the last one holds only the requests in flight at the end
    windows = [w for w in windows if w[1] <= seconds + 0.05 * (window_s or 0)]
    return {"bytes": sum(requests.done), "time_s": elapsed, "windows": windows}


# ---------------------------------------------------------------------------------------------
# fio


class FioError(Exception):
    """fio could not run or its output could not be read."""


def parse_fio_json(text: str, op: str) -> tuple[int, float]:
    """``(io_bytes, seconds)`` of the ``op`` section of fio's JSON output (first job).

    fio may print warnings before the JSON object; everything before the first ``{`` is skipped.
    """
    start = text.find("{")
    if start < 0:
        raise FioError("no JSON in fio's output")
    try:
        data = json.loads(text[start:])
        sec = data["jobs"][0][op]
        nbytes, ms = int(sec["io_bytes"]), float(sec["runtime"])
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        raise FioError(f"unexpected fio JSON ({type(exc).__name__}: {exc})") from None
    if nbytes <= 0 or ms <= 0:
        raise FioError(f"fio reported no {op} I/O")
    return nbytes, ms / 1e3


def run_fio(
    path: Path,
    op: str,
    block: int,
    qd: int,
    file_bytes: int,
    io_bytes: int,
    seconds: float,
    direct: bool,
    engine: str,
) -> dict[str, Any]:
    """One fio job on the existing test file; returns ``bytes`` and ``time_s``."""
    exe = shutil.which("fio")
    if exe is None:
        raise FioError("fio is not on PATH")
    cmd = [
        exe,
        "--name=offsim-calibrate",
        f"--filename={path}",
        f"--rw={op}",
        f"--bs={block}",
        f"--iodepth={qd}",
        f"--ioengine={engine}",
        f"--direct={int(direct)}",
        f"--size={file_bytes}",
        f"--io_size={io_bytes}",
        f"--runtime={max(1, math.ceil(seconds))}",
        "--numjobs=1",
        "--thread",
        "--invalidate=1",
        "--randrepeat=0",
        "--output-format=json",
    ]
    if op == "write":
        cmd.append("--end_fsync=1")
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=3 * seconds + 120, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        raise FioError(f"{type(exc).__name__}: {exc}") from None
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        raise FioError(f"fio exited with {proc.returncode}: {tail[0]}")
    nbytes, secs = parse_fio_json(proc.stdout, op)
    return {"bytes": nbytes, "time_s": secs}


# ---------------------------------------------------------------------------------------------
# The part


def _file_size(settings: CalibrationSettings, direct: bool) -> int:
    if settings.nvme_file_bytes is not None:
        size = settings.nvme_file_bytes
    elif settings.quick:
        size = 256 * MiB
    else:
        size = 8 * GiB
        if not direct:  # buffered: larger than the page cache can hold
            size = max(size, int(1.25 * meminfo().get("MemTotal", 0)))
    step = max(*settings.nvme_block_sizes, settings.sustained_block)
    return max(step, size // step * step)


def _row(
    phase: str, op: str, block: int, qd: int, res: dict[str, Any], tool: str, direct: bool
) -> dict[str, Any]:
    t = res["time_s"]
    return {
        "phase": phase,
        "op": op,
        "block_bytes": block,
        "queue_depth": qd,
        "bytes": res["bytes"],
        "time_s": t,
        "gb_per_s": res["bytes"] / t / 1e9 if t > 0 else 0.0,
        "tool": tool,
        "direct_io": direct,
        "window": None,
        "window_start_s": None,
        "window_end_s": None,
    }


def run_nvme_part(settings: CalibrationSettings, nvme_dir: Path | None, rep: Reporter) -> PartResult:
    """Checks the target, then layout write, the sweep and the sustained write."""
    part = PartResult("nvme")
    if nvme_dir is None:
        part.status = "skipped"
        rep.warn("NVMe part skipped: no folder on the NVMe drive was given (--nvme-dir)", part)
        return part
    folder = Path(nvme_dir)
    try:
        part.info.update(check_target(folder))
    except NvmeTargetError as exc:
        part.status = "skipped"
        rep.warn(str(exc), part)
        return part
    part.info.update(block_device_info(folder))
    if part.info.get("rotational") == "1":
        # often wrong in virtual machines (virtio disks report 1), so a progress line, not a warning
        rep.say(f"[nvme] note: the kernel reports {part.info.get('block_device')} as rotational (not an SSD)")
    path = folder / f"{TEST_FILE_PREFIX}{os.getpid()}-{secrets.token_hex(4)}.tmp"
    tf: BenchFile | None = None
    try:
        tf = open_test_file(path)
        size = _file_size(settings, tf.direct)
        check_space(folder, size + settings.free_disk_margin_bytes)
        if not tf.direct:
            rep.warn(
                f"NVMe: {tf.why_not_direct}; falling back to buffered I/O + fsync + "
                "posix_fadvise(DONTNEED)"
                + ("" if not settings.quick else " (quick mode: reads may still come from the page cache)"),
                part,
            )
        part.info.update(
            {
                "test_file_bytes": size,
                "direct_io": tf.direct,
                "disk_total_bytes": shutil.disk_usage(folder).total,
            }
        )
        _measure(settings, tf, size, part, rep)
    except NvmeTargetError as exc:
        part.status = "skipped"
        rep.warn(str(exc), part)
    except Exception as exc:
        part.status = "partial" if part.rows("nvme") else "failed"
        rep.warn(f"NVMe measurement failed: {type(exc).__name__}: {exc}", part)
    finally:
        if tf is not None:
            tf.close()
        try:
            path.unlink()
        except FileNotFoundError:
            pass
        except OSError as exc:
            rep.warn(f"could not remove the NVMe test file {path}: {exc}", part)
    return part


def _measure(
    settings: CalibrationSettings, tf: BenchFile, size: int, part: PartResult, rep: Reporter
) -> None:
    rows = part.rows("nvme")
    direct = tf.direct
    layout_block = max(settings.nvme_block_sizes)
    rep.say(f"[nvme] writing the {fmt_bytes(size)} test file ({'O_DIRECT' if direct else 'buffered'})")
    layout = run_io(tf.fd, "write", layout_block, 4, size, size, math.inf, direct=direct)
    rows.append(_row("layout", "write", layout_block, 4, layout, "offsim", direct))
    use_fio = settings.use_fio and shutil.which("fio") is not None
    fio_failed = False
    point_bytes = min(size, settings.nvme_point_bytes) if direct else size
    for op in ("read", "write"):
        for block in settings.nvme_block_sizes:
            for qd in settings.nvme_queue_depths:
                res, tool = None, "offsim"
                if use_fio and not fio_failed:
                    try:
                        res = run_fio(
                            tf.path,
                            op,
                            block,
                            qd,
                            size,
                            point_bytes,
                            settings.nvme_point_seconds,
                            direct,
                            settings.fio_ioengine,
                        )
                        tool = "fio"
                    except FioError as exc:
                        fio_failed = True
                        rep.warn(f"NVMe: fio failed ({exc}); using offsim's own reader/writer", part)
                if res is None:
                    res = run_io(
                        tf.fd, op, block, qd, size, point_bytes, settings.nvme_point_seconds, direct=direct
                    )
                row = _row("sweep", op, block, qd, res, tool, direct)
                rows.append(row)
                rate = row["gb_per_s"]
                rep.say(f"[nvme] {op:5s} bs={fmt_bytes(block):>8s} qd={qd:<3d}: {rate:.3f} GB/s ({tool})")
    _sustained(settings, tf, size, part, rep)


def _sustained(
    settings: CalibrationSettings, tf: BenchFile, size: int, part: PartResult, rep: Reporter
) -> None:
    if settings.sustained_seconds <= 0:
        return
    if settings.sustained_idle_s > 0:
        rep.say(f"[nvme] idle {settings.sustained_idle_s:.0f} s so the drive can drain its write cache")
        time.sleep(settings.sustained_idle_s)
    fd = tf.fd
    if not tf.direct:  # every write must reach the device, not the page cache
        fd = os.open(tf.path, os.O_RDWR | getattr(os, "O_DSYNC", 0))
        tf.extra_fds.append(fd)
    block, qd = settings.sustained_block, settings.sustained_queue_depth
    rep.say(f"[nvme] sustained write for {settings.sustained_seconds:g} s (bs={fmt_bytes(block)}, qd={qd})")
    res = run_io(
        fd,
        "write",
        block,
        qd,
        size,
        math.inf,
        settings.sustained_seconds,
        wrap=True,
        direct=tf.direct,
        window_s=settings.sustained_window_s,
    )
    rows = part.rows("nvme")
    for i, (t0, t1, nbytes) in enumerate(res["windows"]):
        dt = t1 - t0
        rows.append(
            {
                "phase": "sustained",
                "op": "write",
                "block_bytes": block,
                "queue_depth": qd,
                "bytes": nbytes,
                "time_s": dt,
                "gb_per_s": nbytes / dt / 1e9 if dt > 0 else 0.0,
                "tool": "offsim",
                "direct_io": tf.direct,
                "window": i,
                "window_start_s": t0,
                "window_end_s": t1,
            }
        )
    rates = [r["gb_per_s"] for r in rows if r["phase"] == "sustained"]
    if rates:
        rep.say(
            f"[nvme] sustained write: {res['bytes'] / res['time_s'] / 1e9:.3f} GB/s average over "
            f"{fmt_bytes(res['bytes'])}; windows {', '.join(f'{r:.2f}' for r in rates[:12])}"
            + (" ..." if len(rates) > 12 else "")
            + " GB/s"
        )
