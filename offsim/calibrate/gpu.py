"""GPU measurements through PyTorch: host<->device copies, GEMM, one transformer block, HBM copy,
the cost of pinning host memory, and device facts (copy engines, PCIe link, versions).

PyTorch is imported lazily (:func:`load_torch_cuda`); without it, or without a CUDA device, the
GPU part is skipped with one message and the rest of the harness runs.

Methods follow ../shared/reference/calibration_practice.md: CUDA-event timing on a dedicated
stream, warm-up copies before timing, several repeats and the median (nvbandwidth,
``triton.testing.do_bench``); the L2 cache is flushed by zeroing a 256 MiB buffer before each
timed GEMM (triton, mamf-finder); host buffers are touched before timing so page faults are not
measured; bidirectional copies gate both streams behind a short device-side sleep so that the
two directions start together (nvbandwidth's spin-kernel idea), and each direction is reported
on its own.

GEMM, block and HBM timers also accept a CPU device (wall clock) so their mechanics can be
tested without a GPU; host<->device copies and pinning need CUDA.
"""

from __future__ import annotations

import contextlib
import ctypes
import shutil
import subprocess
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from offsim.calibrate.common import (
    CalibrationSettings,
    PartResult,
    Reporter,
    available_memory_bytes,
    fmt_bytes,
    median,
)
from offsim.units import GiB, MiB

DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32", "tf32": "float32"}

#: Dense tensor-core peak by device-name pattern (first match wins), TFLOP/s; fp32 is the
#: non-tensor rate. From ../shared/reference/hardware_facts.md §1.1 (datasheets). Used only
#: to express GEMM efficiency as a fraction of peak; never as a measured number.
KNOWN_PEAKS: tuple[tuple[str, dict[str, float]], ...] = (
    ("H100 PCIe", {"bf16": 756.0, "fp16": 756.0, "fp32": 51.0}),
    ("H100 NVL", {}),  # the sources disagree: no entry
    ("H100", {"bf16": 989.0, "fp16": 989.0, "fp32": 67.0}),
    ("H200", {"bf16": 989.0, "fp16": 989.0, "fp32": 67.0}),
    ("A100", {"bf16": 312.0, "fp16": 312.0, "fp32": 19.5}),
    ("RTX 4090", {"bf16": 165.15, "fp16": 165.15, "fp32": 82.58}),
    ("RTX A6000", {"bf16": 154.8, "fp16": 154.8, "fp32": 38.71}),
    ("L40S", {"bf16": 362.0, "fp16": 362.0, "fp32": 91.6}),
    ("V100-PCIE", {"fp16": 112.0}),
    ("V100", {"fp16": 125.0, "fp32": 15.7}),
)


def known_peak_tflops(device_name: str) -> dict[str, float] | None:
    """Datasheet peaks for a device name from :data:`KNOWN_PEAKS`, or None."""
    low = device_name.lower()
    for pattern, peaks in KNOWN_PEAKS:
        if pattern.lower() in low:
            return dict(peaks) or None
    return None


def load_torch_cuda(device_index: int = 0) -> tuple[Any, str | None]:
    """``(torch, None)`` when CUDA device ``device_index`` is usable, else ``(None, why)``."""
    try:
        import torch
    except ImportError:
        return None, (
            "GPU part skipped: PyTorch is not installed, so no GPU can be measured "
            "(install a CUDA build of torch, e.g. pip install 'offsim[calibrate]')"
        )
    except Exception as exc:  # a broken install
        return None, f"GPU part skipped: importing torch failed ({type(exc).__name__}: {exc})"
    try:
        ok = bool(torch.cuda.is_available())
    except Exception:
        ok = False
    if not ok:
        return None, (
            f"GPU part skipped: torch {torch.__version__} sees no CUDA device "
            "(torch.cuda.is_available() is False)"
        )
    count = torch.cuda.device_count()
    if device_index >= count:
        return None, f"GPU part skipped: CUDA device {device_index} requested but only {count} visible"
    return torch, None


# ---------------------------------------------------------------------------------------------
# Timing


def timed(torch: Any, device: Any, fn: Callable[[], Any], stream: Any = None) -> float:
    """Seconds ``fn`` takes: CUDA events on ``stream`` for a CUDA device, wall clock otherwise."""
    if device.type != "cuda":
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0
    stream = stream or torch.cuda.current_stream(device)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with torch.cuda.stream(stream):
        start.record(stream)
        fn()
        end.record(stream)
    end.synchronize()
    return start.elapsed_time(end) / 1e3


# ---------------------------------------------------------------------------------------------
# Device facts


def _cuda_driver_attrs(index: int) -> dict[str, Any]:
    """Copy-engine count and PCI address through the driver API (libcuda), best effort."""
    out: dict[str, Any] = {}
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return out
    dev = ctypes.c_int()
    if lib.cuInit(0) != 0 or lib.cuDeviceGet(ctypes.byref(dev), index) != 0:
        return out
    # CUdevice_attribute: ASYNC_ENGINE_COUNT 40, PCI_BUS_ID 33, PCI_DEVICE_ID 34, PCI_DOMAIN_ID 50
    for name, attr in (("copy_engines", 40), ("pci_bus", 33), ("pci_device", 34), ("pci_domain", 50)):
        val = ctypes.c_int()
        if lib.cuDeviceGetAttribute(ctypes.byref(val), attr, dev) == 0:
            out[name] = int(val.value)
    if {"pci_bus", "pci_device", "pci_domain"} <= out.keys():
        out["pci_bus_id"] = f"{out['pci_domain']:08X}:{out['pci_bus']:02X}:{out['pci_device']:02X}.0"
    return out


NVSMI_FIELDS = (
    "name",
    "driver_version",
    "pcie.link.gen.max",
    "pcie.link.width.max",
    "pcie.link.gen.current",
    "pcie.link.width.current",
    "clocks.max.sm",
    "power.limit",
    "pci.bus_id",
)


def nvidia_smi_query(select: str | None = None) -> dict[str, str]:
    """``nvidia-smi --query-gpu`` for one GPU (by bus id or index), or {} when unavailable."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return {}
    cmd = [exe, f"--query-gpu={','.join(NVSMI_FIELDS)}", "--format=csv,noheader,nounits"]
    if select is not None:
        cmd += ["-i", select]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.SubprocessError):
        return {}
    if proc.returncode != 0 or not proc.stdout.strip():
        return {}
    vals = [v.strip() for v in proc.stdout.strip().splitlines()[0].split(",")]
    return dict(zip(NVSMI_FIELDS, vals, strict=False))


def _int_or_none(text: str | None) -> int | None:
    try:
        return int(float(text))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None


def device_info(torch: Any, index: int) -> dict[str, Any]:
    """What the profile needs to know about the device, each read guarded."""
    info: dict[str, Any] = {
        "index": index,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "device_count": torch.cuda.device_count(),
    }
    props = torch.cuda.get_device_properties(index)
    for attr in (
        "name",
        "total_memory",
        "multi_processor_count",
        "major",
        "minor",
        "L2_cache_size",
        "memory_bus_width",
        "memory_clock_rate",
        "clock_rate",
        "uuid",
    ):
        with contextlib.suppress(Exception):
            v = getattr(props, attr)
            info[attr] = v if isinstance(v, int | float | str) else str(v)
    with contextlib.suppress(Exception):
        free, total = torch.cuda.mem_get_info(index)
        info["free_memory_at_start"] = int(free)
        info["context_reserved_bytes"] = int(total - free)
    info.update(_cuda_driver_attrs(index))
    smi = nvidia_smi_query(info.get("pci_bus_id") or str(index))
    if smi:
        info["nvidia_smi"] = smi
        info["driver_version"] = smi.get("driver_version")
        info["pcie_gen_max"] = _int_or_none(smi.get("pcie.link.gen.max"))
        info["pcie_width_max"] = _int_or_none(smi.get("pcie.link.width.max"))
    return info


# ---------------------------------------------------------------------------------------------
# Host <-> device copies


def _host_buffer(torch: Any, nbytes: int, pinned: bool, value: int) -> Any:
    buf = torch.empty(nbytes, dtype=torch.uint8, pin_memory=pinned)
    buf.fill_(value)  # touch every page before timing
    return buf


def measure_transfers(
    torch: Any,
    device: Any,
    sizes: list[int],
    repeats: int,
    warmup: int,
    bidirectional: bool,
    part: PartResult,
    rep: Reporter,
) -> None:
    """H2D and D2H copies per size, pinned and pageable, alone; pinned also both at once.

    One row per timed copy: ``device_time_s`` from CUDA events on the copy's stream (what the
    copy costs on the device, including the driver's staging for pageable memory) and
    ``host_wall_s`` (issue to completion, as seen by Python).
    """
    rows = part.rows("transfers")
    gate_cycles = 0
    if hasattr(torch.cuda, "_sleep"):
        props = torch.cuda.get_device_properties(device)
        gate_cycles = int(getattr(props, "clock_rate", 1_500_000) * 2)  # ~2 ms at the SM clock (kHz)
    for memory in ("pinned", "pageable"):
        _transfers_one_memory(
            torch, device, memory, sizes, repeats, warmup, bidirectional, gate_cycles, rows, rep
        )
        # the buffers are gone with the call's frame; hand the memory back
        torch.cuda.empty_cache()
        _empty_host_cache(torch)


def _transfers_one_memory(
    torch: Any,
    device: Any,
    memory: str,
    sizes: list[int],
    repeats: int,
    warmup: int,
    bidirectional: bool,
    gate_cycles: int,
    rows: list,
    rep: Reporter,
) -> None:
    pinned = memory == "pinned"
    max_size = max(sizes)
    h_src = _host_buffer(torch, max_size, pinned, 1)
    h_dst = _host_buffer(torch, max_size, pinned, 0)
    d_src = torch.ones(max_size, dtype=torch.uint8, device=device)
    d_dst = torch.empty(max_size, dtype=torch.uint8, device=device)
    streams = {"h2d": torch.cuda.Stream(device), "d2h": torch.cuda.Stream(device)}
    torch.cuda.synchronize(device)  # the side streams do not wait for the default stream's fills
    try:
        for size in sizes:
            pair = {"h2d": (h_src[:size], d_dst[:size]), "d2h": (d_src[:size], h_dst[:size])}
            for direction, (src, dst) in pair.items():
                s = streams[direction]
                samples = []
                for i in range(warmup + repeats):
                    t0 = time.perf_counter()
                    dt = timed(torch, device, partial(dst.copy_, src, non_blocking=pinned), s)
                    wall = time.perf_counter() - t0
                    if i >= warmup:
                        samples.append(dt)
                        rows.append(
                            {
                                "direction": direction,
                                "memory": memory,
                                "concurrency": "alone",
                                "size_bytes": size,
                                "rep": i - warmup,
                                "device_time_s": dt,
                                "host_wall_s": wall,
                                "gb_per_s": size / dt / 1e9,
                            }
                        )
                rep.say(
                    f"[gpu] {direction} {memory:8s} {fmt_bytes(size):>8s}: "
                    f"{size / median(samples) / 1e9:8.2f} GB/s"
                )
            if pinned and bidirectional:
                _bidir(torch, device, size, pair, streams, repeats, warmup, gate_cycles, rows, rep)
    finally:
        torch.cuda.synchronize(device)  # side-stream copies done before the buffers go back


def _bidir(
    torch: Any,
    device: Any,
    size: int,
    pair: dict,
    streams: dict,
    repeats: int,
    warmup: int,
    gate_cycles: int,
    rows: list,
    rep: Reporter,
) -> None:
    gate = torch.cuda.Stream(device)
    samples: dict[str, list[float]] = {"h2d": [], "d2h": []}
    for i in range(warmup + repeats):
        torch.cuda.synchronize(device)
        opened = torch.cuda.Event()
        with torch.cuda.stream(gate):
            if gate_cycles:
                torch.cuda._sleep(gate_cycles)
            opened.record(gate)
        ev = {}
        for direction, (src, dst) in pair.items():
            s = streams[direction]
            s.wait_event(opened)
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            with torch.cuda.stream(s):
                e0.record(s)
                dst.copy_(src, non_blocking=True)
                e1.record(s)
            ev[direction] = (e0, e1)
        torch.cuda.synchronize(device)
        if i < warmup:
            continue
        for direction, (e0, e1) in ev.items():
            dt = e0.elapsed_time(e1) / 1e3
            samples[direction].append(dt)
            rows.append(
                {
                    "direction": direction,
                    "memory": "pinned",
                    "concurrency": "bidir",
                    "size_bytes": size,
                    "rep": i - warmup,
                    "device_time_s": dt,
                    "host_wall_s": float("nan"),
                    "gb_per_s": size / dt / 1e9,
                }
            )
    rep.say(
        f"[gpu] bidir    pinned   {fmt_bytes(size):>8s}: "
        + ", ".join(f"{d} {size / median(v) / 1e9:.2f} GB/s" for d, v in samples.items())
    )


def _empty_host_cache(torch: Any) -> None:
    """Return cached pinned blocks to the OS (``torch.accelerator.empty_host_cache``, newer torch)."""
    with contextlib.suppress(Exception):
        torch.accelerator.empty_host_cache()


# ---------------------------------------------------------------------------------------------
# Compute


def _dtype(torch: Any, name: str) -> Any:
    return getattr(torch, DTYPES[name])


@contextlib.contextmanager
def _tf32(torch: Any, allow: bool):
    """fp32 matmuls on tensor cores (tf32) or not, restored afterwards.

    Newer torch has ``torch.backends.cuda.matmul.fp32_precision``; older ones ``allow_tf32``.
    """
    m = torch.backends.cuda.matmul
    if hasattr(m, "fp32_precision"):
        attr, value = "fp32_precision", ("tf32" if allow else "ieee")
    else:
        attr, value = "allow_tf32", allow  # type: ignore[assignment]
    old = getattr(m, attr)
    setattr(m, attr, value)
    try:
        yield
    finally:
        setattr(m, attr, old)


def measure_gemm(
    torch: Any,
    device: Any,
    shapes: list[tuple[int, int, int]],
    dtypes: list[str],
    repeats: int,
    warmup: int,
    part: PartResult,
    rep: Reporter,
    flush_bytes: int = 256 * MiB,
) -> None:
    """``C = A @ B`` per (m, n, k) and dtype; one row per timed call (``kind='gemm'``).

    On CUDA a ``flush_bytes`` buffer is zeroed before every call (outside the timed region)
    so each GEMM starts with a cold L2. Shapes that do not fit in free memory are skipped.
    """
    device = torch.device(device)
    rows = part.rows("gemm")
    flush = torch.empty(flush_bytes if device.type == "cuda" else 0, dtype=torch.uint8, device=device)
    for dname in dtypes:
        esize = torch.tensor([], dtype=_dtype(torch, dname)).element_size()
        for m, n, k in shapes:
            if not _gemm_fits(torch, device, (m, n, k), dname, esize, part, rep):
                continue
            samples = _time_gemm(torch, device, (m, n, k), dname, repeats, warmup, flush, rows)
            rep.say(f"[gpu] gemm {dname} {m}x{n}x{k}: {2.0 * m * n * k / median(samples) / 1e12:.2f} TFLOP/s")
    del flush


def _gemm_fits(
    torch: Any, device: Any, shape: tuple[int, int, int], dname: str, esize: int, part: PartResult, rep: Reporter
) -> bool:
    """Whether A, B and C of ``shape`` fit in 80% of the free device memory (warns when not)."""
    m, n, k = shape
    need = (m * k + k * n + m * n) * esize
    if device.type != "cuda":
        return True
    free, _ = torch.cuda.mem_get_info(device)
    if need <= 0.8 * free:
        return True
    rep.warn(
        f"GEMM {m}x{n}x{k} {dname} skipped: needs {fmt_bytes(need)}, {fmt_bytes(free)} free on the GPU",
        part,
    )
    return False


def _time_gemm(
    torch: Any,
    device: Any,
    shape: tuple[int, int, int],
    dname: str,
    repeats: int,
    warmup: int,
    flush: Any,
    rows: list[dict[str, Any]],
) -> list[float]:
    """Time ``repeats`` calls of one GEMM after ``warmup`` (L2 flushed before each); a row per
    timed call appended to ``rows``. Returns the seconds of the timed calls."""
    m, n, k = shape
    dt = _dtype(torch, dname)
    a = torch.randn(m, k, dtype=dt, device=device)
    b = torch.randn(k, n, dtype=dt, device=device)
    c = torch.empty(m, n, dtype=dt, device=device)
    flop = 2.0 * m * n * k
    samples = []
    fp32 = dname in ("fp32", "tf32") and device.type == "cuda"
    with _tf32(torch, dname == "tf32") if fp32 else contextlib.nullcontext():
        for i in range(warmup + repeats):
            flush.zero_()
            t = timed(torch, device, partial(torch.matmul, a, b, out=c))
            if i < warmup:
                continue
            samples.append(t)
            rows.append({"kind": "gemm", "dtype": dname, "m": m, "n": n, "k": k, "rep": i - warmup,
                         "flop": flop, "time_s": t, "tflops": flop / t / 1e12})
    del a, b, c
    return samples


def measure_block(
    torch: Any,
    device: Any,
    shape: tuple[int, int, int, int, int],
    dtype: str,
    repeats: int,
    part: PartResult,
    rep: Reporter,
    warmup: int = 2,
) -> None:
    """Forward and backward time of one transformer block (SDPA attention + MLP).

    ``shape`` is (batch, seq, hidden, heads, ffn_hidden). Rows ``kind='block_fwd'`` and
    ``'block_bwd'`` (into the GEMM table) with the FLOP count used
    (:func:`offsim.calibrate.torch_block.block_flops`; backward counted as 2x forward).
    """
    from offsim.calibrate.torch_block import Block, block_flops

    device = torch.device(device)
    b, s, h, heads, f = shape
    dt = _dtype(torch, dtype)
    block = Block(h, heads, f).to(device=device, dtype=dt)
    x = torch.randn(b, s, h, device=device, dtype=dt, requires_grad=True)
    fwd_flop = block_flops(b, s, h, f)
    rows = part.rows("gemm")
    fw, bw = [], []
    out: dict[str, Any] = {}

    def forward() -> None:
        out["y"] = block(x)

    def backward() -> None:
        out["y"].backward(torch.ones_like(out["y"]))

    for i in range(warmup + repeats):
        t_f = timed(torch, device, forward)
        t_b = timed(torch, device, backward)
        block.zero_grad(set_to_none=True)
        x.grad = None
        if i < warmup:
            continue
        fw.append(t_f)
        bw.append(t_b)
        for kind, t, flop in (("block_fwd", t_f, fwd_flop), ("block_bwd", t_b, 2 * fwd_flop)):
            rows.append(_block_row(kind, dtype, shape, i - warmup, flop, t))
    rep.say(
        f"[gpu] block {dtype} b={b} s={s} h={h} f={f}: forward {median(fw) * 1e3:.2f} ms, "
        f"backward {median(bw) * 1e3:.2f} ms"
    )


def _block_row(
    kind: str, dtype: str, shape: tuple[int, int, int, int, int], repeat: int, flop: float, t: float
) -> dict[str, Any]:
    """One timed block pass as a row of the GEMM table."""
    b, s, h, heads, f = shape
    return {"kind": kind, "dtype": dtype, "batch": b, "seq": s, "hidden": h, "heads": heads, "ffn_hidden": f,
            "rep": repeat, "flop": flop, "time_s": t, "tflops": flop / t / 1e12}


def measure_hbm(
    torch: Any, device: Any, nbytes: int, repeats: int, part: PartResult, rep: Reporter, warmup: int = 2
) -> None:
    """Device-to-device copy of ``nbytes``; rate counts read + write (2 x nbytes per copy)."""
    device = torch.device(device)
    src = torch.ones(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    rows = part.rows("hbm")
    samples = []
    for i in range(warmup + repeats):
        t = timed(torch, device, lambda: dst.copy_(src))
        if i >= warmup:
            samples.append(t)
            rows.append(
                {
                    "size_bytes": nbytes,
                    "rep": i - warmup,
                    "time_s": t,
                    "bytes_moved": 2 * nbytes,
                    "gb_per_s": 2 * nbytes / t / 1e9,
                }
            )
    rep.say(
        f"[gpu] device memory copy {fmt_bytes(nbytes)}: {2 * nbytes / median(samples) / 1e9:.1f} GB/s "
        "(read + write)"
    )


def measure_pinning(torch: Any, sizes: list[int], repeats: int, part: PartResult, rep: Reporter) -> None:
    """Seconds per GiB to pin host memory.

    ``torch_pin_memory``: ``torch.empty(n, pin_memory=True)``; the blocks of one size are held
    until all repeats are done so PyTorch's caching host allocator cannot hand back a cached
    block (sizes are powers of two, so its rounding adds nothing). ``cudaHostRegister``:
    registering an already touched pageable buffer (best effort).
    """
    rows = part.rows("pinning")
    avail = available_memory_bytes()
    for size in sizes:
        if avail is not None and size * (repeats + 1) > 0.5 * avail:
            rep.warn(f"pinning {fmt_bytes(size)} skipped: not enough free host memory", part)
            continue
        held = []
        ts = []
        for r in range(repeats):
            t0 = time.perf_counter()
            held.append(torch.empty(size, dtype=torch.uint8, pin_memory=True))
            t = time.perf_counter() - t0
            ts.append(t)
            rows.append(
                {
                    "method": "torch_pin_memory",
                    "size_bytes": size,
                    "rep": r,
                    "time_s": t,
                    "s_per_gib": t / (size / GiB),
                }
            )
        del held
        _empty_host_cache(torch)
        msg = f"[gpu] pin {fmt_bytes(size)}: {median(ts) / (size / GiB):.3f} s/GiB (torch pin_memory)"
        with contextlib.suppress(Exception):
            cudart = torch.cuda.cudart()
            buf = torch.empty(size, dtype=torch.uint8)
            buf.fill_(0)
            t0 = time.perf_counter()
            err = int(cudart.cudaHostRegister(buf.data_ptr(), size, 0))
            t = time.perf_counter() - t0
            if err == 0:
                cudart.cudaHostUnregister(buf.data_ptr())
                rows.append(
                    {
                        "method": "cudaHostRegister",
                        "size_bytes": size,
                        "rep": 0,
                        "time_s": t,
                        "s_per_gib": t / (size / GiB),
                    }
                )
                msg += f", {t / (size / GiB):.3f} s/GiB (cudaHostRegister)"
            del buf
        rep.say(msg)


# ---------------------------------------------------------------------------------------------
# The part


def _fit_memory(torch: Any, device: Any, sizes: list[int], part: PartResult, rep: Reporter) -> list[int]:
    """Drop transfer sizes that would not fit in host or device memory."""
    free_dev, _ = torch.cuda.mem_get_info(device)
    avail = available_memory_bytes()
    keep = []
    for s in sorted(set(sizes)):
        if 2 * s > 0.7 * free_dev or (avail is not None and 2 * s > 0.4 * avail):
            continue
        keep.append(s)
    dropped = sorted(set(sizes) - set(keep))
    if dropped:
        rep.warn(
            f"transfer sizes {', '.join(fmt_bytes(s) for s in dropped)} skipped: not enough free "
            "host or device memory",
            part,
        )
    return keep


def run_gpu_part(settings: CalibrationSettings, rep: Reporter) -> PartResult:
    """All GPU measurements; skipped with one message when torch or CUDA is missing."""
    part = PartResult("gpu")
    torch, why = load_torch_cuda(settings.device_index)
    if torch is None:
        part.status = "skipped"
        rep.warn(why or "GPU part skipped", part)
        return part
    device = torch.device("cuda", settings.device_index)
    torch.cuda.set_device(device)
    torch.cuda.init()
    part.info = device_info(torch, settings.device_index)
    rep.say(
        f"[gpu] {part.info.get('name')} (CUDA {part.info.get('cuda')}, driver "
        f"{part.info.get('driver_version', '?')}, copy engines {part.info.get('copy_engines', '?')})"
    )
    for name, step in _gpu_steps(torch, device, settings, part, rep):
        try:
            step()
        except Exception as exc:  # one failed measurement must not stop the others
            part.degrade()
            rep.warn(f"GPU {name} measurement failed: {type(exc).__name__}: {exc}", part)
            with contextlib.suppress(Exception):
                torch.cuda.synchronize(device)
                torch.cuda.empty_cache()
    return part


def _gpu_steps(
    torch: Any, device: Any, settings: CalibrationSettings, part: PartResult, rep: Reporter
) -> list[tuple[str, Callable[[], None]]]:
    """The GPU measurements to run, in order, each as a named call; transfers only when at
    least two sizes fit in memory (a curve needs two points)."""
    s = settings
    steps: list[tuple[str, Callable[[], None]]] = []
    sizes = _fit_memory(torch, device, list(s.transfer_sizes), part, rep)
    if len(sizes) >= 2:
        steps.append(("transfers", partial(measure_transfers, torch, device, sizes, s.transfer_repeats,
                                           s.transfer_warmup, s.bidirectional, part, rep)))
    steps += [
        ("gemm", partial(measure_gemm, torch, device, list(s.gemm_shapes), list(s.gemm_dtypes), s.gemm_repeats,
                         s.gemm_warmup, part, rep, s.l2_flush_bytes)),
        ("block", partial(measure_block, torch, device, s.block_shape, s.block_dtype, s.block_repeats, part,
                          rep)),
        ("hbm", partial(measure_hbm, torch, device, s.hbm_bytes, s.transfer_repeats, part, rep)),
        ("pinning", partial(measure_pinning, torch, list(s.pin_sizes), s.pin_repeats, part, rep)),
    ]
    return steps
