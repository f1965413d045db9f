"""Shipped workloads and the Hugging Face ``config.json`` loader."""

from __future__ import annotations

import datetime
import json
from pathlib import Path

import pytest

from offsim.config.hf import workload_from_hf_config, workload_name
from offsim.config.loading import load_workload, read_yaml, shipped_files
from offsim.errors import ConfigError

HF_DATA = Path(__file__).parent / "data" / "hf"

# Published nominal size and the tolerance it is checked to, per shipped workload. Papers round
# their sizes (and often quote 12*L*h^2, without embeddings), hence the wider tolerances.
NOMINAL: dict[str, tuple[float, float]] = {
    # Radford et al. 2019, Table 2: 1542M (about 1% below the released checkpoint's count).
    "gpt2-1.5b": (1.542e9, 0.02),
    # Llama 2 paper (arXiv 2307.09288) Table 1 sizes; model cards give 6.74B / 13.0B / 69.0B.
    "llama2-7b": (6.74e9, 0.01),
    "llama2-13b": (13.0e9, 0.01),
    "llama2-70b": (70e9, 0.02),
    # Llama 3 Herd paper (arXiv 2407.21783) Table 3: 8B and 70B.
    "llama3-8b": (8e9, 0.01),
    "llama3-70b": (70e9, 0.01),
    # OPT paper (arXiv 2205.01068) Table 1: 30B.
    "opt-30b": (30e9, 0.01),
    # GPT-3 paper (arXiv 2005.14165) Table 2.1: 13.0B and 175.0B.
    "gpt3-13b": (13.0e9, 0.02),
    "gpt3-175b": (175e9, 0.01),
    # Fuyou's benchmark shape of GPT-3 13B (github.com/Crispig/Ratel): no LM head, so 13.0B.
    "fuyou-gpt3-13b": (13.0e9, 0.02),
    # TBA / SSDTrain gives shapes, not sizes: 12 L h^2 = 5.44e9 for (12288, 3); the embeddings
    # (31,546 x 12288) add 7%.
    "tba-bert-12k": (12 * 3 * 12288**2, 0.08),
    # ZeRO-Offload (arXiv 2101.06840) Table 3: "10B" = 12*L*h^2 (10.07e9) rounded; embeddings add 2%.
    "zero-offload-10b": (10e9, 0.03),
    # ZeRO-Infinity (arXiv 2104.07857): 1T on one DGX-2.
    "zero-infinity-1t": (1e12, 0.01),
    # Deep Optimizer States artifact log name "7B": 12*L*h^2 is 6.44e9, so the label rounds up.
    # Deep Optimizer States artifact 7B sample log: "number of parameters ... 5948837888".
    "dos-7b": (5.948837888e9, 1e-6),
    "megatron-1.2b": (1.2e9, 0.02),
    # Qwen3-8B model card: 8.2B (copy in ../shared/reference/config_formats.md §6.3).
    "qwen3-8b": (8.2e9, 0.005),
    # Qwen3-30B-A3B model card: 30.5B total (config_formats.md §6.3).
    "qwen3-30b-a3b": (30.5e9, 0.005),
    # Mistral's Mixtral announcement: 46.7B total (config_formats.md §6.3; the paper rounds to 47B).
    "mixtral-8x7b": (46.7e9, 0.002),
    # Gemma 2 report (arXiv 2408.00118) Table 2: 917,962,752 + 8,324,201,984; the paper's vocabulary
    # is 256128, the file's 256000, so the released checkpoint holds 458,752 fewer.
    "gemma2-9b": (917_962_752 + 8_324_201_984, 1e-4),
}

# Exact parameter counts of the released checkpoints (sum of tensor sizes in the Hugging Face
# weights, as the model cards and the safetensors index report them).
EXACT: dict[str, int] = {
    "gpt2-1.5b": 1_557_611_200,
    "llama2-7b": 6_738_415_616,
    "llama2-13b": 13_015_864_320,
    "llama2-70b": 68_976_648_192,
    "llama3-8b": 8_030_261_248,
    "llama3-70b": 70_553_706_496,
}

LLAMA2_7B_KEYS = {
    "model_type": "llama",
    "hidden_act": "silu",
    "hidden_size": 4096,
    "intermediate_size": 11008,
    "max_position_embeddings": 4096,
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 32,
    "tie_word_embeddings": False,
    "vocab_size": 32000,
}


def write_json(path: Path, data: dict) -> Path:
    """Write ``data`` as JSON to ``path`` (creating its folder) and return the path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))
    return path


# --- shipped workloads -------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(NOMINAL))
def test_shipped_total_params_near_nominal(name: str) -> None:
    nominal, tol = NOMINAL[name]
    total = load_workload(name).model.total_params
    assert total == pytest.approx(nominal, rel=tol), f"{name}: {total:.4e} vs nominal {nominal:.4e}"


@pytest.mark.parametrize("name", sorted(EXACT))
def test_shipped_total_params_match_released_checkpoints(name: str) -> None:
    assert load_workload(name).model.total_params == EXACT[name]


def test_every_real_shipped_workload_has_a_nominal_size() -> None:
    real = {
        n for n, p in shipped_files("workload").items() if read_yaml(p)["provenance"]["kind"] != "synthetic"
    }
    assert real == set(NOMINAL)


@pytest.mark.parametrize("name", sorted(shipped_files("workload")))
def test_shipped_file_conventions(name: str) -> None:
    path = shipped_files("workload")[name]
    raw = read_yaml(path)
    w = load_workload(name)
    assert w.name == path.stem
    assert raw["schema_version"] == 1
    assert datetime.date.fromisoformat(w.provenance.date) <= datetime.date.today()  # an ISO date, not in the future
    assert w.provenance.source.strip()
    if w.provenance.kind != "synthetic":
        assert w.provenance.kind in ("paper", "datasheet", "derived")
        assert w.provenance.notes, "say in notes which values were chosen without a source"


def test_paper_setups_follow_the_published_cases() -> None:
    zo = load_workload("zero-offload-10b")  # published case zo-v100-1gpu-10b
    assert (zo.model.layers, zo.model.hidden, zo.training.micro_batch) == (50, 4096, 10)
    assert (zo.precision.compute, zo.precision.params) == ("fp16", "fp16")
    dos = load_workload("dos-7b")  # published case dos-7b-1gpu-sample (the logged command line)
    assert (dos.model.layers, dos.model.hidden, dos.model.heads, dos.model.ffn_hidden) == (32, 4096, 32, 11008)
    assert (dos.training.seq_len, dos.training.micro_batch, dos.precision.compute) == (2048, 1, "bf16")
    assert load_workload("llama2-70b").model.kv_heads_count == 8
    assert load_workload("llama3-8b").model.kv_heads_count == 8


def test_yaml_with_hidden_not_divisible_by_heads_names_file_and_model(tmp_path: Path) -> None:
    text = shipped_files("workload")["tiny"].read_text().replace("heads: 8", "heads: 3")
    path = tmp_path / "bad-heads.yaml"
    path.write_text(text.replace("name: tiny", "name: bad-heads"))
    with pytest.raises(ConfigError) as info:
        load_workload(path)
    msg = str(info.value)
    assert str(path) in msg
    assert "model" in msg
    assert "divisible by heads" in msg


# --- Hugging Face config.json ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("folder", "shipped"),
    [
        ("llama-2-7b-hf", "llama2-7b"),
        ("meta-llama-3-8b", "llama3-8b"),
        ("gpt2-xl", "gpt2-1.5b"),
        ("opt-30b", "opt-30b"),
    ],
)
def test_hf_config_matches_shipped_workload(folder: str, shipped: str) -> None:
    path = HF_DATA / folder / "config.json"
    w = load_workload(path)
    ref = load_workload(shipped)
    assert w.name == folder
    assert w.provenance.kind == "derived"
    assert w.provenance.source == str(path)
    assert w.model == ref.model
    assert w.model.total_params == ref.model.total_params


def test_hf_default_seq_len_is_context_capped_at_4096() -> None:
    assert load_workload(HF_DATA / "gpt2-xl" / "config.json").training.seq_len == 1024
    assert load_workload(HF_DATA / "meta-llama-3-8b" / "config.json").training.seq_len == 4096


def test_hf_seq_len_and_micro_batch_arguments(tmp_path: Path) -> None:
    path = tmp_path / "m" / "config.json"
    w = workload_from_hf_config(dict(LLAMA2_7B_KEYS), path, seq_len=1024, micro_batch=4)
    assert (w.training.seq_len, w.training.micro_batch) == (1024, 4)
    assert w.name == "m"


def test_hf_gpt_neox_pythia_1b(tmp_path: Path) -> None:
    # EleutherAI/pythia-1b config; Biderman et al. 2023 (arXiv 2304.01373) Table 1 (1,011,781,632).
    data = {
        "model_type": "gpt_neox",
        "hidden_act": "gelu",
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "max_position_embeddings": 2048,
        "num_attention_heads": 8,
        "num_hidden_layers": 16,
        "rotary_pct": 0.25,
        "tie_word_embeddings": False,
        "use_parallel_residual": True,
        "vocab_size": 50304,
    }
    w = load_workload(write_json(tmp_path / "pythia-1b" / "config.json", data))
    assert w.model.total_params == 1_011_781_632
    assert (w.model.mlp, w.model.bias, w.model.learned_positions) == ("standard", True, False)


def test_hf_multimodal_text_config_is_used(tmp_path: Path) -> None:
    data = {"model_type": "llava", "text_config": dict(LLAMA2_7B_KEYS), "vision_config": {}}
    w = load_workload(write_json(tmp_path / "llava" / "config.json", data))
    assert w.model.total_params == EXACT["llama2-7b"]


def test_hf_missing_key_names_file_and_key(tmp_path: Path) -> None:
    data = {k: v for k, v in LLAMA2_7B_KEYS.items() if k != "hidden_size"}
    path = write_json(tmp_path / "broken" / "config.json", data)
    with pytest.raises(ConfigError) as info:
        load_workload(path)
    assert str(path) in str(info.value)
    assert "hidden_size" in str(info.value)


def test_hf_invalid_value_names_file_and_key(tmp_path: Path) -> None:
    path = write_json(tmp_path / "strs" / "config.json", {**LLAMA2_7B_KEYS, "num_hidden_layers": "32"})
    with pytest.raises(ConfigError, match=r"num_hidden_layers: expected a positive integer") as info:
        load_workload(path)
    assert str(path) in str(info.value)


def test_hf_unknown_model_type_lists_every_missing_key(tmp_path: Path) -> None:
    path = write_json(tmp_path / "weird.json", {"model_type": "weird", "hidden_size": 64})
    with pytest.raises(ConfigError) as info:
        load_workload(path)
    msg = str(info.value)
    assert str(path) in msg
    assert "'weird'" in msg
    for key in ("num_hidden_layers", "intermediate_size", "num_attention_heads", "vocab_size"):
        assert key in msg
    assert "hidden_size," not in msg  # present, so not listed


def test_hf_hidden_not_divisible_by_heads(tmp_path: Path) -> None:
    path = write_json(tmp_path / "odd" / "config.json", {**LLAMA2_7B_KEYS, "num_attention_heads": 3})
    with pytest.raises(
        ConfigError, match="hidden_size: 4096 is not divisible by num_attention_heads"
    ) as info:
        load_workload(path)
    assert str(path) in str(info.value)


def test_hf_moe_of_an_unknown_family_is_refused(tmp_path: Path) -> None:
    """An expert count in a family whose expert layout offsim does not read (here a llama file)
    is one error naming the file, the key and the families offsim knows."""
    path = write_json(tmp_path / "x" / "config.json", {**LLAMA2_7B_KEYS, "num_local_experts": 8})
    with pytest.raises(ConfigError, match="num_local_experts: 8 experts") as info:
        load_workload(path)
    assert str(path) in str(info.value)
    assert "mixtral" in str(info.value) and "deepseek_v3" in str(info.value)


def test_hf_opt_projected_embeddings_are_refused(tmp_path: Path) -> None:
    data = json.loads((HF_DATA / "opt-30b" / "config.json").read_text())
    data.update(hidden_size=1024, ffn_dim=4096, num_attention_heads=16, word_embed_proj_dim=512)
    path = write_json(tmp_path / "opt-350m" / "config.json", data)
    with pytest.raises(ConfigError, match="word_embed_proj_dim"):
        load_workload(path)


def test_hf_bad_seq_len_argument_names_training_field(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"training\.seq_len"):
        workload_from_hf_config(dict(LLAMA2_7B_KEYS), tmp_path / "config.json", seq_len=0)


@pytest.mark.parametrize(
    ("path", "name"),
    [
        ("/models/Meta Llama_3.1+8B/config.json", "meta-llama_3.1-8b"),
        ("/models/x/My Model.json", "my-model"),
        ("/models/x/__Qwen2-7B.json", "qwen2-7b"),
        ("/models/x/+++.json", "hf-model"),
    ],
)
def test_workload_name_is_sanitized(path: str, name: str) -> None:
    assert workload_name(Path(path)) == name


def test_no_lm_head_drops_its_flops_and_logits() -> None:
    """``lm_head: false`` (Fuyou's benchmark: MSE loss on the last hidden state): the head layer
    keeps only the final norm, no ``2 t h V`` GEMM and no fp32 softmax of ``4 t V`` bytes."""
    from offsim import load_profile
    from offsim.plan.model import build_layers, model_flop_per_iteration

    with_head = load_workload("gpt3-13b")
    shape = with_head.model.model_copy(update={"lm_head": False})
    without = with_head.model_copy(update={"model": shape})
    gpu = load_profile("rtx4090-pcie4-ws").gpu
    head_with, head_without = build_layers(with_head, gpu)[-1], build_layers(without, gpu)[-1]
    t = with_head.training.tokens_per_micro_batch
    h, v = with_head.model.hidden, with_head.model.vocab
    assert head_with.fwd_flop == pytest.approx(2.0 * t * h * v)
    assert head_without.fwd_flop == 0.0
    assert head_without.act_full_bytes == pytest.approx(2.0 * t * h)
    assert model_flop_per_iteration(with_head) - model_flop_per_iteration(without) == pytest.approx(3 * 2.0 * t * h * v)
    # tied embeddings: the head adds no weights either way, only the final norm
    assert shape.head_params == with_head.model.head_params
