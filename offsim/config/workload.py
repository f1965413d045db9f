"""Workloads: a decoder-only transformer's shape, how it is batched, and its number formats.

Parameter counts follow the usual decoder layout (token embedding, ``layers`` blocks of
attention + MLP, final norm, LM head). Bytes per stored value come from :data:`DTYPE_BYTES`;
8-bit and 4-bit storage of optimizer moments or parameters is allowed (bitsandbytes-style
quantised states; QMoE-style compression).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from offsim.config.base import Frozen, Provenance

StorageDType = Literal["fp32", "fp16", "bf16", "fp8", "int8", "int4", "nf4", "none"]
ComputeDType = Literal["fp32", "tf32", "fp16", "bf16", "fp8"]

DTYPE_BYTES: dict[str, float] = {
    "fp32": 4.0, "tf32": 4.0, "fp16": 2.0, "bf16": 2.0, "fp8": 1.0,
    "int8": 1.0, "int4": 0.5, "nf4": 0.5, "none": 0.0,
}


class ModelShape(Frozen):
    """Shape of a decoder-only transformer.

    Attributes:
        layers: transformer blocks.
        hidden: model width ``h``.
        ffn_hidden: MLP inner width.
        heads / kv_heads: query heads and key/value heads (``kv_heads < heads`` is GQA/MQA).
        vocab: vocabulary size.
        mlp: ``gated`` (SwiGLU: three ``h x ffn`` matrices) or ``standard`` (two).
        bias: linear layers carry biases (GPT-2/GPT-3/OPT) or not (Llama).
        tied_embeddings: the LM head reuses the token embedding.
        learned_positions: a learned position table of ``max_positions x hidden``.
        lm_head: the loss reads the logits of an LM head (``vocab x hidden`` GEMM, fp32
            softmax kept for backward); false: the loss reads the final hidden state (no head
            GEMM or logits), as in Fuyou's released benchmark (github.com/Crispig/Ratel,
            ``gpt_model.py``: MSE loss on the last hidden state).
    """

    layers: int = Field(ge=1)
    hidden: int = Field(ge=1)
    ffn_hidden: int = Field(ge=1)
    heads: int = Field(ge=1)
    kv_heads: int | None = Field(default=None, ge=1)
    vocab: int = Field(ge=1)
    mlp: Literal["gated", "standard"] = "standard"
    bias: bool = False
    tied_embeddings: bool = False
    learned_positions: bool = False
    max_positions: int = Field(default=2048, ge=1)
    lm_head: bool = True

    @model_validator(mode="after")
    def _check(self) -> ModelShape:
        if self.hidden % self.heads:
            raise ValueError(f"hidden ({self.hidden}) must be divisible by heads ({self.heads})")
        if self.heads % self.kv_heads_count:
            raise ValueError(f"heads ({self.heads}) must be divisible by kv_heads ({self.kv_heads})")
        return self

    @property
    def kv_heads_count(self) -> int:
        """Key/value heads (defaults to ``heads``: multi-head attention)."""
        return self.kv_heads if self.kv_heads is not None else self.heads

    @property
    def head_dim(self) -> int:
        """Width of one attention head."""
        return self.hidden // self.heads

    @property
    def block_params(self) -> int:
        """Parameters of one transformer block (attention, MLP, two norms)."""
        h, f = self.hidden, self.ffn_hidden
        kv = self.kv_heads_count * self.head_dim
        attn = h * h + 2 * h * kv + h * h  # Wq, Wk, Wv, Wo
        mlp = (3 if self.mlp == "gated" else 2) * h * f
        norms = 2 * h * (2 if self.bias else 1)  # LayerNorm has a bias, RMSNorm has none
        biases = (h + 2 * kv + h + (2 if self.mlp == "gated" else 1) * f + h) if self.bias else 0
        return attn + mlp + norms + biases

    @property
    def embedding_params(self) -> int:
        """Token (and learned position) embedding parameters."""
        pos = self.max_positions * self.hidden if self.learned_positions else 0
        return self.vocab * self.hidden + pos

    @property
    def head_params(self) -> int:
        """Final norm plus the LM head (zero extra weights when tied or without a head)."""
        head = 0 if (self.tied_embeddings or not self.lm_head) else self.vocab * self.hidden
        return head + self.hidden * (2 if self.bias else 1)

    @property
    def total_params(self) -> int:
        """All parameters."""
        return self.embedding_params + self.layers * self.block_params + self.head_params


class Training(Frozen):
    """How the model is trained.

    Attributes:
        seq_len: tokens per sequence.
        micro_batch: sequences per GPU per forward/backward.
        grad_accumulation: micro-batches per optimizer step.
        data_parallel: data-parallel ranks (GPUs); ZeRO partitions state over them.
        tensor_parallel: GPUs that split every block's weights, GEMMs and most activations
            (Megatron-LM, Shoeybi et al. 2019, arXiv 1909.08053, Sec. 3), without sequence
            parallelism; each data-parallel rank is ``tensor_parallel`` GPUs. offsim simulates one
            GPU of the group (the others run the same schedule).
        activation_checkpointing: keep only each block's input and recompute the rest in
            backward (Chen et al. 2016; Megatron's full recompute).
        flash_attention: attention does not materialise the ``s x s`` score matrix.
    """

    seq_len: int = Field(ge=1)
    micro_batch: int = Field(default=1, ge=1)
    grad_accumulation: int = Field(default=1, ge=1)
    data_parallel: int = Field(default=1, ge=1)
    tensor_parallel: int = Field(default=1, ge=1)
    activation_checkpointing: bool = True
    flash_attention: bool = True

    @property
    def tokens_per_micro_batch(self) -> int:
        """Tokens one GPU processes per micro-batch."""
        return self.seq_len * self.micro_batch


class Precision(Frozen):
    """Storage formats of the training state and the compute format.

    Defaults are mixed-precision Adam: 16-bit params and grads, fp32 master params and
    moments (Micikevicius et al. 2018; 16 bytes/param of model state as in ZeRO, Rajbhandari
    et al. 2020).
    """

    compute: ComputeDType = "bf16"
    params: StorageDType = "bf16"
    grads: StorageDType = "bf16"
    master_params: StorageDType = "fp32"
    optimizer_moments: StorageDType = "fp32"
    optimizer_grads: StorageDType = Field(
        default="fp32", description="format of the gradients the optimizer reads (fp32 copies on the host)"
    )

    @model_validator(mode="after")
    def _check(self) -> Precision:
        if self.params == "none" or self.grads == "none":
            raise ValueError("params and grads need a storage format (not 'none')")
        return self


class Optimizer(Frozen):
    """The optimizer: Adam/AdamW keep two moments, SGD with momentum one, plain SGD none."""

    kind: Literal["adam", "adamw", "sgd-momentum", "sgd"] = "adamw"

    @property
    def moments(self) -> int:
        """Moment tensors per parameter."""
        return {"adam": 2, "adamw": 2, "sgd-momentum": 1, "sgd": 0}[self.kind]


class Workload(Frozen):
    """A model plus how it is trained."""

    schema_version: Literal[1] = 1
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9._-]*$")
    description: str = ""
    provenance: Provenance
    model: ModelShape
    training: Training
    precision: Precision = Precision()
    optimizer: Optimizer = Optimizer()

    @property
    def tokens_per_iteration(self) -> int:
        """Tokens per optimizer step over all data-parallel ranks."""
        t = self.training
        return t.tokens_per_micro_batch * t.grad_accumulation * t.data_parallel
