"""Workloads: a decoder-only transformer's shape, how it is batched, and its number formats.

Parameter counts follow the usual decoder layout (token embedding, ``layers`` blocks of
attention + MLP, final norm, LM head). Bytes per stored value come from :data:`DTYPE_BYTES`;
8-bit and 4-bit storage of optimizer moments or parameters is allowed (bitsandbytes-style
quantised states; QMoE-style compression).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from offsim.config.assumed import AssumedRange, check_assumed
from offsim.config.base import Frozen, Provenance

StorageDType = Literal["fp32", "fp16", "bf16", "fp8", "int8", "int4", "nf4", "none"]
ComputeDType = Literal["fp32", "tf32", "fp16", "bf16", "fp8"]

DTYPE_BYTES: dict[str, float] = {
    "fp32": 4.0, "tf32": 4.0, "fp16": 2.0, "bf16": 2.0, "fp8": 1.0,
    "int8": 1.0, "int4": 0.5, "nf4": 0.5, "none": 0.0,
}


class MLA(Frozen):
    """Multi-head latent attention (DeepSeek-V2/V3, arXiv 2405.04434 Sec. 2.1): queries and keys/values
    pass through low-rank latents; each of the ``heads`` query/key heads is ``qk_nope_head_dim +
    qk_rope_head_dim`` wide and each value head ``v_head_dim``.

    Attributes:
        q_lora_rank: width of the query latent (``None``: queries projected straight from the
            hidden state, as in DeepSeek-V2-Lite).
        kv_lora_rank: width of the key/value latent.
        qk_nope_head_dim / qk_rope_head_dim: the non-rotary and rotary parts of a query/key head.
        v_head_dim: width of a value head.
    """

    q_lora_rank: int | None = Field(default=None, ge=1)
    kv_lora_rank: int = Field(ge=1)
    qk_nope_head_dim: int = Field(ge=1)
    qk_rope_head_dim: int = Field(ge=1)
    v_head_dim: int = Field(ge=1)


class MoE(Frozen):
    """Mixture-of-experts MLPs: each token goes to ``experts_per_token`` of ``experts`` routed
    experts (plus every shared expert), so all experts are stored, offloaded and updated while only
    the chosen ones cost FLOPs (Fedus et al. 2022; Mixtral, arXiv 2401.04088).

    Attributes:
        experts: routed experts per MoE layer (``E``); one expert is a dense MLP, with no router.
        experts_per_token: experts each token is routed to (``k``).
        expert_ffn_hidden: inner width of one routed expert.
        shared_experts: experts every token passes through (DeepSeek's ``n_shared_experts``; one
            for Qwen2-MoE).
        shared_ffn_hidden: inner width of one shared expert (default ``expert_ffn_hidden``).
        shared_expert_gate: a ``1 x hidden`` sigmoid gate on the shared expert (Qwen2-MoE).
        router_bias: the router has an ``E``-sized bias (DeepSeek-V3's score-correction bias).
        dense_layers: indices of the blocks with a dense MLP of ``ffn_hidden`` instead (DeepSeek's
            first ``first_k_dense_replace`` blocks, Qwen-MoE's ``mlp_only_layers``).
    """

    experts: int = Field(ge=1)
    experts_per_token: int = Field(ge=1)
    expert_ffn_hidden: int = Field(ge=1)
    shared_experts: int = Field(default=0, ge=0)
    shared_ffn_hidden: int | None = Field(default=None, ge=1)
    shared_expert_gate: bool = False
    router_bias: bool = False
    dense_layers: list[int] = Field(default_factory=list)

    @model_validator(mode="after")
    def _check(self) -> MoE:
        if self.experts_per_token > self.experts:
            raise ValueError(
                f"experts_per_token ({self.experts_per_token}) must not exceed experts ({self.experts})")
        if len(set(self.dense_layers)) != len(self.dense_layers):
            raise ValueError("dense_layers lists a block twice")
        return self

    @property
    def shared_width(self) -> int:
        """Inner width of one shared expert."""
        return self.shared_ffn_hidden if self.shared_ffn_hidden is not None else self.expert_ffn_hidden

    @property
    def routed(self) -> bool:
        """True when tokens are routed (more than one expert): a router, and tokens dispatched."""
        return self.experts > 1


class ModelShape(Frozen):
    """Shape of a decoder-only transformer.

    Attributes:
        layers: transformer blocks.
        hidden: model width ``h``.
        ffn_hidden: MLP inner width (of the dense blocks when ``moe`` is set).
        heads / kv_heads: query heads and key/value heads (``kv_heads < heads`` is GQA/MQA).
        head_dim: width of one attention head when it is not ``hidden / heads`` (Qwen3, Gemma);
            query width ``heads x head_dim``, key/value width ``kv_heads x head_dim``.
        vocab: vocabulary size.
        mlp: ``gated`` (SwiGLU: three ``h x ffn`` matrices) or ``standard`` (two).
        bias: linear layers carry biases (GPT-2/GPT-3/OPT) or not (Llama).
        qkv_bias: only the query, key and value projections carry biases (Qwen2).
        qk_norm: RMSNorm on queries and keys: ``head`` (one ``head_dim`` weight each, Qwen3 and
            Gemma 3), ``full`` (over the whole query and key widths, OLMoE) or ``none``.
        norms_per_block: norm layers per block (2; 4 for Gemma 2/3's pre- and post-norms).
        tied_embeddings: the LM head reuses the token embedding.
        learned_positions: a learned position table of ``max_positions x hidden``.
        lm_head: the loss reads the logits of an LM head (``vocab x hidden`` GEMM, fp32
            softmax kept for backward); false: the loss reads the final hidden state (no head
            GEMM or logits), as in Fuyou's released benchmark (github.com/Crispig/Ratel,
            ``gpt_model.py``: MSE loss on the last hidden state).
        mla: multi-head latent attention instead of standard attention (DeepSeek).
        moe: mixture-of-experts MLPs (absent: every block has a dense MLP).
    """

    layers: int = Field(ge=1)
    hidden: int = Field(ge=1)
    ffn_hidden: int = Field(ge=1)
    heads: int = Field(ge=1)
    kv_heads: int | None = Field(default=None, ge=1)
    head_dim: int | None = Field(default=None, ge=1)
    vocab: int = Field(ge=1)
    mlp: Literal["gated", "standard"] = "standard"
    bias: bool = False
    qkv_bias: bool = False
    qk_norm: Literal["none", "head", "full"] = "none"
    norms_per_block: int = Field(default=2, ge=1)
    tied_embeddings: bool = False
    learned_positions: bool = False
    max_positions: int = Field(default=2048, ge=1)
    lm_head: bool = True
    mla: MLA | None = None
    moe: MoE | None = None

    @model_validator(mode="after")
    def _check(self) -> ModelShape:
        if self.head_dim is None and self.mla is None and self.hidden % self.heads:
            raise ValueError(f"hidden ({self.hidden}) must be divisible by heads ({self.heads}), "
                             "or give head_dim")
        if self.heads % self.kv_heads_count:
            raise ValueError(f"heads ({self.heads}) must be divisible by kv_heads ({self.kv_heads})")
        if self.moe is not None:
            outside = [i for i in self.moe.dense_layers if not 0 <= i < self.layers]
            if outside:
                raise ValueError(f"moe.dense_layers: {outside} outside blocks 0..{self.layers - 1}")
        return self

    @property
    def kv_heads_count(self) -> int:
        """Key/value heads (defaults to ``heads``: multi-head attention)."""
        return self.kv_heads if self.kv_heads is not None else self.heads

    @property
    def head_width(self) -> int:
        """Width of one attention head: ``head_dim``, else ``hidden / heads``."""
        return self.head_dim if self.head_dim is not None else self.hidden // self.heads

    @property
    def q_width(self) -> int:
        """Width of all query heads together (``hidden`` unless ``head_dim`` says otherwise)."""
        if self.mla is not None:
            return self.heads * (self.mla.qk_nope_head_dim + self.mla.qk_rope_head_dim)
        return self.hidden if self.head_dim is None else self.heads * self.head_dim

    @property
    def kv_width(self) -> int:
        """Width of all key heads together (and of all value heads; MLA: of the value heads)."""
        if self.mla is not None:
            return self.heads * self.mla.v_head_dim
        return self.kv_heads_count * self.head_width

    def attention_matrices(self) -> list[int]:
        """Elements of each attention weight matrix, in Hugging Face module order: Wq, Wk, Wv, Wo;
        with MLA the query path (``q_a``, ``q_b`` or one ``q``), the key/value path (``kv_a``
        including the shared rotary key, ``kv_b``) and Wo."""
        h = self.hidden
        if self.mla is None:
            q, kv = self.q_width, self.kv_heads_count * self.head_width
            return [h * q, h * kv, h * kv, q * h]
        a, qk = self.mla, self.q_width
        q_path = [h * a.q_lora_rank, a.q_lora_rank * qk] if a.q_lora_rank is not None else [h * qk]
        kv_b = a.kv_lora_rank * self.heads * (a.qk_nope_head_dim + a.v_head_dim)
        return [*q_path, h * (a.kv_lora_rank + a.qk_rope_head_dim), kv_b, self.kv_width * h]

    @property
    def attention_params(self) -> int:
        """Parameters of one block's attention: its matrices, q/k/v biases, q/k norms and MLA's
        latent norms (the block's other norms are counted apart)."""
        extra = 0
        if self.mla is not None:
            extra = self.mla.kv_lora_rank + (self.mla.q_lora_rank or 0)  # q_a / kv_a layernorms
        elif self.qkv_bias:
            extra = self.q_width + 2 * self.kv_heads_count * self.head_width
        if self.qk_norm == "head":
            extra += 2 * self.head_width
        elif self.qk_norm == "full":
            extra += self.q_width + self.kv_heads_count * self.head_width
        return sum(self.attention_matrices()) + extra

    def mlp_matrices(self, width: int) -> int:
        """Elements of a dense MLP of inner width ``width`` (three matrices gated, two standard)."""
        return (3 if self.mlp == "gated" else 2) * self.hidden * width

    @property
    def block_params(self) -> int:
        """Parameters of one dense transformer block (attention, MLP, norms)."""
        h, f = self.hidden, self.ffn_hidden
        kv = self.kv_heads_count * self.head_width
        attn = self.attention_params
        mlp = self.mlp_matrices(f)
        norms = self.norms_per_block * h * (2 if self.bias else 1)  # LayerNorm has a bias, RMSNorm has none
        biases = (h + 2 * kv + h + (2 if self.mlp == "gated" else 1) * f + h) if self.bias else 0
        return attn + mlp + norms + biases

    def moe_mlp_params(self, active: bool = False) -> int:
        """Parameters of one MoE layer's MLP part: router, routed experts (only the
        ``experts_per_token`` a token uses when ``active``), shared experts and their gate."""
        moe = self.moe
        if moe is None:
            return 0
        router = (moe.experts * self.hidden + (moe.experts if moe.router_bias else 0)) if moe.routed else 0
        routed = (moe.experts_per_token if active else moe.experts) * self.mlp_matrices(moe.expert_ffn_hidden)
        shared = moe.shared_experts * self.mlp_matrices(moe.shared_width)
        gate = self.hidden if (moe.shared_expert_gate and moe.shared_experts) else 0
        return router + routed + shared + gate

    def sparse_block(self, index: int) -> bool:
        """True when block ``index`` (0-based) has a mixture-of-experts MLP."""
        return self.moe is not None and index not in self.moe.dense_layers

    def block_params_at(self, index: int, active: bool = False) -> int:
        """Parameters of block ``index`` (0-based); ``active``: those one token uses."""
        if not self.sparse_block(index):
            return self.block_params
        return self.block_params - self.mlp_matrices(self.ffn_hidden) + self.moe_mlp_params(active)

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
        """All parameters: what is stored, offloaded and updated by the optimizer."""
        if self.moe is None:
            return self.embedding_params + self.layers * self.block_params + self.head_params
        blocks = sum(self.block_params_at(i) for i in range(self.layers))
        return self.embedding_params + blocks + self.head_params

    @property
    def active_params(self) -> int:
        """Parameters one token uses (embedding and LM head included, as Mixtral's 12.9B and
        Qwen3-30B-A3B's 3.3B count them): equal to :attr:`total_params` without ``moe``."""
        if self.moe is None:
            return self.total_params
        blocks = sum(self.block_params_at(i, active=True) for i in range(self.layers))
        return self.embedding_params + blocks + self.head_params


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
        megatron_attention_buffer: the training code is Megatron-LM / Megatron-DeepSpeed, whose
            unfused attention (``flash_attention`` off) takes ``baddbmm``'s input, micro-batch x
            heads x seq x seq in the compute format, from a ``GlobalMemoryBuffer`` that keeps it
            from the first forward on (megatron/model/transformer.py ``CoreAttention.forward``,
            megatron/core/utils.py ``GlobalMemoryBuffer.get_tensor``); off: other frameworks.
    """

    seq_len: int = Field(ge=1)
    micro_batch: int = Field(default=1, ge=1)
    grad_accumulation: int = Field(default=1, ge=1)
    data_parallel: int = Field(default=1, ge=1)
    tensor_parallel: int = Field(default=1, ge=1)
    activation_checkpointing: bool = True
    flash_attention: bool = True
    megatron_attention_buffer: bool = False

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
    assumed: dict[str, AssumedRange] = Field(default_factory=dict, description=(
        "fields that are assumptions (dotted path, e.g. training.seq_len) with their range and why; "
        "offsim run --samples draws them (offsim.config.assumed)"))

    @model_validator(mode="after")
    def _check_assumed(self) -> Workload:
        check_assumed(self, self.assumed)
        return self

    @property
    def tokens_per_iteration(self) -> int:
        """Tokens per optimizer step over all data-parallel ranks."""
        t = self.training
        return t.tokens_per_micro_batch * t.grad_accumulation * t.data_parallel
