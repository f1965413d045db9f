"""Deep Optimizer States' fixed split (vanilla ZeRO-3 offload, the artifact's ``prefetch_optimizer 0``
run) on DeepSpeed's own sub-groups of the Megatron layout (``system_options.megatron_layout``):
the step's sub-group loop and the pinned fp32 gradients, counted by hand from stage3.py
(``_create_fp16_sub_groups``, ``initialize_optimizer_states``: one zeros + pinned copy per
sub-group) and the vanilla 7B sample log (``After creating fp16 partitions: 130``)."""

from __future__ import annotations

from offsim.config.run import RunConfig
from offsim.fit_check import footprint
from offsim.mechanisms.cpu_optimizer import CpuOptimizer
from offsim.systems._registry import compose
from offsim.validation import case_config, default_cases_path, load_cases

VANILLA = "dos-7b-vanilla-zero3-cpu-optimizer"
# dos-7b's sub-groups as the vanilla log prints them (tests/test_dos_fork.py): per block
# [norm + dense], [QKV], [norm + fc1], [fc2]; the embedding and [final norm + output layer]
DENSE, QKV, FC1, FC2 = 16_781_312, 20_971_520, 90_181_632, 45_088_768
EMBED, HEAD = 206_045_184, 206_049_280
GROUPS = [EMBED, *[DENSE, QKV, FC1, FC2] * 32, HEAD]


def _vanilla(layout: bool) -> RunConfig:
    case = next(c for c in load_cases(default_cases_path()) if c.id == VANILLA)
    cfg = case_config(case)
    st = cfg.strategy.model_copy(update={"system_options": {"megatron_layout": layout}})
    return cfg.model_copy(update={"strategy": st})


def _optimizer(cfg: RunConfig) -> CpuOptimizer:
    opt = compose(cfg).mechanisms["optimizer"]
    assert isinstance(opt, CpuOptimizer)
    return opt


def test_fixed_split_steps_the_logs_130_sub_groups() -> None:
    """megatron_layout: 130 sub-groups (the log's count), each uploading its own elements' 16-bit
    parameters (2 B each, the blocking copy_ of _reassign_or_swap_out_partitioned_parameters)
    after CPU Adam has touched 30 B of DRAM per element less the separate cast's 2 B (p, g, m, v in
    fp32: 28 B; offsim.systems._part_optimizer.adam_dram_bpp); without it offsim's equal ones:
    ceil(5,948,837,888 / 1e7) = 595."""
    with_layout, equal = _optimizer(_vanilla(True)), _optimizer(_vanilla(False))
    assert len(with_layout.groups) == 130 and len(equal.groups) == 595
    assert [g.params_home.nbytes if g.params_home else 0 for g in with_layout.groups] == [2 * n for n in GROUPS]
    assert [g.adam.nbytes for g in with_layout.groups] == [28 * n for n in GROUPS]
    assert all(order == tuple(range(130)) for order in with_layout.orders)


def test_pinned_fp32_grads_rounded_per_layout_sub_group() -> None:
    """Each sub-group's fp32 gradient is its own pinned tensor, rounded to a power of two:
    norm + dense 67,125,248 -> 2^27, QKV 83,886,080 -> 2^27, fc1 360,726,528 -> 2^29, fc2
    180,355,072 -> 2^28, per block 2^30; embedding and output layer 824,180,736 / 824,197,120 ->
    2^30 each: 34 x 2^30 = 36,507,222,016 B (34 GiB; the vanilla log grows by 34.57 GiB across
    initialize_optimizer_states, 44.79 -> 79.36). Equal sub-groups of 9,998,047 elements
    (39,992,188 B -> 2^26) give 595 x 2^26 = 39,929,774,080 B (37.19 GiB)."""
    grads = "grads (optimizer format)"
    assert footprint(_vanilla(True)).breakdown["host_pinned"][grads] == 34 * 2**30
    assert footprint(_vanilla(False)).breakdown["host_pinned"][grads] == 595 * 2**26


def test_shipped_vanilla_case_steps_the_logs_sub_groups() -> None:
    """validation/cases.yaml's vanilla case sets megatron_layout from its log, as the DOS case does:
    its step loops over the 130 sub-groups the log prints (GROUPS), in DeepSpeed's order."""
    case = next(c for c in load_cases(default_cases_path()) if c.id == VANILLA)
    opt = _optimizer(case_config(case))
    assert [g.adam.nbytes for g in opt.groups] == [28 * n for n in GROUPS]
