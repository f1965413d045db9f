"""Calibration harness: fits, bad inputs, file outputs, the profile round trip, the real trainer.

Everything runs on the CPU with tiny sizes; torch-dependent tests skip without torch, and the
CUDA test skips without a GPU. No assertion depends on how fast this machine is.
"""

from __future__ import annotations

import csv
import errno
import json
import os
import shutil
import sys
from collections import namedtuple
from pathlib import Path

import numpy as np
import pytest

from offsim.calibrate import (
    CalibrationSettings,
    PartResult,
    detect_write_cache,
    fit_latency_bandwidth,
    run_calibration,
)
from offsim.calibrate import gpu as gpu_mod
from offsim.calibrate import nvme as nvme_mod
from offsim.calibrate.common import Reporter
from offsim.calibrate.fit import duplex_efficiency, fit_nvme, fit_transfers, gemm_efficiency_points
from offsim.config.loading import load_profile
from offsim.errors import ConfigError
from offsim.units import GiB, KiB, MiB

TINY = CalibrationSettings.preset(
    True,
    transfer_sizes=(4 * KiB, 64 * KiB),
    cpu_optimizer_params=2**16,
    cpu_optimizer_chunk=2**14,
    cpu_optimizer_steps=2,
    memcpy_bytes=1 * MiB,
    memcpy_repeats=2,
    nvme_file_bytes=2 * MiB,
    nvme_block_sizes=(64 * KiB, 256 * KiB),
    nvme_queue_depths=(1, 2),
    nvme_point_seconds=2.0,
    sustained_seconds=0.2,
    sustained_window_s=0.05,
    sustained_idle_s=0.0,
    use_fio=False,
    free_disk_margin_bytes=1 * MiB,
)


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def _csv(path: Path) -> list[dict[str, str]]:
    with path.open() as fh:
        return list(csv.DictReader(fh))


# ---------------------------------------------------------------------------------------------
# Fits


SIZES = [4 * KiB * 4**i for i in range(10)]  # 4 KiB .. 1 GiB


def test_fit_recovers_latency_and_bandwidth_exactly():
    lat, bw = 12e-6, 24.5e9
    times = [lat + s / bw for s in SIZES]
    fit = fit_latency_bandwidth(SIZES, times)
    assert fit.latency_s == pytest.approx(lat, rel=1e-9)
    assert fit.bandwidth_bytes_per_s == pytest.approx(bw, rel=1e-9)
    assert fit.rms_rel_error < 1e-9 and fit.max_rel_error < 1e-9
    assert fit.latency_us == pytest.approx(12.0) and fit.bandwidth_gb_per_s == pytest.approx(24.5)
    assert len(fit.residuals) == len(SIZES) and fit.note == ""


def test_fit_with_noise_reports_residuals():
    rng = np.random.default_rng(0)
    lat, bw = 20e-6, 12e9
    times = [(lat + s / bw) * (1 + 0.03 * rng.standard_normal()) for s in SIZES]
    fit = fit_latency_bandwidth(SIZES, times)
    assert fit.latency_s == pytest.approx(lat, rel=0.1)
    assert fit.bandwidth_bytes_per_s == pytest.approx(bw, rel=0.1)
    assert 0.005 < fit.rms_rel_error < 0.1  # the noise shows up, it is not hidden
    assert fit.max_rel_error >= fit.rms_rel_error
    worst = max(abs(r["rel_error"]) for r in fit.residuals)
    assert worst == pytest.approx(fit.max_rel_error)
    assert "RMS" in fit.summary()


def test_fit_clamps_negative_latency_and_rejects_bad_input():
    # times below the pure-bandwidth line at small sizes drive the intercept negative
    times = [s / 10e9 * (0.5 if s < 1e5 else 1.0) for s in SIZES]
    fit = fit_latency_bandwidth(SIZES, times)
    assert fit.latency_s == 0.0 and "clamped" in fit.note
    assert fit.bandwidth_bytes_per_s > 0
    with pytest.raises(ValueError, match="two distinct sizes"):
        fit_latency_bandwidth([1024, 1024], [1e-6, 1e-6])
    with pytest.raises(ValueError, match="positive"):
        fit_latency_bandwidth([1024, 2048], [1e-6, -1e-6])


def _transfer_rows(lat: float, bw: float, direction: str, memory: str, concurrency: str = "alone"):
    return [
        {
            "direction": direction,
            "memory": memory,
            "concurrency": concurrency,
            "size_bytes": s,
            "rep": r,
            "device_time_s": (lat + s / bw) * (1 + 0.001 * r),
            "host_wall_s": 0.0,
            "gb_per_s": 0.0,
        }
        for s in SIZES
        for r in range(3)
    ]


def test_fit_transfers_and_duplex_efficiency():
    rows = (
        _transfer_rows(10e-6, 25e9, "h2d", "pinned")
        + _transfer_rows(10e-6, 25e9 * 0.8, "h2d", "pinned", "bidir")
        + _transfer_rows(10e-6, 20e9, "d2h", "pinned")
        + _transfer_rows(10e-6, 20e9 * 0.9, "d2h", "pinned", "bidir")
    )
    fits = fit_transfers(rows)
    assert set(fits) == {"h2d/pinned/alone", "h2d/pinned/bidir", "d2h/pinned/alone", "d2h/pinned/bidir"}
    assert fits["h2d/pinned/alone"].fit.bandwidth_gb_per_s == pytest.approx(25.0, rel=1e-3)
    assert fits["h2d/pinned/alone"].fit.latency_us == pytest.approx(10.0, rel=1e-2)
    pts = fits["d2h/pinned/alone"].points
    assert [p[0] for p in pts] == sorted(p[0] for p in pts) and len(pts) == len(SIZES)
    assert duplex_efficiency(fits) == pytest.approx(0.85, rel=1e-2)


def test_gemm_efficiency_points():
    rows = []
    for n, frac in ((512, 0.2), (2048, 0.6), (8192, 0.8)):
        flop = 2.0 * n**3
        rows += [
            {"kind": "gemm", "dtype": "bf16", "m": n, "n": n, "k": n, "time_s": flop / (frac * 100e12)}
        ] * 3
    pts, msgs = gemm_efficiency_points(rows, 100.0, "bf16")
    assert [round(p[1], 6) for p in pts] == [0.2, 0.6, 0.8]
    assert pts[0][0] == pytest.approx(2 * 512**3 / 1e9) and msgs == []
    pts, msgs = gemm_efficiency_points(rows, 10.0, "bf16")  # a peak ten times too low
    assert max(p[1] for p in pts) == 1.2 and msgs and "peak is probably wrong" in msgs[0]


def _windows(rates_and_counts, dt=0.5):
    out = []
    for rate, count in rates_and_counts:
        out += [{"bytes": rate * 1e9 * dt, "gb_per_s": rate}] * count
    return out


def test_detect_write_cache():
    res = detect_write_cache(_windows([(4.0, 10), (1.0, 10)]))
    assert res["drop"] and res["early_gb_per_s"] == 4.0 and res["late_gb_per_s"] == 1.0
    assert res["cache_bytes"] == pytest.approx(10 * 4e9 * 0.5)
    flat = detect_write_cache(_windows([(3.0, 20)]))
    assert not flat["drop"] and flat["cache_bytes"] is None
    assert not detect_write_cache(_windows([(3.0, 2)]))["drop"]


def test_fit_nvme_per_drive_and_latency():
    rows = []
    for bs in (128 * KiB, 1 * MiB):
        t_req = 50e-6 + bs / 2e9
        rows.append(
            {
                "phase": "sweep",
                "op": "read",
                "block_bytes": bs,
                "queue_depth": 1,
                "bytes": 100 * bs,
                "time_s": 100 * t_req,
                "gb_per_s": bs / t_req / 1e9,
                "tool": "offsim",
            }
        )
    rows.append(
        {
            "phase": "sweep",
            "op": "read",
            "block_bytes": MiB,
            "queue_depth": 8,
            "bytes": GiB,
            "time_s": GiB / 6e9,
            "gb_per_s": 6.0,
            "tool": "offsim",
        }
    )
    rows.append(
        {
            "phase": "sweep",
            "op": "write",
            "block_bytes": MiB,
            "queue_depth": 8,
            "bytes": GiB,
            "time_s": GiB / 4e9,
            "gb_per_s": 4.0,
            "tool": "offsim",
        }
    )
    rows += [dict(w, phase="sustained", op="write") for w in _windows([(4.0, 10), (1.0, 10)])]
    fit = fit_nvme(rows, drives=2)
    assert fit["read"]["per_drive_gb_per_s"] == pytest.approx(3.0)
    assert fit["write"]["per_drive_gb_per_s"] == pytest.approx(2.0)
    assert fit["latency"]["latency_us"] == pytest.approx(50.0, rel=1e-6)
    assert fit["sustained"]["post_cache_per_drive_gb_per_s"] == pytest.approx(0.5)
    assert fit["sustained"]["cache_per_drive_gb"] == pytest.approx(10.0)


# ---------------------------------------------------------------------------------------------
# NVMe helpers


def test_mount_detection_from_proc_mounts_text():
    text = "\n".join(
        [
            "/dev/vda / ext4 rw 0 0",
            "tmpfs /dev/shm tmpfs rw 0 0",
            "/dev/nvme0n1p1 /mnt/fast\\040disk xfs rw 0 0",
            "/dev/zram0 /mnt/zr ext4 rw 0 0",
        ]
    )
    assert nvme_mod.mount_of(Path("/dev/shm/x"), text)["fstype"] == "tmpfs"
    fast = nvme_mod.mount_of(Path("/mnt/fast disk/calib"), text)
    assert fast["mount_point"] == "/mnt/fast disk" and fast["fstype"] == "xfs"
    assert nvme_mod.mount_of(Path("/mnt/fastdisk"), text)["mount_point"] == "/"
    assert nvme_mod.ram_backed(nvme_mod.mount_of(Path("/dev/shm"), text))
    assert nvme_mod.ram_backed(nvme_mod.mount_of(Path("/mnt/zr/a"), text))
    assert not nvme_mod.ram_backed(fast)


FIO_JSON = """fio: some warning printed before the JSON
{"fio version": "fio-3.33", "jobs": [{"jobname": "offsim-calibrate",
  "read": {"io_bytes": 1073741824, "bw_bytes": 2147483648, "runtime": 500},
  "write": {"io_bytes": 0, "bw_bytes": 0, "runtime": 0}}]}
"""


def test_parse_fio_json():
    nbytes, secs = nvme_mod.parse_fio_json(FIO_JSON, "read")
    assert nbytes == GiB and secs == pytest.approx(0.5)
    with pytest.raises(nvme_mod.FioError):
        nvme_mod.parse_fio_json(FIO_JSON, "write")
    with pytest.raises(nvme_mod.FioError):
        nvme_mod.parse_fio_json("not json at all", "read")


def test_run_io_reads_and_writes(tmp_path):
    path = tmp_path / "f.bin"
    bf = nvme_mod.open_test_file(path)
    try:
        w = nvme_mod.run_io(bf.fd, "write", 64 * KiB, 2, MiB, MiB, 30.0, direct=bf.direct)
        r = nvme_mod.run_io(bf.fd, "read", 64 * KiB, 3, MiB, MiB, 30.0, direct=bf.direct)
        assert w["bytes"] == MiB and r["bytes"] == MiB
        s = nvme_mod.run_io(
            bf.fd, "write", 64 * KiB, 2, MiB, float("inf"), 0.15, wrap=True, direct=bf.direct, window_s=0.05
        )
        assert s["bytes"] > 0 and len(s["windows"]) >= 1
        assert all(end > start for start, end, _ in s["windows"])
    finally:
        bf.close()
        path.unlink()


# ---------------------------------------------------------------------------------------------
# The harness end to end (CPU only)


def test_harness_end_to_end_without_gpu_or_base(tmp_path):
    if _cuda_available():
        pytest.skip("this test checks the path without CUDA")
    disk = tmp_path / "disk"
    disk.mkdir()
    lines: list[str] = []
    report = run_calibration(
        tmp_path / "out", name="box", nvme_dir=disk, settings=TINY, progress=lines.append
    )
    assert report.parts["gpu"].status == "skipped"
    gpu_msgs = [m for m in report.messages if m.startswith("GPU part skipped")]
    assert len(gpu_msgs) == 1 and (
        "PyTorch is not installed" in gpu_msgs[0] or "no CUDA device" in gpu_msgs[0]
    )
    assert report.parts["cpu"].status == "ok" and report.parts["nvme"].status == "ok"
    out = tmp_path / "out"
    assert (out / "raw_cpu.csv").exists() and (out / "raw_nvme.csv").exists() and (out / "fits.json").exists()
    assert not (out / "raw_transfers.csv").exists()
    cpu_rows = _csv(out / "raw_cpu.csv")
    assert {"time_s", "params_per_s", "gb_per_s", "bytes"} <= set(cpu_rows[0])
    nvme_rows = _csv(out / "raw_nvme.csv")
    assert {"block_bytes", "queue_depth", "time_s", "gb_per_s"} <= set(nvme_rows[0])
    assert {r["phase"] for r in nvme_rows} >= {"layout", "sweep"}
    # no profile without GPU numbers: nothing invented, and said so
    assert not report.complete and report.profile_path is None and not (out / "box.yaml").exists()
    assert any("No complete profile could be written" in m for m in report.messages)
    fits = json.loads((out / "fits.json").read_text())
    assert fits["profile"]["written"] is False and "gpu.model" in fits["profile"]["missing"]
    assert "cpu" in fits["fits"] and "nvme" in fits["fits"]
    assert fits["profile"]["partial_profile"]["cpu"]["optimizer_params_per_s"] > 0
    assert list(disk.iterdir()) == []  # the test file is gone
    assert any(line.startswith("[cpu]") for line in lines) and any(
        line.startswith("[nvme]") for line in lines
    )


def test_profile_with_base_round_trips(tmp_path):
    base = load_profile("tiny")
    report = run_calibration(tmp_path, base_profile=base, name="tiny-measured", parts={"cpu"}, settings=TINY)
    assert report.complete and report.profile_path == tmp_path / "tiny-measured.yaml"
    loaded = load_profile(str(report.profile_path))
    assert loaded == report.profile
    assert loaded.name == "tiny-measured"
    assert loaded.provenance.kind == "mixed"
    assert loaded.gpu == base.gpu and loaded.host_link == base.host_link  # not measured: from the base
    assert loaded.cpu.optimizer_params_per_s > 0 and loaded.cpu.memcpy_gb_per_s > 0
    assert loaded.cpu.optimizer_impl in ("torch-adamw-foreach", "numpy-adamw", "deepspeed-cpu-adam")
    notes = loaded.provenance.notes or ""
    assert "measured: cpu.*" in notes and "base:" in notes and "gpu.*" in notes
    assert report.origins["cpu.optimizer_params_per_s"] == "measured"
    assert report.origins["cpu.page_touch_gb_per_s"] == "measured"  # fresh 64 MiB mappings, filled twice (cpu.py)
    assert report.origins["gpu.peak_tflops.bf16"] == "base"
    assert loaded.nvme == base.nvme  # NVMe part not requested: the base's drive stays


def _fake_gpu_part(settings, rep):
    """What run_gpu_part returns on a GPU, with synthetic numbers (H100-like)."""
    part = PartResult("gpu")
    part.info = {
        "name": "NVIDIA H100 80GB HBM3",
        "total_memory": 80 * GiB,
        "copy_engines": 3,
        "pcie_gen_max": 5,
        "pcie_width_max": 16,
        "driver_version": "999.1",
    }
    rows = part.rows("transfers")
    rows += _transfer_rows(8e-6, 50e9, "h2d", "pinned") + _transfer_rows(8e-6, 40e9, "h2d", "pinned", "bidir")
    rows += _transfer_rows(8e-6, 50e9, "d2h", "pinned") + _transfer_rows(8e-6, 40e9, "d2h", "pinned", "bidir")
    rows += _transfer_rows(30e-6, 12e9, "h2d", "pageable") + _transfer_rows(30e-6, 10e9, "d2h", "pageable")
    for n, frac in ((512, 0.1), (2048, 0.5), (8192, 0.8)):
        flop = 2.0 * n**3
        part.rows("gemm").append(
            {
                "kind": "gemm",
                "dtype": "bf16",
                "m": n,
                "n": n,
                "k": n,
                "rep": 0,
                "flop": flop,
                "time_s": flop / (frac * 989e12),
                "tflops": frac * 989,
            }
        )
    part.rows("hbm").append(
        {"size_bytes": GiB, "rep": 0, "time_s": 2 * GiB / 3e12, "bytes_moved": 2 * GiB, "gb_per_s": 3000.0}
    )
    return part


def test_profile_from_gpu_measurements_without_base(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu_mod, "run_gpu_part", _fake_gpu_part)
    report = run_calibration(tmp_path, name="h100-box", parts={"gpu", "cpu"}, settings=TINY)
    assert report.complete, report.messages
    p = load_profile(str(report.profile_path))
    assert p.gpu.model == "NVIDIA H100 80GB HBM3" and p.gpu.copy_engines == 3
    assert p.gpu.peak_tflops["bf16"] == 989.0  # datasheet table, flagged as such
    assert report.origins["gpu.peak_tflops"] == "datasheet" and p.provenance.kind == "mixed"
    assert [round(f, 3) for _, f in p.gpu.gemm_efficiency] == [0.1, 0.5, 0.8]
    assert p.host_link.h2d.pinned.bandwidth_gb_per_s == pytest.approx(50.0, rel=1e-2)
    assert p.host_link.h2d.pinned.latency_us == pytest.approx(8.0, rel=0.05)
    assert p.host_link.d2h.pageable.bandwidth_gb_per_s == pytest.approx(10.0, rel=1e-2)
    assert p.host_link.h2d.pinned.points is not None and len(p.host_link.h2d.pinned.points) == len(SIZES)
    assert p.host_link.duplex_efficiency == pytest.approx(0.8, rel=1e-2)
    assert p.host_link.generation == 5 and p.host_link.lanes == 16
    assert p.gpu.hbm_bandwidth_gb_per_s == pytest.approx(3000.0)
    assert p.nvme is None
    assert (tmp_path / "raw_transfers.csv").exists() and (tmp_path / "raw_gemm.csv").exists()
    fits = json.loads((tmp_path / "fits.json").read_text())
    h2d = fits["fits"]["transfers"]["h2d/pinned/alone"]["fit"]
    assert {"rms_rel_error", "max_rel_error", "residuals"} <= set(h2d)


def test_bad_name_and_parts():
    with pytest.raises(ConfigError, match="profile name"):
        run_calibration(Path("/nonexistent"), name="Bad Name", settings=TINY)
    with pytest.raises(ConfigError, match="unknown calibration part"):
        run_calibration(Path("/nonexistent"), parts={"gpu", "tpu"}, settings=TINY)


# ---------------------------------------------------------------------------------------------
# Bad NVMe targets: one message each, the rest of the harness still runs


def _nvme_messages(report) -> list[str]:
    return report.parts["nvme"].messages


def test_nvme_no_write_permission(tmp_path, monkeypatch):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        if os.access(ro, os.W_OK):  # running as root: modes do not stop writes, pretend they do
            real_access = os.access

            def access(path, mode, *a, **k):
                if Path(path) == ro and mode & os.W_OK:
                    return False
                return real_access(path, mode, *a, **k)

            monkeypatch.setattr(os, "access", access)
        report = run_calibration(tmp_path / "out", nvme_dir=ro, parts={"cpu", "nvme"}, settings=TINY)
    finally:
        ro.chmod(0o755)
    msgs = _nvme_messages(report)
    assert len(msgs) == 1 and "no write permission" in msgs[0]
    assert report.parts["nvme"].status == "skipped" and report.parts["cpu"].status == "ok"
    assert (tmp_path / "out" / "raw_cpu.csv").exists() and list(ro.iterdir()) == []


def test_nvme_permission_denied_on_create(tmp_path, monkeypatch):
    real_open = os.open

    def deny(path, flags, *a, **k):
        if nvme_mod.TEST_FILE_PREFIX in str(path):
            raise PermissionError(errno.EACCES, "Permission denied")
        return real_open(path, flags, *a, **k)

    monkeypatch.setattr(os, "open", deny)
    report = run_calibration(tmp_path / "out", nvme_dir=tmp_path, parts={"nvme"}, settings=TINY)
    msgs = _nvme_messages(report)
    assert len(msgs) == 1 and "no write permission" in msgs[0]


def test_nvme_ram_backed_target(tmp_path):
    shm = Path("/dev/shm")
    mount = nvme_mod.mount_of(shm)
    if not shm.is_dir() or not nvme_mod.ram_backed(mount) or not os.access(shm, os.W_OK):
        pytest.skip("/dev/shm is not a writable tmpfs here")
    before = set(shm.iterdir())
    report = run_calibration(tmp_path / "out", nvme_dir=shm, parts={"cpu", "nvme"}, settings=TINY)
    msgs = _nvme_messages(report)
    assert len(msgs) == 1 and "RAM-backed" in msgs[0] and "would measure RAM" in msgs[0]
    assert report.parts["cpu"].status == "ok"
    assert set(shm.iterdir()) == before


def test_nvme_too_little_disk(tmp_path, monkeypatch):
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage(10 * GiB, 10 * GiB - 4096, 4096))
    report = run_calibration(tmp_path / "out", nvme_dir=tmp_path, parts={"cpu", "nvme"}, settings=TINY)
    msgs = _nvme_messages(report)
    assert len(msgs) == 1 and "too little free disk" in msgs[0]
    assert report.parts["nvme"].status == "skipped" and report.parts["cpu"].status == "ok"
    assert not list(tmp_path.glob(f"{nvme_mod.TEST_FILE_PREFIX}*"))


def test_nvme_missing_folder_and_no_folder(tmp_path):
    report = run_calibration(tmp_path / "out", nvme_dir=tmp_path / "nope", parts={"nvme"}, settings=TINY)
    assert "does not exist" in _nvme_messages(report)[0]
    report = run_calibration(tmp_path / "out", nvme_dir=None, parts={"nvme"}, settings=TINY)
    assert "--nvme-dir" in _nvme_messages(report)[0]


def test_nvme_without_o_direct_falls_back(tmp_path, monkeypatch):
    monkeypatch.setattr(nvme_mod, "direct_io_flag", lambda: None)
    disk = tmp_path / "disk"
    disk.mkdir()
    report = run_calibration(tmp_path / "out", nvme_dir=disk, parts={"nvme"}, settings=TINY)
    msgs = _nvme_messages(report)
    assert len(msgs) == 1 and "O_DIRECT" in msgs[0] and "buffered" in msgs[0]
    assert report.parts["nvme"].status == "ok"
    rows = report.parts["nvme"].rows("nvme")
    assert rows and all(r["direct_io"] is False for r in rows)
    assert list(disk.iterdir()) == []


def test_nvme_o_direct_refused_by_file_system(tmp_path, monkeypatch):
    flag = nvme_mod.direct_io_flag()
    if flag is None:
        pytest.skip("no O_DIRECT on this platform")
    real_open = os.open

    def refuse(path, flags, *a, **k):
        if flags & flag:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(path, flags, *a, **k)

    monkeypatch.setattr(os, "open", refuse)
    disk = tmp_path / "disk"
    disk.mkdir()
    report = run_calibration(tmp_path / "out", nvme_dir=disk, parts={"nvme"}, settings=TINY)
    msgs = _nvme_messages(report)
    assert len(msgs) == 1 and "refused O_DIRECT" in msgs[0]
    assert list(disk.iterdir()) == []


def test_nvme_test_file_removed_after_failure(tmp_path, monkeypatch):
    def boom(*a, **k):
        raise RuntimeError("disk fell off")

    monkeypatch.setattr(nvme_mod, "_sustained", boom)
    disk = tmp_path / "disk"
    disk.mkdir()
    report = run_calibration(tmp_path / "out", nvme_dir=disk, parts={"nvme"}, settings=TINY)
    assert report.parts["nvme"].status == "partial"
    assert any("disk fell off" in m for m in _nvme_messages(report))
    assert list(disk.iterdir()) == []
    assert (tmp_path / "out" / "raw_nvme.csv").exists()  # what was measured before is kept


@pytest.mark.skipif(shutil.which("fio") is None, reason="fio is not installed")
def test_nvme_with_fio(tmp_path):
    import dataclasses

    disk = tmp_path / "disk"
    disk.mkdir()
    settings = dataclasses.replace(TINY, use_fio=True)
    report = run_calibration(tmp_path / "out", nvme_dir=disk, parts={"nvme"}, settings=settings)
    rows = [r for r in report.parts["nvme"].rows("nvme") if r["phase"] == "sweep"]
    # fio either measured every point, or failed once (message) and offsim's reader took over
    assert {r["tool"] for r in rows} == {"fio"} or any("fio failed" in m for m in _nvme_messages(report))
    assert list(disk.iterdir()) == []


# ---------------------------------------------------------------------------------------------
# CPU part without torch, numpy AdamW, torch paths on the CPU


def test_cpu_part_without_torch_uses_numpy(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` now raises ImportError
    report = run_calibration(
        tmp_path, parts={"gpu", "cpu"}, settings=TINY, base_profile=load_profile("tiny"), name="np"
    )
    assert "PyTorch is not installed" in report.parts["gpu"].messages[0]
    assert any("numpy AdamW" in m for m in report.parts["cpu"].messages)
    impls = {r["impl"] for r in report.parts["cpu"].rows("cpu") if r["kind"] == "optimizer"}
    assert impls == {"numpy-adamw"}
    assert report.complete and report.profile.cpu.optimizer_impl == "numpy-adamw"
    assert "numpy AdamW" in report.profile.provenance.notes


def test_numpy_adamw_matches_torch():
    torch = pytest.importorskip("torch")
    from offsim.calibrate.cpu import NumpyAdamW

    rng = np.random.default_rng(1)
    p0 = [rng.standard_normal(1000).astype(np.float32), rng.standard_normal(37).astype(np.float32)]
    grads = [[rng.standard_normal(a.shape).astype(np.float32) for a in p0] for _ in range(3)]
    mine = NumpyAdamW([a.copy() for a in p0], threads=2)
    tp = [torch.nn.Parameter(torch.from_numpy(a.copy())) for a in p0]
    opt = torch.optim.AdamW(
        tp, lr=mine.lr, betas=mine.betas, eps=mine.eps, weight_decay=mine.wd, foreach=True
    )
    for g in grads:
        mine.step(g)
        for p, gi in zip(tp, g, strict=True):
            p.grad = torch.from_numpy(gi.copy())
        opt.step()
    for a, p in zip(mine.params, tp, strict=True):
        np.testing.assert_allclose(a, p.detach().numpy(), rtol=1e-5, atol=1e-6)


def test_torch_cpu_optimizer_and_compute_timers():
    torch = pytest.importorskip("torch")
    from offsim.calibrate.cpu import measure_torch_adamw

    rep, part = Reporter(None), PartResult("x")
    measure_torch_adamw(torch, 5000, 2000, 2, part, rep)
    rows = part.rows("cpu")
    assert len(rows) == 2 and all(r["impl"] == "torch-adamw-foreach" and r["params_per_s"] > 0 for r in rows)
    gpu_mod.measure_gemm(torch, "cpu", [(32, 48, 16), (64, 64, 64)], ["fp32"], 2, 1, part, rep)
    gemm = [r for r in part.rows("gemm") if r["kind"] == "gemm"]
    assert len(gemm) == 4 and gemm[0]["flop"] == 2 * 32 * 48 * 16
    gpu_mod.measure_block(torch, "cpu", (1, 16, 32, 4, 64), "fp32", 2, part, rep, warmup=1)
    kinds = [r["kind"] for r in part.rows("gemm")]
    assert kinds.count("block_fwd") == 2 and kinds.count("block_bwd") == 2
    gpu_mod.measure_hbm(torch, "cpu", 1 << 16, 2, part, rep, warmup=1)
    assert len(part.rows("hbm")) == 2


def test_known_peaks():
    assert gpu_mod.known_peak_tflops("NVIDIA H100 PCIe")["bf16"] == 756.0
    assert gpu_mod.known_peak_tflops("NVIDIA H100 80GB HBM3")["bf16"] == 989.0
    assert gpu_mod.known_peak_tflops("NVIDIA A100-SXM4-80GB")["bf16"] == 312.0
    assert gpu_mod.known_peak_tflops("Some Future GPU") is None


# ---------------------------------------------------------------------------------------------
# The real offloaded trainer (CPU mechanics)


def test_real_trainer_matches_dense_reference():
    torch = pytest.importorskip("torch")
    from offsim.calibrate.real_trainer import ADAMW, OffloadedTrainer, RealShape, build_blocks, make_input

    shape = RealShape(layers=3, hidden=32, heads=4, ffn_hidden=64, seq_len=16, micro_batch=2)
    trainer = OffloadedTrainer(shape, device="cpu", dtype="fp32", seed=3)
    x = make_input(shape)
    for _ in range(2):
        trainer.iteration(x)
    # every layer's device buffer is released after the step
    assert all(L.gbuf.untyped_storage().nbytes() == 0 for L in trainer.layers)

    ref = torch.nn.Sequential(*build_blocks(shape, seed=3))
    opt = torch.optim.AdamW(ref.parameters(), foreach=True, **ADAMW)
    for _ in range(2):
        opt.zero_grad()
        ref(x).pow(2).mean().backward()
        opt.step()
    for master, block in zip(trainer.master_params(), ref, strict=True):
        flat = torch.cat([p.detach().reshape(-1) for p in block.parameters()])
        torch.testing.assert_close(master, flat, rtol=1e-4, atol=1e-5)


def test_run_real_training_on_cpu():
    pytest.importorskip("torch")
    from offsim.calibrate import RealShape, run_real_training

    res = run_real_training(
        RealShape(layers=2, hidden=32, heads=2, ffn_hidden=64, seq_len=8),
        device="cpu",
        iterations=2,
        warmup=1,
    )
    for key in ("forward_s", "backward_s", "optimizer_s", "iteration_s", "loss"):
        assert len(res[key]) == 2
    assert all(t > 0 for t in res["forward_s"] + res["backward_s"] + res["optimizer_s"])
    assert res["device"] == "cpu" and res["pinned"] is False and res["prefetch_depth"] == 1
    assert res["params"] > 0 and all(np.isfinite(res["loss"]))


def test_real_shape_from_workload():
    from offsim.calibrate import RealShape
    from offsim.config.loading import load_workload

    shape = RealShape.from_workload(load_workload("tiny"), layers=1)
    assert (shape.layers, shape.hidden, shape.heads, shape.ffn_hidden, shape.seq_len) == (
        1,
        1024,
        8,
        4096,
        512,
    )


# ---------------------------------------------------------------------------------------------
# On a GPU


@pytest.mark.gpu
def test_gpu_part_on_cuda(tmp_path):
    if not _cuda_available():
        pytest.skip("needs CUDA")
    import dataclasses

    from offsim.calibrate.real_trainer import RealShape, run_real_training

    settings = dataclasses.replace(
        TINY,
        transfer_sizes=(4 * KiB, 64 * KiB, 1 * MiB, 16 * MiB),
        gemm_shapes=((512, 512, 512), (2048, 2048, 2048)),
        block_shape=(1, 256, 512, 8, 2048),
        hbm_bytes=64 * MiB,
        pin_sizes=(16 * MiB,),
        pin_repeats=2,
        l2_flush_bytes=64 * MiB,
    )
    report = run_calibration(
        tmp_path, name="gpu-box", parts={"gpu", "cpu"}, settings=settings, base_profile=load_profile("tiny")
    )
    gpu = report.parts["gpu"]
    assert gpu.status == "ok", gpu.messages
    assert {"transfers", "gemm", "hbm", "pinning"} <= set(gpu.tables)
    concurrency = {r["concurrency"] for r in gpu.rows("transfers")}
    assert concurrency == {"alone", "bidir"}
    assert report.complete and load_profile(str(report.profile_path)).gpu.model == gpu.info["name"]
    res = run_real_training(
        RealShape(layers=3, hidden=256, heads=4, ffn_hidden=1024, seq_len=128), device="cuda", iterations=2
    )
    assert res["pinned"] is True and len(res["iteration_s"]) == 2
