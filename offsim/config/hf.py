"""Workloads from Hugging Face ``config.json`` files.

:func:`workload_from_hf_config` reads the shape keys of the common decoder-only families and
builds a :class:`~offsim.config.workload.Workload` around them:

- **llama-style** (``llama``, ``mistral``, ``qwen2``, ``qwen3``, ``gemma``, ``gemma2``,
  ``gemma3_text`` and any other ``model_type`` with the same keys): ``num_hidden_layers``,
  ``hidden_size``, ``intermediate_size``, ``num_attention_heads``, ``num_key_value_heads``
  (default: ``num_attention_heads``, i.e. no GQA), ``head_dim`` (default ``hidden_size /
  num_attention_heads``), ``vocab_size``, ``max_position_embeddings``, ``tie_word_embeddings``.
  RMSNorm, rotary positions; ``hidden_act`` silu/swish gives a gated (SwiGLU) MLP, anything else
  a standard one (Gemma's gated GELU counts as gated). Per family: Qwen2's q/k/v biases, Qwen3's
  and Gemma 3's per-head q/k norms, Gemma 2/3's four norms per block.
- **mixture of experts**, the MLP keys of each family (``../shared/reference/config_formats.md``
  §6.2): ``mixtral`` (``num_local_experts``, ``num_experts_per_tok``, experts of
  ``intermediate_size``); ``qwen2_moe`` / ``qwen3_moe`` (``num_experts``,
  ``moe_intermediate_size``, ``shared_expert_intermediate_size`` with its gate, dense layers from
  ``mlp_only_layers`` and ``decoder_sparse_step``); ``olmoe`` (experts of ``intermediate_size``,
  full-width q/k norms); ``deepseek_v2`` / ``deepseek_v3`` (``n_routed_experts``,
  ``n_shared_experts``, ``first_k_dense_replace``, ``moe_layer_freq``, ``moe_intermediate_size``,
  and multi-head latent attention from ``q_lora_rank``, ``kv_lora_rank``, ``qk_nope_head_dim``,
  ``qk_rope_head_dim``, ``v_head_dim``; the ``head_dim`` transformers writes for DeepSeek is the
  rotary width and is ignored). An expert count in any other family is refused.
- **gpt2**: ``n_layer``, ``n_embd``, ``n_head``, ``n_inner`` (default ``4 * n_embd``),
  ``n_positions``, ``vocab_size``. LayerNorm and biases, learned positions, tied LM head.
- **opt**: ``num_hidden_layers``, ``hidden_size``, ``ffn_dim``, ``num_attention_heads``,
  ``vocab_size``, ``max_position_embeddings``, ``word_embed_proj_dim``, ``do_layer_norm_before``,
  ``enable_bias`` (default true), ``tie_word_embeddings`` (default true). Learned positions.
- **gpt_neox** (Pythia, GPT-NeoX-20B): llama-style keys, LayerNorm and biases, standard MLP,
  rotary positions, untied LM head by default.

A multimodal config (Gemma 3, LLaVA-style) is read from its ``text_config``; the vision tower and
projector are not counted (named in the notes). A key absent from the file takes the default of
its ``model_type``'s transformers config class where offsim knows it (:data:`CLASS_DEFAULTS`;
e.g. Gemma 3's text config usually omits its heads and vocabulary), and every default applied is
named in the provenance notes. What :class:`~offsim.config.workload.ModelShape` cannot express is
refused with a :class:`~offsim.errors.ConfigError` naming the file and the key (OPT's projected
embeddings, an unknown expert layout). Differences of a few thousand parameters (OPT's two extra
position rows, an o-projection bias) are accepted and named in the notes.

Precision is the project default (bf16 mixed-precision AdamW): ``torch_dtype`` (``dtype`` in
transformers v5 files) is the format the checkpoint is stored in, not a training choice.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from offsim.config.base import Provenance
from offsim.config.errors import format_validation_error
from offsim.config.workload import Workload
from offsim.errors import ConfigError

_GATED_ACTS = frozenset({"silu", "swish", "swiglu"})
_MOE_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")
_MAX_DEFAULT_SEQ = 4096
_MISSING = object()

#: Defaults of transformers' config classes for keys their ``config.json`` files may omit (a
#: missing key takes its class's default, not the Llama-style one). Read from transformers
#: ``models/<type>/configuration_<type>.py``: gemma3 at ``008f5c8c29``, qwen3 / qwen2_moe /
#: deepseek_v2 at ``008e574391``, deepseek_v3 at ``001f85b38f``; gemma / gemma2 / mixtral as
#: summarised in ../shared/reference/config_formats.md §6.1.
CLASS_DEFAULTS: dict[str, dict[str, Any]] = {
    "gemma": {"head_dim": 256, "tie_word_embeddings": True},
    "gemma2": {"head_dim": 256, "tie_word_embeddings": True},
    "gemma3_text": {"vocab_size": 262_208, "num_attention_heads": 8, "num_key_value_heads": 4,
                    "head_dim": 256, "max_position_embeddings": 131_072, "tie_word_embeddings": True},
    "qwen3": {"head_dim": 128},
    "qwen2_moe": {"shared_expert_intermediate_size": 5632, "decoder_sparse_step": 1, "qkv_bias": True},
    "qwen3_moe": {"decoder_sparse_step": 1},
    "mixtral": {"num_local_experts": 8, "num_experts_per_tok": 2},
    "deepseek_v2": {"first_k_dense_replace": 0, "kv_lora_rank": 512, "q_lora_rank": 1536,
                    "n_routed_experts": 64, "n_shared_experts": 2, "qk_nope_head_dim": 128,
                    "qk_rope_head_dim": 64, "v_head_dim": 128, "moe_intermediate_size": 1407},
    "deepseek_v3": {"first_k_dense_replace": 3, "kv_lora_rank": 512, "q_lora_rank": 1536,
                    "n_routed_experts": 256, "n_shared_experts": 1, "qk_nope_head_dim": 128,
                    "qk_rope_head_dim": 64, "v_head_dim": 128, "moe_intermediate_size": 2048,
                    "num_experts_per_tok": 8},
}

#: Per-head RMSNorm on q and k (``head``) or over their full widths (``full``), by model_type.
_QK_NORM = {"qwen3": "head", "qwen3_moe": "head", "gemma3_text": "head", "olmoe": "full"}
#: Norms per block where they are not two (pre- and post-norm around attention and MLP).
_NORMS_PER_BLOCK = {"gemma2": 4, "gemma3_text": 4}
#: Families whose q/k/v projections carry biases (hard-coded for Qwen2; ``qkv_bias`` key later).
_QKV_BIAS = frozenset({"qwen2", "qwen2_moe"})
#: Families whose expert layout offsim reads (``config_formats.md`` §6.2).
MOE_FAMILIES = ("mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "deepseek_v2", "deepseek_v3")


class _Keys:
    """Reads typed keys from a config dict, collecting every problem before raising one error.

    A key absent (or null) from ``data`` is looked up in ``outer`` (the top level of a multimodal
    config) for the keys that may sit there, then in :data:`CLASS_DEFAULTS` of the model type,
    then in the default the caller gives; each default applied is noted."""

    def __init__(self, data: dict[str, Any], path: Path, family: str, outer: dict[str, Any] | None = None) -> None:
        self.data, self.path, self.family = data, path, family
        self.outer = outer or {}
        self.model_type = str(data.get("model_type", ""))
        self.class_defaults = CLASS_DEFAULTS.get(self.model_type, {})
        self.missing: list[str] = []
        self.invalid: list[str] = []
        self.notes: list[str] = []

    def _default(self, key: str, default: Any) -> Any:
        """The class default of ``key`` (noted), else ``default`` (noted unless missing)."""
        if key in self.class_defaults:
            value = self.class_defaults[key]
            self.notes.append(f"{key} absent, taken as the {self.model_type} class default {value}")
            return value
        if default is not _MISSING:
            shown = str(default).lower() if isinstance(default, bool) else default
            self.notes.append(f"{key} absent, taken as {shown}")
        return default

    def integer(self, key: str, default: Any = _MISSING) -> int:
        """A positive integer; the class default or ``default`` (noted) when absent or null."""
        value = self.data.get(key)
        if value is None:
            value = self._default(key, default)
            if value is _MISSING:
                self.missing.append(key)
                return 1
            return int(value)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            self.invalid.append(f"{key}: expected a positive integer (got {value!r})")
            return 1
        return value

    def count(self, key: str, default: int) -> int:
        """A non-negative integer (a count that may be zero or null, e.g. shared experts)."""
        value = self.data.get(key)
        if value is None:
            return int(self._default(key, default))
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            self.invalid.append(f"{key}: expected a non-negative integer (got {value!r})")
            return 0
        return value

    def flag(self, key: str, default: bool) -> bool:
        """A boolean; from the outer config, the class default or ``default`` when absent."""
        value = self.data.get(key)
        if value is None and self.outer.get(key) is not None:
            value = self.outer[key]
            self.notes.append(f"{key} read from the top level of the multimodal config")
        if value is None:
            return bool(self._default(key, default))
        if not isinstance(value, bool):
            self.invalid.append(f"{key}: expected true or false (got {value!r})")
            return default
        return value

    def int_list(self, key: str) -> list[int]:
        """A list of non-negative integers (layer indices); empty when absent or null."""
        value = self.data.get(key)
        if value is None:
            return []
        if not isinstance(value, list) or any(isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in value):
            self.invalid.append(f"{key}: expected a list of layer indices (got {value!r})")
            return []
        return value

    def raise_if_bad(self) -> None:
        """Raise one :class:`ConfigError` listing every missing and invalid key."""
        problems = []
        if self.missing:
            problems.append(f"missing required key(s): {', '.join(dict.fromkeys(self.missing))}")
        problems += self.invalid
        if problems:
            model_type = self.data.get("model_type", "unknown")
            raise ConfigError(
                f"{self.path}: cannot map Hugging Face config (model_type {model_type!r}, read as "
                f"{self.family}): " + "; ".join(problems)
            )


def workload_from_hf_config(
    data: dict[str, Any], path: Path, *, seq_len: int | None = None, micro_batch: int = 1
) -> Workload:
    """Build a workload from a Hugging Face ``config.json`` already parsed into ``data``.

    Args:
        data: the parsed config (a multimodal config's ``text_config`` is used when the top
            level has no layer count).
        path: the file it came from (named in errors; gives the workload's name and source).
        seq_len: tokens per sequence; default ``min(max_position_embeddings, 4096)``.
        micro_batch: sequences per GPU per forward/backward.

    Raises:
        ConfigError: naming ``path`` and the missing or invalid keys when the config cannot be
            mapped onto :class:`~offsim.config.workload.ModelShape`.
    """
    path = Path(path)
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a JSON object of config keys, got {type(data).__name__}")
    outer, data = data, _text_config(data)
    family, mapper = _family(data, path)
    keys = _Keys(data, path, family, outer if outer is not data else None)
    if outer is not data:
        keys.notes.append("language model read from text_config"
                          + ("; its vision tower and projector are not counted" if "vision_config" in outer else ""))
    shape = mapper(keys)
    context = shape.get("max_positions")
    if context is None and seq_len is None:
        keys.missing.append("max_position_embeddings (or pass seq_len)")
    keys.raise_if_bad()
    _check_heads(shape, path, data)
    if context is None:
        shape["max_positions"] = seq_len
    return _build(data, path, family, keys.notes, shape, seq_len, micro_batch)


def _text_config(data: dict[str, Any]) -> dict[str, Any]:
    """The language-model part of a config: ``text_config`` of a multimodal model, else ``data``."""
    text = data.get("text_config")
    if isinstance(text, dict) and "num_hidden_layers" not in data and "n_layer" not in data:
        return text
    return data


def _expert_count(data: dict[str, Any]) -> tuple[str, int] | None:
    """The first expert-count key with more than one expert, and its value."""
    for key in _MOE_KEYS:
        value = data.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 1:
            return key, value
    return None


def _family(data: dict[str, Any], path: Path) -> tuple[str, Callable[[_Keys], dict[str, Any]]]:
    """The key family of ``data`` and its mapper; an expert count in a family whose expert layout
    offsim does not know is refused."""
    model_type = str(data.get("model_type", ""))
    experts = _expert_count(data)
    if experts is not None and model_type not in MOE_FAMILIES:
        key, value = experts
        raise ConfigError(
            f"{path}: {key}: {value} experts, but the mixture-of-experts layout of model_type "
            f"{model_type!r} is not one offsim reads (known: {', '.join(MOE_FAMILIES)}); write a "
            "workload YAML with a model.moe block instead"
        )
    if model_type == "gpt2" or (not model_type and "n_embd" in data):
        return "gpt2", _gpt2
    if model_type == "opt" or (not model_type and "ffn_dim" in data):
        return "opt", _opt
    if model_type == "gpt_neox":
        return "gpt_neox", _gpt_neox
    if model_type in ("deepseek_v2", "deepseek_v3"):
        return f"{model_type} (MLA, mixture of experts)", _deepseek
    if model_type in MOE_FAMILIES:
        return f"{model_type} (mixture of experts)", _llama
    return "llama-style", _llama


def _llama(k: _Keys) -> dict[str, Any]:
    heads = k.integer("num_attention_heads")
    model_type = k.model_type
    return {
        **_rotary_common(k),
        "heads": heads,
        "kv_heads": k.integer("num_key_value_heads", heads),
        "head_dim": _optional_int(k, "head_dim"),
        "mlp": "gated" if _gated(k) else "standard",
        "bias": False,
        "qkv_bias": _qkv_bias(k),
        "qk_norm": _QK_NORM.get(model_type, "none"),
        "norms_per_block": _NORMS_PER_BLOCK.get(model_type, 2),
        "moe": _moe(k),
    }


def _qkv_bias(k: _Keys) -> bool:
    """Whether q, k and v carry biases: Qwen2's (``qkv_bias``, hard-coded in older files), or
    ``attention_bias`` (whose o-projection bias, ``hidden`` per block, is not counted)."""
    if k.model_type in _QKV_BIAS:
        return k.flag("qkv_bias", True)
    if k.data.get("attention_bias") is True:
        k.notes.append("attention_bias: the o_proj bias (hidden_size per block) is not counted")
        return True
    return False


def _gated(k: _Keys) -> bool:
    """Whether the MLP is gated: silu/swish activations (SwiGLU), and Gemma's gated GELU."""
    act = k.data.get("hidden_act", k.data.get("hidden_activation"))
    if act is None and k.model_type.startswith("gemma"):
        k.notes.append("hidden_activation absent, taken as gelu_pytorch_tanh (Gemma's gated GELU)")
        return True
    if act is None:
        k.notes.append("hidden_act absent, taken as silu (gated MLP)")
        act = "silu"
    return str(act).lower() in _GATED_ACTS or k.model_type.startswith("gemma")


def _rotary_common(k: _Keys) -> dict[str, Any]:
    """Keys shared by the rotary-position families (llama-style, MoE, DeepSeek and gpt_neox)."""
    return {
        "layers": k.integer("num_hidden_layers"),
        "hidden": k.integer("hidden_size"),
        "ffn_hidden": k.integer("intermediate_size"),
        "vocab": k.integer("vocab_size"),
        # Gemma's config class ties by default and its config.json files often omit the key.
        "tied_embeddings": k.flag("tie_word_embeddings", k.model_type.startswith("gemma")),
        "learned_positions": False,
        "max_positions": _optional_int(k, "max_position_embeddings"),
    }


def _moe(k: _Keys) -> dict[str, Any] | None:
    """The ``moe`` block of a Mixtral, Qwen2/3-MoE or OLMoE config (None for dense families)."""
    mt = k.model_type
    if mt not in ("mixtral", "qwen2_moe", "qwen3_moe", "olmoe"):
        return None
    layers = k.integer("num_hidden_layers")
    if mt == "mixtral":
        return _moe_block(k.integer("num_local_experts"), k, k.integer("intermediate_size"))
    if mt == "olmoe":  # experts of intermediate_size; OLMoE has no moe_intermediate_size
        return _moe_block(k.integer("num_experts"), k, k.integer("intermediate_size"))
    step = k.integer("decoder_sparse_step", 1)
    only = set(k.int_list("mlp_only_layers"))
    dense = [i for i in range(layers) if i in only or (i + 1) % step]
    block = _moe_block(k.integer("num_experts"), k, k.integer("moe_intermediate_size"), dense)
    if mt == "qwen2_moe":
        shared = k.count("shared_expert_intermediate_size", 0)
        if shared:
            block.update(shared_experts=1, shared_ffn_hidden=shared, shared_expert_gate=True)
    return block


def _moe_block(experts: int, k: _Keys, width: int, dense: list[int] | None = None) -> dict[str, Any]:
    """A ``moe`` block with ``num_experts_per_tok`` experts per token."""
    block: dict[str, Any] = {"experts": experts, "experts_per_token": k.integer("num_experts_per_tok"),
                             "expert_ffn_hidden": width}
    if dense:
        block["dense_layers"] = dense
    return block


def _deepseek(k: _Keys) -> dict[str, Any]:
    """DeepSeek-V2/V3: multi-head latent attention, shared + routed experts, dense first layers
    (``first_k_dense_replace``; ``moe_layer_freq`` of the remote-code files, default 1). V3's
    router has a score-correction bias; its multi-token-prediction layers are not counted."""
    heads = k.integer("num_attention_heads")
    layers = k.integer("num_hidden_layers")
    width = k.integer("moe_intermediate_size")
    first_dense, freq = k.count("first_k_dense_replace", 0), k.integer("moe_layer_freq", 1)
    moe = _moe_block(k.integer("n_routed_experts"), k, width,
                     [i for i in range(layers) if i < first_dense or i % freq])
    moe.update(shared_experts=k.count("n_shared_experts", 0), router_bias=k.model_type == "deepseek_v3")
    if k.data.get("num_nextn_predict_layers"):
        k.notes.append(f"num_nextn_predict_layers: {k.data['num_nextn_predict_layers']} multi-token-prediction "
                       "layer(s) not counted (not part of the main model)")
    if "head_dim" in k.data:
        k.notes.append("head_dim ignored (transformers sets it to qk_rope_head_dim for DeepSeek)")
    return {
        **_rotary_common(k),
        "heads": heads,
        "mlp": "gated" if _gated(k) else "standard",
        "mla": {
            "q_lora_rank": _q_lora_rank(k),
            "kv_lora_rank": k.integer("kv_lora_rank"),
            "qk_nope_head_dim": k.integer("qk_nope_head_dim"),
            "qk_rope_head_dim": k.integer("qk_rope_head_dim"),
            "v_head_dim": k.integer("v_head_dim"),
        },
        "moe": moe,
    }


def _q_lora_rank(k: _Keys) -> int | None:
    """``q_lora_rank``: null means queries are projected straight from the hidden state
    (DeepSeek-V2-Lite); absent takes the class default."""
    if "q_lora_rank" in k.data and k.data["q_lora_rank"] is None:
        return None
    return k.integer("q_lora_rank")


def _gpt2(k: _Keys) -> dict[str, Any]:
    hidden = k.integer("n_embd")
    return {
        "layers": k.integer("n_layer"),
        "hidden": hidden,
        "ffn_hidden": k.integer("n_inner", 4 * hidden),
        "heads": k.integer("n_head"),
        "vocab": k.integer("vocab_size"),
        "mlp": "standard",
        "bias": True,
        "tied_embeddings": k.flag("tie_word_embeddings", True),
        "learned_positions": True,
        "max_positions": k.integer("n_positions"),
    }


def _opt(k: _Keys) -> dict[str, Any]:
    hidden = k.integer("hidden_size")
    proj = k.integer("word_embed_proj_dim", hidden)
    if proj != hidden and not k.missing:
        k.invalid.append(
            f"word_embed_proj_dim: {proj} differs from hidden_size {hidden}; projected embeddings "
            "(OPT-350m) are not expressible as a ModelShape"
        )
    if not k.flag("do_layer_norm_before", True) or k.data.get("_remove_final_layer_norm") is True:
        k.notes.append("this OPT variant has no final LayerNorm; counted anyway (2 * hidden parameters)")
    k.notes.append("OPT's 2 extra position rows (padding offset) are not modelled")
    return {
        "layers": k.integer("num_hidden_layers"),
        "hidden": hidden,
        "ffn_hidden": k.integer("ffn_dim"),
        "heads": k.integer("num_attention_heads"),
        "vocab": k.integer("vocab_size"),
        "mlp": "standard",
        "bias": k.flag("enable_bias", True),
        "tied_embeddings": k.flag("tie_word_embeddings", True),
        "learned_positions": True,
        "max_positions": k.integer("max_position_embeddings"),
    }


def _gpt_neox(k: _Keys) -> dict[str, Any]:
    return {
        **_rotary_common(k),
        "heads": k.integer("num_attention_heads"),
        "mlp": "standard",
        "bias": k.flag("attention_bias", True),
    }


def _optional_int(k: _Keys, key: str) -> int | None:
    """A positive integer, or ``None`` when absent and without a class default (the caller decides
    whether that is an error)."""
    if k.data.get(key) is None and key not in k.class_defaults:
        return None
    return k.integer(key)


def _check_heads(shape: dict[str, Any], path: Path, data: dict[str, Any]) -> None:
    """Check the head layout in the config's own key names (the schema would name its fields); an
    explicit ``head_dim`` equal to ``hidden / heads`` is dropped (the shape derives it)."""
    if shape.get("mla") is not None:
        return
    hidden_key, heads_key = (
        ("n_embd", "n_head") if "n_embd" in data else ("hidden_size", "num_attention_heads")
    )
    hidden, heads, kv = shape["hidden"], shape["heads"], shape.get("kv_heads") or shape["heads"]
    head_dim = shape.get("head_dim")
    if head_dim is not None and hidden % heads == 0 and head_dim == hidden // heads:
        shape["head_dim"] = head_dim = None
    if head_dim is None and hidden % heads:
        raise ConfigError(f"{path}: {hidden_key}: {hidden} is not divisible by {heads_key} ({heads}); "
                          "give head_dim")
    if heads % kv:
        raise ConfigError(f"{path}: num_key_value_heads: {heads_key} ({heads}) is not divisible by {kv}")


def _build(
    data: dict[str, Any],
    path: Path,
    family: str,
    notes: list[str],
    shape: dict[str, Any],
    seq_len: int | None,
    micro_batch: int,
) -> Workload:
    """Assemble and validate the workload; schema errors become a :class:`ConfigError`."""
    seq = seq_len if seq_len is not None else min(shape["max_positions"], _MAX_DEFAULT_SEQ)
    model_type = data.get("model_type", "unknown")
    provenance = Provenance(
        kind="derived",
        source=str(path),
        date=dt.date.today().isoformat(),
        notes=f"Hugging Face config, model_type {model_type!r}, read as {family}"
        + (f"; {'; '.join(notes)}" if notes else "")
        + ". Training and precision are offsim defaults.",
    )
    try:
        return Workload.model_validate(
            {
                "name": workload_name(path),
                "description": f"{model_type} shape from {path}",
                "provenance": provenance,
                "model": shape,
                "training": {"seq_len": seq, "micro_batch": micro_batch},
            }
        )
    except ValidationError as exc:
        raise ConfigError(format_validation_error(str(path), exc)) from None


def workload_name(path: Path) -> str:
    """A workload name for ``path``: its folder's name for ``config.json``, else its stem.

    Lowercased; runs of characters outside ``[a-z0-9._-]`` become one hyphen, and leading
    punctuation is dropped, so the result matches ``^[a-z0-9][a-z0-9._-]*$``.
    """
    path = Path(path)
    raw = path.parent.resolve().name if path.stem == "config" else path.stem
    name = re.sub(r"[^a-z0-9._-]+", "-", raw.lower()).lstrip("._-")
    return name or "hf-model"
