"""Host memory of zi-1t-fits-one-dgx2 (ZeRO-Infinity's 1T model on one DGX-2, issue 23) with the
ds_config of the ZeRO-Infinity example released with DeepSpeed v0.3.15 (DeepSpeedExamples
bdf8e59a, Megatron-LM-v1.1.5-ZeRO3/examples/ds_zero_stage_infinity_config.json) and the exact-size
pinned allocator of 2021's PyTorch (aten/src/THC/THCCachingHostAllocator.cpp HostAllocator::malloc:
cudaHostAlloc of the size asked), each item computed by hand from DeepSpeed v0.3.15's source.

Partitions per rank (16 ranks, hidden 25,600, FFN 102,400): Wq, Wk, Wv, Wo 655,360,000 / 16 =
40,960,000 each; FC1, FC2 2,621,440,000 / 16 = 163,840,000 each; a block's norms and biases
332,800 / 16 = 20,800. stage3.py ``_create_fp16_sub_groups`` closes a sub-group once it holds
``sub_group_size`` (1e8) or more, in module order: the embedding (80,486,400), positions
(1,638,400) and block 0's Wq = 123,084,800; Wk+Wv+Wo = 122,880,000; FC1 = 163,840,000; FC2 =
163,840,000; then block 0's rest with block 1's Wq+Wk+Wv = 122,900,800; Wo+FC1 = 204,800,000;
FC2 = 163,840,000; and so on. The largest: 204,800,000 elements.
"""

from __future__ import annotations

import pytest

from offsim.core.units import GiB
from offsim.fit_check import footprint
from offsim.plan.footprint import deepspeed_sub_groups, param_partitions, state_sizes
from offsim.validation import case_config, default_cases_path, load_cases

LARGEST_SUB_GROUP = 40_960_000 + 163_840_000
LARGEST_PARTITION = 163_840_000
#: swap_tensor/utils.py SwapBufferManager: offload_optimizer.buffer_count (4) fp32 tensors of the
#: largest sub-group, torch.zeros(...).pin_memory()
OPTIMIZER_SWAP_BYTES = 4 * LARGEST_SUB_GROUP * 4
#: partitioned_param_swapper.py _configure_aio: buffer_count 5 x buffer_size (1e8, raised to the
#: largest partition, issue #3506) torch.half, one pinned tensor
PARAM_POOL_BYTES = 5 * LARGEST_PARTITION * 2
#: stage3.py param_group_fp16_flat_reuse_buffer: the largest sub-group in torch.half, pinned
REUSE_BUFFER_BYTES = LARGEST_SUB_GROUP * 2
#: stage3.py _create_param_groups_fp16_flat_cpu_memory: max_in_cpu 1 element of torch.half
MAX_IN_CPU_BYTES = 2
#: fp16 checkpoints of b x s x h = 8 x 1024 x 25,600 (419,430,400 B), two per block with the
#: example's --split-transformers (strategy.checkpoint_split_block): offsim moves the embedding's
#: output and blocks 1-126 to the CPU (the last prefetch_depth = 2 blocks stay on the GPU,
#: offsim/systems/_ctx.py build_ctx): 1 + 2 x 126 = 253 of the 256 DeepSpeed v0.3.15 copies
CHECKPOINT_BYTES = 8 * 1024 * 25_600 * 2
CHECKPOINTS_BYTES = (1 + 2 * 126) * CHECKPOINT_BYTES
#: the start-up's largest pageable moment: an fp32 copy of the largest sub-group (stage3.py
#: _create_fp32_partitions / initialize_optimizer_states' fp32 gradient buffer)
SCRATCH_BYTES = LARGEST_SUB_GROUP * 4


def _case_cfg():
    case = next(c for c in load_cases(default_cases_path()) if c.id == "zi-1t-fits-one-dgx2")
    return case_config(case)


def test_sub_groups_by_hand() -> None:
    cfg = _case_cfg()
    assert cfg.strategy.sub_group_params == 1e8
    groups = deepspeed_sub_groups(param_partitions(cfg, state_sizes(cfg)), cfg.strategy.sub_group_params)
    assert max(groups) == LARGEST_SUB_GROUP == 204_800_000
    assert groups[:7] == [123_084_800, 122_880_000, 163_840_000, 163_840_000,
                          122_900_800, 204_800_000, 163_840_000]


def test_pinned_items_by_hand() -> None:
    """Each pinned item of the case at its exact size (no power-of-two rounding)."""
    pinned = footprint(_case_cfg()).breakdown["host_pinned"]
    assert pinned["optimizer swap buffers (offload_optimizer)"] == OPTIMIZER_SWAP_BYTES == 3_276_800_000
    assert pinned["parameter swap buffers (offload_param)"] == PARAM_POOL_BYTES == 1_638_400_000
    assert pinned["partitioned parameter swap space (largest sub-group, 16-bit)"] == REUSE_BUFFER_BYTES
    assert pinned["parameters kept in CPU (offload_param.max_in_cpu)"] == MAX_IN_CPU_BYTES
    assert pinned["offloaded activations"] == CHECKPOINTS_BYTES == 106_115_891_200


def test_host_need_per_node_by_hand() -> None:
    """16 ranks x (pinned items + the start-up's pageable scratch): 16 x 112,259,891,202 B =
    1,796,158,259,232 B = 1672.80 GiB, above the DGX-2's 1382.4 GiB at the workload's unverified
    micro-batch 8; with one checkpoint per block (127 offloaded) it is 885.30 GiB."""
    fp = footprint(_case_cfg())
    per_rank = (OPTIMIZER_SWAP_BYTES + PARAM_POOL_BYTES + REUSE_BUFFER_BYTES + MAX_IN_CPU_BYTES
                + CHECKPOINTS_BYTES + SCRATCH_BYTES)
    assert per_rank == 112_259_891_202
    assert fp.need_bytes["host"] == 16 * per_rank
    assert fp.need_bytes["host"] / GiB == pytest.approx(1672.80, abs=0.005)
    whole = (per_rank - CHECKPOINTS_BYTES + 127 * CHECKPOINT_BYTES) * 16
    cfg = _case_cfg()
    one = cfg.model_copy(update={"strategy": cfg.strategy.model_copy(update={"checkpoint_split_block": False})})
    assert footprint(one).need_bytes["host"] == whole
    assert whole / GiB == pytest.approx(885.30, abs=0.005)


def test_caching_allocator_rounds_each_buffer_up() -> None:
    """The same case under today's CachingHostAllocator (PowerOf2Ceil): each 819,200,000 B
    optimizer buffer pins 2^30 B, the 1,638,400,000 B pool 2^31 B."""
    cfg = _case_cfg()
    caching = cfg.model_copy(update={"strategy": cfg.strategy.model_copy(update={"host_allocator": "caching"})})
    pinned = footprint(caching).breakdown["host_pinned"]
    assert pinned["optimizer swap buffers (offload_optimizer)"] == 4 * 2**30
    assert pinned["parameter swap buffers (offload_param)"] == 2**31
