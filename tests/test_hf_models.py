"""Today's models from their Hugging Face ``config.json`` (issue 17): explicit ``head_dim``, GQA,
tied embeddings, ``text_config`` nesting, and mixture-of-experts (total vs active parameters).

Every count is checked twice: exactly against the figure ../shared/reference/config_formats.md
§6.3 computes from the same config values, and against the published total with the tolerance
its rounding allows (source beside each number). The configs under ``tests/data/hf/`` carry the
values §6.3 lists for each checkpoint.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from offsim import load_profile, make_run_config, simulate
from offsim.config.loading import load_workload
from offsim.config.workload import Workload
from offsim.errors import ConfigError
from offsim.plan.model import build_layers, model_flop_per_iteration

HF_DATA = Path(__file__).parent / "data" / "hf"


def _config(folder: str) -> Path:
    return HF_DATA / folder / "config.json"


def _non_embedding(w: Workload) -> int:
    m = w.model
    return m.total_params - m.embedding_params - (0 if m.tied_embeddings else m.vocab * m.hidden)


# folder: (exact total, exact active) as computed in config_formats.md §6.3 from the same values.
COMPUTED: dict[str, tuple[int, int]] = {
    "qwen3-8b": (8_190_735_360, 8_190_735_360),
    "qwen3-30b-a3b": (30_532_122_624, 3_353_032_704),
    "mixtral-8x7b-v0.1": (46_702_792_704, 12_879_925_248),
    "gemma-2-9b": (9_241_705_984, 9_241_705_984),
    "olmoe-1b-7b-0924": (6_919_161_856, 1_282_017_280),
    "deepseek-v3": (671_026_419_200, 37_552_297_472),
}

# folder: (published total, its tolerance, published active, its tolerance). The tolerance is the
# figure's rounding; the source is named beside each.
PUBLISHED: dict[str, tuple[float, float, float, float]] = {
    # Qwen3-8B model card: "8.2B" (config_formats.md §6.3).
    "qwen3-8b": (8.2e9, 0.005, 8.2e9, 0.005),
    # Qwen3-30B-A3B model card: "30.5B total, 3.3B activated" (§6.3); 3.35B is printed as 3.3B.
    "qwen3-30b-a3b": (30.5e9, 0.005, 3.3e9, 0.02),
    # Mistral's announcement: "46.7B total, 12.9B per token" (§6.3).
    "mixtral-8x7b-v0.1": (46.7e9, 0.002, 12.9e9, 0.005),
    # OLMoE paper table via a summary: 6.9B total / 1.3B active (§6.3).
    "olmoe-1b-7b-0924": (6.9e9, 0.005, 1.3e9, 0.02),
    # DeepSeek-V3: "671B total, 37B activated" (§6.3); 37.55B with the input embedding.
    "deepseek-v3": (671e9, 0.001, 37e9, 0.02),
    # Qwen1.5-MoE-A2.7B model card (huggingface.co/Qwen/Qwen1.5-MoE-A2.7B, README): "14.3B
    # parameters in total and 2.7B activated" (not in §6.3).
    "qwen1.5-moe-a2.7b": (14.3e9, 0.005, 2.7e9, 0.01),
}


@pytest.mark.parametrize("folder", sorted(COMPUTED))
def test_hf_counts_match_the_reference_computation(folder: str) -> None:
    m = load_workload(_config(folder)).model
    assert (m.total_params, m.active_params) == COMPUTED[folder]


@pytest.mark.parametrize("folder", sorted(PUBLISHED))
def test_hf_counts_match_the_published_totals(folder: str) -> None:
    total, total_tol, active, active_tol = PUBLISHED[folder]
    m = load_workload(_config(folder)).model
    assert m.total_params == pytest.approx(total, rel=total_tol)
    assert m.active_params == pytest.approx(active, rel=active_tol)


def test_non_embedding_counts_match_the_published_ones() -> None:
    # Qwen3-8B card: non-embedding 6.95B (§6.3 computes 6,946,075,648).
    assert _non_embedding(load_workload(_config("qwen3-8b"))) == 6_946_075_648
    # Gemma 2 report (arXiv 2408.00118) Table 2, 9B: 8,324,201,984 non-embedding, exactly.
    assert _non_embedding(load_workload(_config("gemma-2-9b"))) == 8_324_201_984
    # Qwen3-30B-A3B card: non-embedding 29.9B (§6.3: 29.91B).
    assert _non_embedding(load_workload(_config("qwen3-30b-a3b"))) == pytest.approx(29.9e9, rel=0.002)


@pytest.mark.parametrize(
    ("folder", "shipped"),
    [("qwen3-8b", "qwen3-8b"), ("qwen3-30b-a3b", "qwen3-30b-a3b"), ("mixtral-8x7b-v0.1", "mixtral-8x7b"),
     ("gemma-2-9b", "gemma2-9b")],
)
def test_hf_config_matches_shipped_workload(folder: str, shipped: str) -> None:
    assert load_workload(_config(folder)).model == load_workload(shipped).model


def test_explicit_head_dim_sets_the_attention_widths() -> None:
    """Qwen3-30B-A3B's query width is 32 x 128 = 4096, twice its hidden size (§6.1)."""
    m = load_workload(_config("qwen3-30b-a3b")).model
    assert (m.head_width, m.q_width, m.kv_heads_count * m.head_width) == (128, 4096, 512)
    assert m.attention_matrices() == [2048 * 4096, 2048 * 512, 2048 * 512, 4096 * 2048]


def test_gemma3_reads_text_config_with_class_defaults() -> None:
    """Gemma 3's text_config omits heads, head_dim and vocabulary; they take Gemma3TextConfig's
    defaults (8 / 4 / 256, 262208, tied), each named in the notes. Non-embedding 3,209,010,688
    by the §6.2 formulas (the Gemma 3 report's Table 1 lists 3,209M for the 4B)."""
    w = load_workload(_config("gemma-3-4b-it"))
    m = w.model
    assert (m.layers, m.hidden, m.heads, m.kv_heads_count, m.head_width) == (34, 2560, 8, 4, 256)
    assert (m.vocab, m.tied_embeddings, m.qk_norm, m.norms_per_block) == (262_208, True, "head", 4)
    assert _non_embedding(w) == 3_209_010_688
    notes = w.provenance.notes or ""
    assert "text_config" in notes and "vision tower" in notes
    assert "head_dim absent, taken as the gemma3_text class default 256" in notes


def test_tied_flag_at_the_top_of_a_multimodal_config_is_read(tmp_path: Path) -> None:
    text = json.loads(_config("qwen3-8b").read_text())
    del text["tie_word_embeddings"]
    path = _write(tmp_path / "vlm" / "config.json",
                  {"model_type": "llava", "tie_word_embeddings": True, "text_config": text})
    m = load_workload(path).model
    assert m.tied_embeddings
    assert m.total_params == COMPUTED["qwen3-8b"][0] - m.vocab * m.hidden


def test_qwen2_moe_counts_shared_expert_and_qkv_biases() -> None:
    m = load_workload(_config("qwen1.5-moe-a2.7b")).model
    assert m.moe is not None
    assert (m.moe.shared_experts, m.moe.shared_width, m.moe.shared_expert_gate) == (1, 5632, True)
    assert m.qkv_bias
    h = 2048
    shared = 3 * h * 5632 + h  # shared expert and its 1 x h gate
    assert m.moe_mlp_params() == 60 * h + 60 * 3 * h * 1408 + shared


def test_qwen_moe_dense_layers_follow_mlp_only_layers_and_sparse_step(tmp_path: Path) -> None:
    data = json.loads(_config("qwen3-30b-a3b").read_text())
    data.update(num_hidden_layers=6, mlp_only_layers=[0], decoder_sparse_step=2)
    m = load_workload(_write(tmp_path / "q" / "config.json", data)).model
    assert m.moe is not None and m.moe.dense_layers == [0, 2, 4]  # (i + 1) % 2 != 0, and layer 0
    assert [m.sparse_block(i) for i in range(6)] == [False, True, False, True, False, True]


def test_deepseek_v3_mla_and_dense_first_layers() -> None:
    w = load_workload(_config("deepseek-v3"))
    m = w.model
    assert m.mla is not None and m.moe is not None
    assert m.moe.dense_layers == [0, 1, 2] and m.moe.shared_experts == 1 and m.moe.router_bias
    layers = build_layers(w, load_profile("h100-sxm5-gen5").gpu)
    dense, sparse = layers[1], layers[4]
    assert dense.params == m.block_params and sparse.params == m.block_params_at(3)
    assert sparse.params > 10 * dense.params  # 256 experts stored ...
    assert sparse.fwd_flop < 2 * dense.fwd_flop  # ... 8 (+1 shared) computed
    assert "multi-token-prediction" in (w.provenance.notes or "")


def test_deepseek_v2_lite_without_query_latent(tmp_path: Path) -> None:
    """DeepSeek-V2-Lite's q_lora_rank is null: queries come straight from the hidden state
    (§6.2). 15.7B total (DeepSeek-V2 paper, arXiv 2405.04434: V2-Lite has 15.7B parameters)."""
    data = {"model_type": "deepseek_v2", "hidden_size": 2048, "intermediate_size": 10944,
            "num_hidden_layers": 27, "num_attention_heads": 16, "num_key_value_heads": 16,
            "q_lora_rank": None, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
            "v_head_dim": 128, "n_routed_experts": 64, "num_experts_per_tok": 6, "n_shared_experts": 2,
            "moe_intermediate_size": 1408, "first_k_dense_replace": 1, "vocab_size": 102400,
            "max_position_embeddings": 163840, "tie_word_embeddings": False, "hidden_act": "silu"}
    m = load_workload(_write(tmp_path / "deepseek-v2-lite" / "config.json", data)).model
    assert m.mla is not None and m.mla.q_lora_rank is None
    assert not m.moe or not m.moe.router_bias
    assert m.total_params == pytest.approx(15.7e9, rel=0.005)


def test_moe_flops_follow_the_active_experts() -> None:
    """Model FLOPs of Mixtral are those of its 12.9B active parameters, not of its 46.7B (the
    6N rule: 6 x active non-embedding params x tokens, plus attention)."""
    w = load_workload("mixtral-8x7b")
    m, t = w.model, w.training
    tokens = t.tokens_per_micro_batch
    flop = model_flop_per_iteration(w)
    active_matmul = m.active_params - m.embedding_params - m.layers * 2 * m.hidden - m.hidden
    attention = 3 * m.layers * 4.0 * t.micro_batch * t.seq_len**2 * m.q_width
    assert flop == pytest.approx(6.0 * active_matmul * tokens + attention, rel=1e-9)


def _one_expert(w: Workload) -> Workload:
    moe = {"experts": 1, "experts_per_token": 1, "expert_ffn_hidden": w.model.ffn_hidden}
    shape = w.model.model_validate({**w.model.model_dump(), "moe": moe})
    return w.model_copy(update={"model": shape})


def test_a_dense_model_as_a_one_expert_moe_simulates_the_same() -> None:
    """One expert needs no router and dispatches nothing, so it is the dense MLP: same
    parameters, layers and simulated iteration."""
    dense = load_workload("llama2-7b")
    moe = _one_expert(dense)
    assert moe.model.total_params == moe.model.active_params == dense.model.total_params
    gpu = load_profile("rtx4090-pcie4-ws").gpu
    assert build_layers(moe, gpu) == build_layers(dense, gpu)
    a = simulate(make_run_config("rtx4090-pcie4-ws", dense, "zero-offload")).metrics
    b = simulate(make_run_config("rtx4090-pcie4-ws", moe, "zero-offload")).metrics
    assert b.iteration_time_s == a.iteration_time_s
    assert b.peak_bytes == a.peak_bytes


@pytest.mark.parametrize("workload", ["qwen3-30b-a3b", "mixtral-8x7b"])
def test_shipped_moe_workloads_simulate(workload: str) -> None:
    m = simulate(make_run_config("h100-sxm5-gen5", workload, "zero-infinity-nvme")).metrics
    assert m.feasible and m.iteration_time_s > 0


def _write(path: Path, data: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize(
    ("moe", "field"),
    [
        ({"experts": 8, "experts_per_token": 9, "expert_ffn_hidden": 64}, "experts_per_token (9) must not exceed"),
        ({"experts": 8, "experts_per_token": 2, "expert_ffn_hidden": 64, "dense_layers": [0, 7]}, "dense_layers"),
        ({"experts": 8, "experts_per_token": 2}, "expert_ffn_hidden"),
    ],
)
def test_bad_moe_block_names_file_and_field(tmp_path: Path, moe: dict[str, Any], field: str) -> None:
    text = (Path(__file__).parent.parent / "workloads" / "tiny.yaml").read_text()
    path = tmp_path / "bad-moe.yaml"
    text = text.replace("name: tiny", "name: bad-moe").replace("model:\n", f"model:\n  moe: {json.dumps(moe)}\n")
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_workload(path)
    assert str(path) in str(info.value)
    assert "model" in str(info.value) and field in str(info.value)


def test_bad_expert_count_in_a_config_names_file_and_key(tmp_path: Path) -> None:
    data = json.loads(_config("mixtral-8x7b-v0.1").read_text())
    data["num_experts_per_tok"] = "two"
    path = _write(tmp_path / "m" / "config.json", data)
    with pytest.raises(ConfigError, match="num_experts_per_tok: expected a positive integer") as info:
        load_workload(path)
    assert str(path) in str(info.value)


def test_experts_per_token_above_experts_names_the_file(tmp_path: Path) -> None:
    data = json.loads(_config("mixtral-8x7b-v0.1").read_text())
    data["num_experts_per_tok"] = 9
    path = _write(tmp_path / "m" / "config.json", data)
    with pytest.raises(ConfigError, match="experts_per_token") as info:
        load_workload(path)
    assert str(path) in str(info.value)


def test_llama4_text_config_experts_are_refused_with_file_and_key(tmp_path: Path) -> None:
    """Llama 4's expert layout (always-on shared expert not in the config, interleaved MoE
    layers) is not one offsim reads: refused, not approximated."""
    text = {"model_type": "llama4_text", "hidden_size": 5120, "intermediate_size": 8192,
            "num_hidden_layers": 48, "num_attention_heads": 40, "num_key_value_heads": 8,
            "num_local_experts": 16, "num_experts_per_tok": 1, "vocab_size": 202048}
    path = _write(tmp_path / "scout" / "config.json", {"model_type": "llama4", "text_config": text})
    with pytest.raises(ConfigError, match=r"num_local_experts: 16 experts.*'llama4_text'") as info:
        load_workload(path)
    assert str(path) in str(info.value)


def test_workloads_command_lists_total_and_active_params() -> None:
    from typer.testing import CliRunner

    from offsim.cli import app

    result = CliRunner().invoke(app, ["workloads", "--json"])
    assert result.exit_code == 0
    rows = json.loads(result.output)
    assert rows["mixtral-8x7b"]["summary"].startswith("46.70B params (12.88B active, 8 experts, top-2)")
    assert rows["qwen3-30b-a3b"]["summary"].startswith("30.53B params (3.35B active, 128 experts, top-8)")
    assert rows["qwen3-8b"]["summary"].startswith("8.19B params, ")
