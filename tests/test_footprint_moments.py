"""The GPU footprint holds forward and backward's transients and the step's at different moments
(issue 23): DeepSpeed's step runs after the last backward has freed the activations and backward's
working memory (engine.py ``step`` at the boundary, after ``backward``; deepspeed_runtime.md §13),
so the peak is the held needs plus the larger of the two, not their sum. A step that overlaps
forward and backward (the delayed parameter update, the layer-wise update inside backward,
ZenFlow's selective step) declares its needs held, and they add to the activations.
"""

from __future__ import annotations

import dataclasses

from offsim import make_run_config
from offsim.api import resolve
from offsim.core.enums import Tier
from offsim.core.units import GiB
from offsim.fit_check import footprint
from offsim.mechanisms.activations import Activations, LayerActivations
from offsim.mechanisms.base import Moment, Need, sum_needs
from offsim.mechanisms.gpu_optimizer import GpuOptimizer
from offsim.systems._registry import compose

FB, STEP = Moment.FORWARD_BACKWARD, Moment.STEP


def _activations() -> tuple[Need, ...]:
    """Two layers kept on the GPU, 3 and 4 GiB, each with a 1 GiB backward working set (2 GiB of
    forward transient for the second): kept 7 GiB, working memory max(1, 1, 0, 2) = 2 GiB."""
    layers = (LayerActivations(3 * GiB, 0, 1 * GiB, Tier.GPU), LayerActivations(4 * GiB, 2 * GiB, 1 * GiB, Tier.GPU))
    return Activations(layers, 1, (0, 0)).footprint()


def test_the_activations_are_a_forward_and_backward_transient() -> None:
    gpu = {n.what: (n.nbytes, n.moment) for n in _activations() if n.tier is Tier.GPU}
    assert gpu == {"activations kept for backward": (7 * GiB, FB),
                   "backward working memory (recompute, activation gradients)": (2 * GiB, FB)}


def test_a_step_larger_than_the_activations_replaces_them() -> None:
    """Held 10 GiB; backward 7 + 2 = 9 GiB; the step's temporaries 12 GiB: 10 + 12 = 22 GiB
    (it was 10 + 9 + 12 = 31 GiB with the activations held through the step)."""
    step = GpuOptimizer(0.0, None, 2, 12 * GiB).footprint()
    bd = sum_needs([Need(Tier.GPU, "params", 10 * GiB), *_activations(), *step], 80 * GiB)
    assert bd["gpu"] == {"params": 10 * GiB, "step temporaries (flattened and fp32 gradients of a sub-group)": 12 * GiB}


def test_activations_larger_than_the_step_replace_it() -> None:
    """Held 10 GiB; backward 9 GiB; the step's temporaries 5 GiB: 10 + 9 = 19 GiB."""
    step = GpuOptimizer(0.0, None, 2, 5 * GiB).footprint()
    bd = sum_needs([Need(Tier.GPU, "params", 10 * GiB), *_activations(), *step], 80 * GiB)
    assert sum(bd["gpu"].values()) == 19 * GiB
    assert "step temporaries (flattened and fp32 gradients of a sub-group)" not in bd["gpu"]


def test_the_host_moment_is_chosen_apart_from_the_gpu_one() -> None:
    """Backward's 9 GiB on the GPU and the first step's 4 GiB of pageable moments on the host
    are both counted: each tier is checked against its own capacity at its own peak (one moment
    for every tier would keep only the 9 GiB of the larger)."""
    first = Need(Tier.HOST_PAGEABLE, "moments", 4 * GiB, Moment.FIRST_STEP)
    bd = sum_needs([*_activations(), first], 80 * GiB)
    assert sum(bd["gpu"].values()) == 9 * GiB
    assert bd["host"] == {"moments": 4 * GiB}


def test_an_elastic_need_takes_what_the_larger_moment_leaves() -> None:
    """20 GiB GPU, held 10, backward 9, the step 5: the elastic need (2 GiB units, 8 at most)
    takes whole units of 20 - 10 - 9 = 1 GiB free: none."""
    elastic = Need(Tier.GPU, "streamed", 8 * GiB, unit_bytes=2 * GiB)
    step = Need(Tier.GPU, "upload", 5 * GiB, STEP)
    bd = sum_needs([Need(Tier.GPU, "params", 10 * GiB), *_activations(), step, elastic], 20 * GiB)
    assert "streamed" not in bd["gpu"] and sum(bd["gpu"].values()) == 19 * GiB


def test_zenflow_s_selective_step_overlaps_the_activations() -> None:
    """ZenFlow's selective GPU step runs every step beside its CPU step, which overlaps the next
    window's forward and backward: its GPU needs are held (moment None), so the GPU need is every
    held item plus the activations' moment: nothing on the GPU is left out of the sum."""
    cfg = resolve(make_run_config("tiny", "tiny", "zenflow"))
    needs = [n for m in compose(cfg).mechanisms.values() for n in m.footprint()
             if n.tier is Tier.GPU and n.unit_bytes <= 0]
    assert {n.moment for n in needs} == {None, FB}
    assert footprint(cfg).need_bytes["gpu"] == sum(n.nbytes for n in needs)


def test_the_layerwise_update_has_no_step_transient_on_the_gpu() -> None:
    """SuperOffload's layer-wise update runs inside backward: its GPU step declares no transient
    of the step's moment (GpuOptimizer with no step temporaries), so nothing is traded against
    the activations."""
    cfg = resolve(make_run_config("tiny", "tiny", "superoffload"))
    assert cfg.strategy.optimizer_schedule == "layerwise"
    moments = {n.moment for m in compose(cfg).mechanisms.values() for n in m.footprint() if n.tier is Tier.GPU}
    assert moments <= {None, FB}


def test_dpu_declares_the_upload_held() -> None:
    """The delayed parameter update overlaps the step with the next iteration (ZeRO-Offload, arXiv
    2101.06840 Sec. 4.3; the shipped zero-offload-dpu): an upload its CPU optimizer declares (3 GiB
    here, put in by hand: offsim's DPU runs no DeepSpeed upload) is held, not the step's moment;
    the same optimizer without the delay declares it at the step."""
    cfg = resolve(make_run_config("tiny", "tiny", "zero-offload-dpu"))
    opt = compose(cfg).mechanisms["optimizer"]
    assert opt.delayed  # type: ignore[attr-defined]
    groups = tuple(dataclasses.replace(g, home_gpu_bytes=3 * GiB) for g in opt.groups)  # type: ignore[attr-defined]
    for delayed, moment in ((True, None), (False, STEP)):
        mech = dataclasses.replace(opt, groups=groups, delayed=delayed)  # type: ignore[type-var]
        (upload,) = [n for n in mech.footprint() if n.tier is Tier.GPU and n.unit_bytes <= 0]
        assert (upload.nbytes, upload.moment) == (3 * GiB, moment)
