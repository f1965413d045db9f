"""Workloads from Hugging Face ``config.json`` files.

:func:`workload_from_hf_config` reads the shape keys of the common decoder-only families and
builds a :class:`~offsim.config.workload.Workload` around them:

- **llama-style** (``llama``, ``mistral``, ``qwen2`` and any other ``model_type`` with the same
  keys): ``num_hidden_layers``, ``hidden_size``, ``intermediate_size``, ``num_attention_heads``,
  ``num_key_value_heads`` (default: ``num_attention_heads``), ``vocab_size``,
  ``max_position_embeddings``, ``tie_word_embeddings`` (default false; true for Gemma). RMSNorm, no biases,
  rotary positions; ``hidden_act`` silu/swish gives a gated (SwiGLU) MLP, anything else a
  standard one (Gemma's gated GELU counts as gated).
- **gpt2**: ``n_layer``, ``n_embd``, ``n_head``, ``n_inner`` (default ``4 * n_embd``),
  ``n_positions``, ``vocab_size``. LayerNorm and biases, learned positions, tied LM head.
- **opt**: ``num_hidden_layers``, ``hidden_size``, ``ffn_dim``, ``num_attention_heads``,
  ``vocab_size``, ``max_position_embeddings``, ``word_embed_proj_dim``, ``do_layer_norm_before``,
  ``enable_bias`` (default true), ``tie_word_embeddings`` (default true). Learned positions.
- **gpt_neox** (Pythia, GPT-NeoX-20B): llama-style keys, LayerNorm and biases, standard MLP,
  rotary positions, untied LM head by default.

What :class:`~offsim.config.workload.ModelShape` cannot express is refused with a
:class:`~offsim.errors.ConfigError` rather than approximated (mixture-of-experts layers, an
explicit ``head_dim`` other than ``hidden_size / num_attention_heads``, OPT's projected
embeddings). Differences of a few thousand parameters (OPT's two extra position rows, Qwen2's
q/k/v biases) are accepted and named in the provenance notes, as is every default applied.

Precision is the project default (bf16 mixed-precision AdamW): ``torch_dtype`` is the format the
checkpoint is stored in, not a training choice.
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


class _Keys:
    """Reads typed keys from a config dict, collecting every problem before raising one error."""

    def __init__(self, data: dict[str, Any], path: Path, family: str) -> None:
        self.data, self.path, self.family = data, path, family
        self.missing: list[str] = []
        self.invalid: list[str] = []
        self.notes: list[str] = []

    def integer(self, key: str, default: Any = _MISSING) -> int:
        """A positive integer; ``default`` (recorded in the notes) when absent or null."""
        value = self.data.get(key)
        if value is None:
            if default is _MISSING:
                self.missing.append(key)
                return 1
            self.notes.append(f"{key} absent, taken as {default}")
            return int(default)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            self.invalid.append(f"{key}: expected a positive integer (got {value!r})")
            return 1
        return value

    def flag(self, key: str, default: bool) -> bool:
        """A boolean; ``default`` (recorded in the notes) when absent or null."""
        value = self.data.get(key)
        if value is None:
            self.notes.append(f"{key} absent, taken as {str(default).lower()}")
            return default
        if not isinstance(value, bool):
            self.invalid.append(f"{key}: expected true or false (got {value!r})")
            return default
        return value

    def raise_if_bad(self) -> None:
        """Raise one :class:`ConfigError` listing every missing and invalid key."""
        problems = []
        if self.missing:
            problems.append(f"missing required key(s): {', '.join(self.missing)}")
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
    data = _text_config(data)
    _refuse_unsupported(data, path)
    family, mapper = _family(data)
    keys = _Keys(data, path, family)
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


def _refuse_unsupported(data: dict[str, Any], path: Path) -> None:
    """Refuse configs whose shape :class:`ModelShape` cannot express."""
    for key in _MOE_KEYS:
        value = data.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 1:
            raise ConfigError(
                f"{path}: {key}: mixture-of-experts models ({value} experts) are not expressible "
                "as a dense ModelShape; write a workload YAML for the dense equivalent instead"
            )


def _family(data: dict[str, Any]) -> tuple[str, Callable[[_Keys], dict[str, Any]]]:
    """The key family of ``data`` and its mapper."""
    model_type = str(data.get("model_type", ""))
    if model_type == "gpt2" or (not model_type and "n_embd" in data):
        return "gpt2", _gpt2
    if model_type == "opt" or (not model_type and "ffn_dim" in data):
        return "opt", _opt
    if model_type == "gpt_neox":
        return "gpt_neox", _gpt_neox
    return "llama-style", _llama


def _llama(k: _Keys) -> dict[str, Any]:
    heads = k.integer("num_attention_heads")
    model_type = str(k.data.get("model_type", ""))
    if model_type == "qwen2":
        k.notes.append("qwen2 q/k/v projection biases are not modelled (bias: false)")
    return {
        **_rotary_common(k),
        "heads": heads,
        "kv_heads": k.integer("num_key_value_heads", heads),
        "mlp": "gated" if _gated(k) else "standard",
        "bias": False,
    }


def _gated(k: _Keys) -> bool:
    """Whether the MLP is gated: silu/swish activations (SwiGLU), and Gemma's gated GELU."""
    act = k.data.get("hidden_act", k.data.get("hidden_activation"))
    if act is None:
        k.notes.append("hidden_act absent, taken as silu (gated MLP)")
        act = "silu"
    return str(act).lower() in _GATED_ACTS or str(k.data.get("model_type", "")).startswith("gemma")


def _rotary_common(k: _Keys) -> dict[str, Any]:
    """Keys shared by the rotary-position families (llama-style and gpt_neox)."""
    return {
        "layers": k.integer("num_hidden_layers"),
        "hidden": k.integer("hidden_size"),
        "ffn_hidden": k.integer("intermediate_size"),
        "vocab": k.integer("vocab_size"),
        # Gemma's config class ties by default and its config.json files often omit the key.
        "tied_embeddings": k.flag(
            "tie_word_embeddings", str(k.data.get("model_type", "")).startswith("gemma")
        ),
        "learned_positions": False,
        "max_positions": _optional_int(k, "max_position_embeddings"),
    }


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
    """A positive integer, or ``None`` when absent (the caller decides whether that is an error)."""
    return None if k.data.get(key) is None else k.integer(key)


def _check_heads(shape: dict[str, Any], path: Path, data: dict[str, Any]) -> None:
    """Check the head layout in the config's own key names (the schema would name its fields)."""
    hidden_key, heads_key = (
        ("n_embd", "n_head") if "n_embd" in data else ("hidden_size", "num_attention_heads")
    )
    hidden, heads, kv = shape["hidden"], shape["heads"], shape.get("kv_heads") or shape["heads"]
    if hidden % heads:
        raise ConfigError(f"{path}: {hidden_key}: {hidden} is not divisible by {heads_key} ({heads})")
    if heads % kv:
        raise ConfigError(f"{path}: num_key_value_heads: {heads_key} ({heads}) is not divisible by {kv}")
    head_dim = data.get("head_dim")
    if isinstance(head_dim, int) and head_dim != hidden // heads:
        raise ConfigError(
            f"{path}: head_dim: {head_dim} differs from {hidden_key} / {heads_key} = {hidden // heads}; "
            "ModelShape derives the head width from the hidden size"
        )


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
