"""DeepSpeed ZeRO-3 without offload, the step's GPU temporaries (stage3.py
``_prepare_fp32_grad_for_sub_group``: ``flatten(averaged_gradients).to(fp32)`` per sub-group):
hand-computed on tiny (67,118,080 parameters, one rank, bf16 gradients, one sub-group)."""

from __future__ import annotations

from offsim import load_strategy, make_run_config, simulate
from offsim.fit_check import footprint
from offsim.systems._registry import compose

PARAMS = 67_118_080
WHAT = "step temporaries (flattened and fp32 gradients of a sub-group)"


def _zero3(sub_group_params: float = 1e9):
    st = load_strategy("gpu-only").model_copy(update={"zero_stage": 3, "sub_group_params": sub_group_params})
    return make_run_config("tiny", "tiny", st)


def _declared(cfg) -> float:
    return next(n.nbytes for m in compose(cfg).mechanisms.values() for n in m.footprint() if n.what == WHAT)


def test_step_holds_a_sub_groups_16_bit_and_fp32_gradients() -> None:
    # one sub-group of all 67,118,080 elements: 2 B flattened + 4 B fp32 = 402,708,480 B, more than
    # backward's activations and working memory (90,177,536 + 8,388,608 = 98,566,144 B, freed
    # before the step): the GPU peak is the step's and counts them
    assert _declared(_zero3()) == PARAMS * 6
    assert footprint(_zero3()).breakdown["gpu"][WHAT] == PARAMS * 6
    # sub_group_size 1e7: 1e7 x 6 B = 60,000,000 B, less than backward's 98,566,144 B: the peak
    # is backward's, without them
    assert _declared(_zero3(1e7)) == 60_000_000
    assert WHAT not in footprint(_zero3(1e7)).breakdown["gpu"]


def test_the_engine_allocates_them_at_the_step_only() -> None:
    result = simulate(_zero3())
    levels = result.levels()
    gpu = levels[levels.tier == "gpu"]
    # the GPU level steps up by the temporaries at the step and back down after Adam
    steps = gpu.bytes.diff()
    assert steps.eq(PARAMS * 6).any() and steps.eq(-PARAMS * 6).any()
    assert result.metrics.peak_bytes.gpu <= footprint(_zero3()).need_bytes["gpu"]


def test_no_temporaries_below_stage_3() -> None:
    st = load_strategy("gpu-only")
    assert WHAT not in footprint(make_run_config("tiny", "tiny", st)).breakdown["gpu"]
