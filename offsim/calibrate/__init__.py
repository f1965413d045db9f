"""Calibration harness: measure a real machine and fit a hardware profile.

Entry point: :func:`run_calibration` (the ``offsim calibrate`` command calls it). Parts:

* ``gpu`` (:mod:`offsim.calibrate.gpu`, needs PyTorch with CUDA): host<->device copies by size,
  pinned and pageable, alone and bidirectional; GEMM; one transformer block forward/backward;
  device memory copy; cost of pinning host memory; copy engines and PCIe link.
* ``cpu`` (:mod:`offsim.calibrate.cpu`): optimizer step throughput (torch AdamW, DeepSpeed
  CPU-Adam when importable, numpy AdamW without torch) and memcpy bandwidth.
* ``nvme`` (:mod:`offsim.calibrate.nvme`): O_DIRECT sequential read/write sweep (fio when on
  PATH) and a sustained write that shows a write-cache drop.

Fits (:mod:`offsim.calibrate.fit`) keep their residuals; :mod:`offsim.calibrate.profile_writer`
builds the profile from the fits and an optional base profile and writes ``<name>.yaml``,
``raw_*.csv`` and ``fits.json``. :mod:`offsim.calibrate.real_trainer` runs a real offloaded
training loop (ZeRO-Infinity CPU style) to compare with the simulator.

PyTorch is optional everywhere: it is imported inside the functions that need it.
"""

from offsim.calibrate.common import PARTS, TABLE_FILES, CalibrationSettings, PartResult
from offsim.calibrate.fit import LatBwFit, detect_write_cache, fit_latency_bandwidth
from offsim.calibrate.harness import CalibrationReport, run_calibration
from offsim.calibrate.real_trainer import RealShape, run_real_training

__all__ = [
    "PARTS",
    "TABLE_FILES",
    "CalibrationReport",
    "CalibrationSettings",
    "LatBwFit",
    "PartResult",
    "RealShape",
    "detect_write_cache",
    "fit_latency_bandwidth",
    "run_calibration",
    "run_real_training",
]
