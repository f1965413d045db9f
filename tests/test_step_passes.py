"""DeepSpeed's host passes around CPU Adam (issue 23 part 1), and the fused step + copy of old
releases as the strategy input ``lp_copy``.

Sources: ``../shared/reference/deepspeed_runtime.md`` section 4 (ZeRO-1/2 ``step``: unscale
8 B/elem, Adam, fp32 -> 16-bit cast 6 B/elem, H2D 2 B/elem), section 11 step 4 (ZeRO-3 per
sub-group: unscale always, Adam, cast) and 14.1 / 14.10 (``z12_fused_adam_copy``: v0.3.0-v0.8.3,
fp16 ZeRO-1/2, the GPU reads the fp32 master over PCIe, 4 B/elem, no CPU cast).
The hand-computed timeline with the passes is ``tests/test_timelines.py::test_transfer_bound_layers``.
"""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from offsim import load_strategy, load_workload, make_run_config, simulate
from offsim.errors import ConfigError
from offsim.results import RunResult

ZERO2 = load_strategy("zero-offload")


def _fp16(name: str) -> object:
    wl = load_workload(name)
    pr = wl.precision.model_copy(update={"compute": "fp16", "params": "fp16", "grads": "fp16"})
    return wl.model_copy(update={"precision": pr})


def _run(lp_copy: str, system: str = "zero-offload") -> RunResult:
    st = ZERO2.model_validate({**ZERO2.model_dump(), "lp_copy": lp_copy, "system": system})
    r = simulate(make_run_config("tiny", _fp16("tiny"), st))
    assert r.metrics.feasible, r.metrics.infeasible_reason
    return r


def _names(r: RunResult, prefix: str) -> list[str]:
    return [s.name for s in r.recorder.spans if s.name.startswith(prefix)]


def test_the_separate_cast_runs_unscale_adam_cast_per_sub_group_in_order() -> None:
    r = _run("separate_cast")
    step = [s.name.split(",")[0].split(" sub-group")[0] for s in sorted(r.recorder.spans, key=lambda s: s.start_s)
            if "sub-group 0" in s.name and s.resource in ("cpu", "dram_copy")]
    assert step[:3] == ["unscale gradients", "CPU Adam", "cast to 16-bit"]


def test_the_fused_copy_has_no_cpu_cast_and_uploads_the_fp32_master() -> None:
    """Fused (v0.3.0-v0.8.3): the unscale stays, the CPU cast goes, and the update upload
    carries 4 B per parameter instead of 2 (the GPU reads the fp32 tiles itself)."""
    separate, fused = _run("separate_cast"), _run("fused_zero_copy")
    assert _names(fused, "unscale") and not _names(fused, "cast to 16-bit")
    assert _names(separate, "cast to 16-bit")
    assert fused.metrics.traffic_bytes.h2d == pytest.approx(2 * separate.metrics.traffic_bytes.h2d, rel=1e-9)


def test_systems_with_their_own_optimizer_loop_run_no_deepspeed_pass() -> None:
    st = load_strategy("virtual-memory-swap")
    r = simulate(make_run_config("tiny", "tiny", st))
    assert not _names(r, "unscale") and not _names(r, "cast to 16-bit")


def test_the_fused_copy_is_refused_where_deepspeed_never_had_it() -> None:
    with pytest.raises(ValidationError, match="fused_zero_copy"):
        load_strategy("zero-infinity-cpu").model_validate(
            {**load_strategy("zero-infinity-cpu").model_dump(), "lp_copy": "fused_zero_copy"})
    st = ZERO2.model_validate({**ZERO2.model_dump(), "lp_copy": "fused_zero_copy"})
    with pytest.raises(ConfigError, match="needs fp16 parameters"):
        make_run_config("tiny", "tiny", st)  # tiny is bf16
