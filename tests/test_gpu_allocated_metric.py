"""The GPU peak as torch's ``max_memory_allocated`` reads it (issue 23): the DataStates logs'
Max_MA excludes the memory outside PyTorch's pool (CUDA context, allocator slack) that offsim's
``peak_bytes.gpu`` counts from the start (../shared/reference/gpu_memory.md, the counters' table)."""

from __future__ import annotations

from offsim import make_run_config, simulate
from offsim.core.units import GiB
from offsim.validation import MetricKind, default_cases_path, load_cases, metric_kind, metric_value


def test_allocated_is_the_peak_less_the_profiles_reserve() -> None:
    cfg = make_run_config("rtx4090-pcie4-ws", "tiny", "zero-offload", iterations=2)
    metrics = simulate(cfg).metrics
    reserved = cfg.hardware.gpu.reserved_gib * GiB
    assert reserved > 0
    assert metric_value(metrics, "peak_bytes.gpu_allocated", cfg) == metrics.peak_bytes.gpu - reserved
    assert metric_kind("peak_bytes.gpu_allocated") is MetricKind.GPU_MEMORY


def test_cases_read_from_max_memory_allocated_compare_allocated_bytes() -> None:
    """Every GPU figure whose notes say it is torch's max_memory_allocated is compared as such."""
    for case in load_cases(default_cases_path()):
        for m in case.measures:
            if "max_memory_allocated" in m.notes:
                assert m.metric == "peak_bytes.gpu_allocated", case.id
