"""GPU memory of a ZeRO-3 backward read against DeepSpeed's source (issue 23, zi-1t-fits-one-dgx2).

Hand counts of the recomputed backward's working memory (:func:`offsim.plan.model.recompute_work_bytes`):
DeepSpeed's ``CheckpointFunction.backward`` (runtime/activation_checkpointing/checkpointing.py)
re-runs the block's forward under ``torch.enable_grad()`` and then calls ``torch.autograd.backward``;
autograd frees each node's saved tensors once it has run, MLP first, so the attention's score-sized
gradients never meet the MLP's saved tensors. Activation bytes per Korthikanti et al. (arXiv
2205.05198) Sec. 4.1.
"""

from __future__ import annotations

import pytest

from offsim import load_profile, load_workload
from offsim.fit_check import footprint
from offsim.plan.model import build_layers, recompute_work_bytes
from offsim.validation import case_config, default_cases_path, load_cases


def _block(workload: str):
    wl = load_workload(workload)
    layers = build_layers(wl, load_profile("dgx2-v100").gpu)
    return wl, next(lay for lay in layers if lay.is_block)


def test_zi_1t_recompute_is_the_mlp_phase() -> None:
    """ZeRO-Infinity's 1T block (s 1024, b 8, h 25600, 200 heads, f 4h, no flash attention).

    sbh = 1024 * 8 * 25600 = 209,715,200; as^2b = 200 * 1024^2 * 8 = 1,677,721,600.
    Recomputed: 34 sbh + 5 as^2b = 7,130,316,800 + 8,388,608,000 = 15,518,924,800.
    MLP phase: + 2 x the inner activation (2 * 8192 * 102400 = 1,677,721,600) = 18,874,368,000.
    Attention phase: - the MLP half (19 sbh + its norm's 2 sbh = 4,404,019,200) + 2 x the scores
    (2 as^2b = 3,355,443,200 each) = 17,825,792,000. The larger: 18,874,368,000 (was recomputed +
    2 x scores = 22,229,811,200, 3.125 GiB more)."""
    wl, block = _block("zero-infinity-1t")
    sbh, as2b = 1024 * 8 * 25600, 200 * 1024**2 * 8
    recomputed = 34 * sbh + 5 * as2b
    assert block.act_full_bytes == recomputed == 15_518_924_800
    mlp_phase = recomputed + 2 * (2 * 8192 * 102400)
    attention_phase = recomputed - 21 * sbh + 2 * (2 * as2b)
    assert (mlp_phase, attention_phase) == (18_874_368_000, 17_825_792_000)
    assert recompute_work_bytes(wl) == mlp_phase
    assert block.backward_work_bytes(True) == mlp_phase
    assert block.act_full_bytes + block.grad_work_bytes == 22_229_811_200  # the former count
    assert block.backward_work_bytes(False) == block.grad_work_bytes  # without recompute: unchanged


def test_dos_7b_recompute_is_the_attention_phase() -> None:
    """Deep Optimizer States' 7B (s 2048, b 1, h 4096, 32 heads / 4 KV heads of 128, SwiGLU 11008,
    unfused attention): the scores dominate, so the attention phase is the larger.

    sbh = 8,388,608. Recomputed: attention 3 sbh + (4 sbq + 4 sb kv = 33,554,432 + 4,194,304)
    + 5 as^2b (671,088,640); MLP 2 sbh + 6 sbf (135,266,304); norms 4 sbh: 919,601,152.
    MLP phase: + 2 x (2 sbf = 45,088,768) = 1,009,778,688. Attention phase: - (2 sbh + 6 sbf
    + 2 sbh = 168,820,736) + 2 x (2 as^2b = 268,435,456) = 1,287,651,328."""
    wl, block = _block("dos-7b")
    sbh = 2048 * 4096
    scores = 2 * 32 * 2048**2
    recomputed = 3 * sbh + 33_554_432 + 4_194_304 + 5 * 32 * 2048**2 + 2 * sbh + 6 * 2048 * 11008 + 4 * sbh
    assert block.act_full_bytes == recomputed == 919_601_152
    mlp_phase = recomputed + 2 * (2 * 2048 * 11008)
    attention_phase = recomputed - (4 * sbh + 6 * 2048 * 11008) + 2 * scores
    assert (mlp_phase, attention_phase) == (1_009_778_688, 1_287_651_328)
    assert block.backward_work_bytes(True) == attention_phase == recompute_work_bytes(wl)


@pytest.mark.parametrize("workload", ["llama2-7b", "llama2-70b", "qwen3-8b", "mixtral-8x7b"])
def test_flash_attention_keeps_the_former_count(workload: str) -> None:
    """With flash attention the MLP phase is the larger: recomputed + two largest tensors, as before."""
    _, block = _block(workload)
    assert block.backward_work_bytes(True) == block.act_full_bytes + block.grad_work_bytes


def test_zi_1t_footprint_item() -> None:
    """The case's GPU item is the new count (activations off the GPU do not change it). The case
    checkpoints per half block (strategy.checkpoint_split_block, the ZeRO-Infinity example's
    --split-transformers), so its larger phase is the attention half's: everything recomputed but
    the MLP half, 15,518,924,800 - 4,404,019,200 = 11,114,905,600 B, plus two score-sized
    gradients, 2 x 3,355,443,200: 17,825,792,000 B (18,874,368,000 for a whole block, whose MLP
    phase is larger; tests/test_zi1t_split_checkpoint.py)."""
    case = next(c for c in load_cases(default_cases_path()) if c.id == "zi-1t-fits-one-dgx2")
    item = footprint(case_config(case)).breakdown["gpu"]["backward working memory (recompute, activation gradients)"]
    assert item == 17_825_792_000
