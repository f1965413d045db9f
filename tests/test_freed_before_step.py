"""GPU buffers DeepSpeed frees between the last backward and the step (issue 23).

* ZeRO-1/2 offload: the IPG bucket buffer(s) are made at backward's first gradient and dropped by
  ``independent_gradient_partition_epilogue`` -> ``_release_ipg_buffers`` (stage_1_and_2.py at
  edaa72212, ``setup_buckets``; stage2.py v0.3.16 ``backward``), while
  ``temp_grad_buffer_for_gpu_offload`` (the largest parameter, model dtype) is made once in
  ``DeepSpeedZeroOptimizer.__init__`` and kept: with the two apart, the IPG part is a
  forward/backward need and the offload buffer is held through the step, in the footprint and
  in the engine's timeline alike.
* ZeRO-3: every gathered parameter is released before the step (stage3.py ``step`` begins with
  ``_partition_all_parameters`` from v0.6.0; v0.3.16-v0.5.10's ``backward`` ends with it), so
  the gathered-parameter window is a forward/backward need where the system says so
  (``ParamFetch.released_before_step``); the engine flushes the cache there already.
"""

from __future__ import annotations

import dataclasses

import pytest

from offsim.core.enums import Tier
from offsim.core.units import GiB
from offsim.fit_check import footprint_of
from offsim.mechanisms.base import Moment, Need, SiteKind, Stage, sum_needs
from offsim.mechanisms.param_fetch import ParamFetch
from offsim.mechanisms.zero2_grads import BOTH_WHAT, IPG_WHAT, OFFLOAD_WHAT, Zero2Grads
from offsim.plan.deepspeed_versions import Z12AccumMode
from offsim.plan.footprint import state_sizes
from offsim.simulation import run_schedule
from offsim.systems._compile import System
from offsim.systems._registry import compose
from offsim.validation import ValidationCase, case_config, default_cases_path, load_cases

FB = Moment.FORWARD_BACKWARD
# LLaDA 8B (dllm issue 9; Nie et al. 2025, arXiv 2502.09992, Table 5), as tests/test_case_dllm9.py counts it
HIDDEN, VOCAB = 4096, 126464
PARAMS = 8_015_581_184


def _case(case_id: str) -> ValidationCase:
    (case,) = [c for c in load_cases(default_cases_path()) if c.id == case_id]
    return case


def _dllm9_offload() -> ValidationCase:
    """dllm issue 9's CPU-offload attempt with DeepSpeed 0.16.3's switches (as
    tests/test_case_dllm9.py ``_offload_case``; not a case: no log)."""
    base = _case("dllm9-llada8b-2xa100-zero2-gpu-oom")
    overrides = {**base.overrides, "strategy.overlap_grad_offload": False, "strategy.pin_memory": False,
                 "strategy.z12_lp_upload": "fp32_pinned_gpu_cast",
                 "strategy.system_options": {"z12_accum_mode": "drop_middle"}}
    for key in ("strategy.zero_stage", "strategy.gpu_adam"):
        overrides.pop(key)
    return base.model_copy(update={"strategy": "zero-offload", "overrides": overrides})


def _z2(offload: int | None) -> Zero2Grads:
    """2 GiB of IPG bucket (with the offload buffer when ``offload`` is None), no accumulator."""
    return Zero2Grads((), False, Z12AccumMode.V1, 2 * GiB, 0, offload_buffer_bytes=offload)


def _gpu(needs: tuple[Need, ...]) -> dict[str, tuple[float, Moment | None]]:
    return {n.what: (n.nbytes, n.moment) for n in needs if n.tier is Tier.GPU}


def test_zero2_ipg_buckets_apart_from_the_offload_buffer() -> None:
    assert _gpu(_z2(1 * GiB).footprint()) == {IPG_WHAT: (2 * GiB, FB), OFFLOAD_WHAT: (1 * GiB, None)}


def test_zero2_buffers_not_apart_are_held() -> None:
    """Without the split (``offload_buffer_bytes`` None) the whole buffer is held through the
    step, as before."""
    assert _gpu(_z2(None).footprint()) == {BOTH_WHAT: (2 * GiB, None)}


def test_zero2_the_step_does_not_meet_the_ipg_buckets() -> None:
    """Held 10 GiB; backward: activations 6 GiB (forward/backward) + IPG 2 GiB; the step's
    upload 9 GiB; offload buffer 1 GiB held. Apart: 10 + 1 + max(6 + 2, 9) = 20 GiB; not apart
    (3 GiB held): 10 + 3 + max(6, 9) = 22 GiB."""
    others = [Need(Tier.GPU, "params", 10 * GiB), Need(Tier.GPU, "activations", 6 * GiB, FB),
              Need(Tier.GPU, "upload", 9 * GiB, Moment.STEP)]
    apart = sum_needs([*others, *_z2(1 * GiB).footprint()], 80 * GiB)["gpu"]
    assert sum(apart.values()) == 20 * GiB and IPG_WHAT not in apart
    both = Zero2Grads((), False, Z12AccumMode.V1, 3 * GiB, 0).footprint()
    assert sum(sum_needs([*others, *both], 80 * GiB)["gpu"].values()) == 22 * GiB


def _split(system: System, offload_bytes: int) -> System:
    """``system`` with the ZeRO-2 buffers apart as DeepSpeed holds them: the offload buffer
    allocated at start-up (the INIT site's order lists the mechanism) and the IPG bucket the
    rest (left as it is when the composition already splits them)."""
    g = system.mechanisms["grads"]
    assert isinstance(g, Zero2Grads)
    if g.offload_buffer_bytes is not None:
        assert g.offload_buffer_bytes == offload_bytes
        return system
    g = dataclasses.replace(g, gpu_buffer_bytes=g.gpu_buffer_bytes - offload_bytes, offload_buffer_bytes=offload_bytes)
    sites = {**system.sites, SiteKind.INIT: (*system.sites[SiteKind.INIT], ("grads", Stage.RUN))}
    return dataclasses.replace(system, mechanisms={**system.mechanisms, "grads": g}, sites=sites)


def test_zero2_footprint_and_timeline_agree_at_the_step() -> None:
    """dllm issue 9's CPU-offload attempt (LLaDA 8B, DeepSpeed 0.16.3's switches; overlap_comm
    false: one IPG buffer of reduce_bucket_size 5e8 x 2 B = 1e9 B; the largest parameter is the
    126464 x 4096 embedding, 1,035,993,088 B in bf16). The step is the peak: reserve 1.50 GiB +
    16-bit params 2P + the fp32 partition uploaded 4 B x P/2 + the offload buffer
    = 1,610,612,736 + 4 x 8,015,581,184 + 1,035,993,088 = 34,708,930,560 B = 32.33 GiB, in the
    footprint and in the engine's ledger (before the split the footprint held the IPG buffer
    through the step too, 33.26 GiB, and the engine freed the offload buffer with it, 31.36)."""
    cfg = case_config(_dllm9_offload())
    sz = state_sizes(cfg)
    offload = VOCAB * HIDDEN * 2
    system = _split(compose(cfg, sz), offload)
    g = system.mechanisms["grads"]
    assert isinstance(g, Zero2Grads) and g.gpu_buffer_bytes == 5e8 * 2
    expected = cfg.hardware.gpu.reserved_bytes + 4 * PARAMS + offload
    assert expected == 34_708_930_560
    assert footprint_of(system, cfg, sz).need_bytes["gpu"] == pytest.approx(expected, abs=1)
    _, peaks, _ = run_schedule(cfg, sz, system=system)
    assert peaks["gpu"] == pytest.approx(expected, abs=1)


def _fetch(released: bool) -> ParamFetch:
    return ParamFetch((), None, 3 * GiB, released_before_step=released)


def test_zero3_window_moment() -> None:
    assert _gpu(_fetch(True).footprint()) == {"gathered params window": (3 * GiB, FB)}
    assert _gpu(_fetch(False).footprint()) == {"gathered params window": (3 * GiB, None)}


def test_zero3_window_released_before_the_step() -> None:
    """Held 10 GiB; activations 9 GiB (forward/backward); the step's temporaries 12 GiB; a
    3 GiB window. Released before the step: 10 + max(9 + 3, 12) = 22 GiB; held through it:
    10 + 3 + max(9, 12) = 25 GiB."""
    others = [Need(Tier.GPU, "params", 10 * GiB), Need(Tier.GPU, "activations", 9 * GiB, FB),
              Need(Tier.GPU, "step", 12 * GiB, Moment.STEP)]
    for released, total in ((True, 22), (False, 25)):
        bd = sum_needs([*others, *_fetch(released).footprint()], 80 * GiB)["gpu"]
        assert sum(bd.values()) == total * GiB


def test_zero3_footprint_and_timeline_agree_when_released() -> None:
    """LLaMA-Factory 5977 without offload (Llama 3 8B, ZeRO-3 on 8 x 3090): the engine flushes
    the gathered parameters before the step, whose temporaries make the peak; released before
    the step, the footprint's GPU need is the engine's peak, the window's bytes below the
    footprint that holds it through the step."""
    cfg = case_config(_case("lf5977-llama3-8b-8x3090-zero3-oom"))
    sz = state_sizes(cfg)
    system = compose(cfg, sz)
    fetch = system.mechanisms["params"]
    assert isinstance(fetch, ParamFetch) and fetch.window_bytes > 0
    need = {}
    for released in (False, True):
        s = dataclasses.replace(system, mechanisms={
            **system.mechanisms, "params": dataclasses.replace(fetch, released_before_step=released)})
        need[released] = footprint_of(s, cfg, sz).need_bytes["gpu"]
    _, peaks, _ = run_schedule(cfg, sz, system=system)
    assert need[True] == pytest.approx(peaks["gpu"], abs=1)
    assert need[False] - need[True] == pytest.approx(fetch.window_bytes, abs=1)
