"""Activation checkpointing per half block (``strategy.checkpoint_split_block``): the
Megatron-LM-v1.1.5-ZeRO3 fork of the ZeRO-Infinity example (DeepSpeedExamples bdf8e59a,
ds_pretrain_gpt2-zero3.sh --split-transformers) builds each block as ParallelTransformerLayerPart1
(attention) and Part2 (MLP), each its own checkpointed function (megatron/model/transformer.py;
initialize.py doubles DeepSpeed's num_checkpoints). Hand counts on zero-infinity-1t (s 1024, b 8,
h 25,600, 200 heads, FFN 102,400, no flash attention; Korthikanti et al. Sec. 4.1 bytes).
"""

from __future__ import annotations

from offsim import load_profile, load_workload
from offsim.plan.model import build_layers, recompute_work_bytes

S, B, H, A, F = 1024, 8, 25_600, 200, 102_400
SBH = S * B * H  # 209,715,200
#: attention: input + dropout mask 3sbh, Q K V context 8sbh, 5as^2b; MLP: 3sbh + 4 x sbf; norms 2 x 2sbh
ATTENTION = 3 * SBH + 8 * SBH + 5 * A * S * S * B
MLP = 3 * SBH + 4 * S * B * F
NORMS = 4 * SBH
FULL = ATTENTION + MLP + NORMS  # 15,518,924,800 B
MLP_HALF = MLP + 2 * SBH  # the MLP with its norm's input
SCORES = 2 * A * S * S * B  # the largest attention tensor, 3,355,443,200 B
MLP_INNER = 2 * S * B * F  # the largest MLP tensor, 1,677,721,600 B


def _wl():
    return load_workload("zero-infinity-1t")


def test_whole_block_recompute_by_hand() -> None:
    """One checkpoint per block: the MLP phase holds everything recomputed + two MLP-inner
    gradients: 15,518,924,800 + 3,355,443,200 = 18,874,368,000 B (17.58 GiB); the attention
    phase 15,518,924,800 - 4,404,019,200 + 6,710,886,400 = 17,825,792,000 B."""
    assert FULL == 15_518_924_800
    assert FULL + 2 * MLP_INNER == 18_874_368_000 > FULL - MLP_HALF + 2 * SCORES
    assert recompute_work_bytes(_wl()) == 18_874_368_000


def test_split_block_recompute_by_hand() -> None:
    """Per half block: the MLP half alone, 4,404,019,200 + 3,355,443,200 = 7,759,462,400 B, and
    the attention half, 17,825,792,000 B (16.60 GiB), the larger: 1,048,576,000 B less than whole."""
    mlp_phase = MLP_HALF + 2 * MLP_INNER
    attention_phase = FULL - MLP_HALF + 2 * SCORES
    assert (mlp_phase, attention_phase) == (7_759_462_400, 17_825_792_000)
    assert recompute_work_bytes(_wl(), split_block=True) == attention_phase


def test_split_block_keeps_two_inputs() -> None:
    """Two 16-bit hidden-size checkpoints per block (2 x 2sbh = 838,860,800 B) instead of one;
    embedding and head unchanged; the other layer fields equal."""
    gpu = load_profile("dgx2-v100").gpu
    whole, split = build_layers(_wl(), gpu), build_layers(_wl(), gpu, split_block=True)
    assert whole[1].act_ckpt_bytes == 2 * SBH and split[1].act_ckpt_bytes == 4 * SBH == 838_860_800
    assert split[0] == whole[0] and split[-1] == whole[-1]
    assert (split[1].fwd_flop, split[1].act_full_bytes) == (whole[1].fwd_flop, whole[1].act_full_bytes)
