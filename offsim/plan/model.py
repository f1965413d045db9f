"""The model as a list of layers with parameters, FLOPs, activation bytes and compute time.

Pure functions of the workload and the GPU; no SimPy. Formulas:

* FLOPs: a GEMM of ``m x k`` by ``k x n`` costs ``2mkn``; backward costs twice forward
  (Kaplan et al. 2020, "6N" rule); attention scores and context add ``4 b s^2 h`` forward
  (Narayanan et al., SC 2021, Sec. 5.1), with the query width in place of ``h`` when an explicit
  ``head_dim`` makes them differ.
* Mixture of experts: a block stores every expert but a token runs through ``k`` of ``E`` routed
  experts (and the shared ones), so FLOPs and activations follow the active experts only; the
  router adds an ``h x E`` GEMM.
* Activation bytes per block with 16-bit activations: Korthikanti et al., "Reducing Activation
  Recomputation in Large Transformer Models" (MLSys 2023, arXiv 2205.05198) Sec. 4.1:
  attention ``11sbh + 5as^2b``, MLP ``19sbh``, norms ``4sbh`` (34sbh + 5as^2b in total),
  generalised here to GQA widths, any FFN width and gated MLPs; flash attention does not keep the
  ``s x s`` terms.
* A checkpointed block keeps only its 16-bit input, ``2sbh`` bytes (two inputs, ``4sbh``, when its
  attention and MLP are checkpointed separately: ``strategy.checkpoint_split_block``).
* Tensor parallelism over ``t`` GPUs (Megatron-LM, arXiv 1909.08053 Sec. 3): each GPU holds and
  computes ``1/t`` of every GEMM, of the embedding and LM head (vocab-parallel); of the block's
  activations the ``t``-way split ones shrink and the rest are replicated (Korthikanti et al.
  Sec. 4.2.1: ``sbh(10 + 24/t + 5as/(ht))`` for MHA with a 4h MLP, no sequence parallelism).
"""

from __future__ import annotations

from dataclasses import dataclass

from offsim.config.hardware import GPU
from offsim.config.workload import DTYPE_BYTES, Workload


@dataclass(frozen=True)
class Layer:
    """One unit the schedule fetches, computes and releases.

    Attributes:
        index: position in the forward order (0 = embedding, last = LM head).
        name: ``embed``, ``block<i>`` or ``head``.
        params: parameters it owns.
        fwd_flop: forward FLOPs per micro-batch.
        fwd_s / bwd_s: compute time on the GPU per micro-batch, seconds.
        act_full_bytes: activations a forward keeps for backward without checkpointing.
        act_ckpt_bytes: what it keeps with checkpointing.
        grad_work_bytes: activation gradients alive at once during its backward (the two
            largest activation tensors: the gradient flowing in and the one being produced).
        recompute_work_bytes: a checkpointed block's backward working memory with its recomputed
            activations (:func:`recompute_work_bytes`); None: ``act_full_bytes + grad_work_bytes``.
    """

    index: int
    name: str
    params: int
    fwd_flop: float
    fwd_s: float
    bwd_s: float
    act_full_bytes: float
    act_ckpt_bytes: float
    grad_work_bytes: float = 0.0
    recompute_work_bytes: float | None = None

    @property
    def is_block(self) -> bool:
        """True for transformer blocks (checkpointable), false for embedding and head."""
        return self.name.startswith("block")

    def kept_bytes(self, checkpointing: bool) -> float:
        """Activation bytes the forward leaves for the backward."""
        return self.act_ckpt_bytes if (checkpointing and self.is_block) else self.act_full_bytes

    def backward_work_bytes(self, checkpointing: bool) -> float:
        """Transient GPU bytes of the backward beyond the kept activations: the recomputed
        activations (with checkpointing) plus the activation gradients in flight."""
        if checkpointing and self.is_block and self.recompute_work_bytes is not None:
            return self.recompute_work_bytes
        recomputed = self.act_full_bytes if (checkpointing and self.is_block) else 0.0
        return recomputed + self.grad_work_bytes


def block_gemms(wl: Workload, sparse: bool = False) -> list[float]:
    """FLOPs per GPU of each forward GEMM of one block (QKV, out, MLP, attention scores+context
    last): the whole GEMM divided by the tensor-parallel degree.

    ``sparse``: the block's MLP is the mixture of experts (:func:`moe_gemms`); only the experts a
    token is routed to cost FLOPs. With MLA each projection is its own GEMM."""
    m, t = wl.model, wl.training
    tp = t.tensor_parallel
    tokens = t.tokens_per_micro_batch
    h, f, q = m.hidden, m.ffn_hidden, m.q_width
    if m.mla is None:
        kv = m.kv_heads_count * m.head_width
        gemms = [2.0 * tokens * h * (q + 2 * kv), 2.0 * tokens * q * h]
        attention = 4.0 * t.micro_batch * t.seq_len**2 * q  # QK^T and AV
    else:
        gemms = [2.0 * tokens * n for n in m.attention_matrices()]
        attention = 2.0 * t.micro_batch * t.seq_len**2 * (q + m.kv_width)  # QK^T (nope+rope wide), AV
    gemms += moe_gemms(wl) if sparse else [2.0 * tokens * h * f] * _matrices(wl)
    gemms.append(attention)
    return [g / tp for g in gemms]


def _matrices(wl: Workload) -> int:
    """Weight matrices of one MLP (or expert): three gated, two standard."""
    return 3 if wl.model.mlp == "gated" else 2


def moe_gemms(wl: Workload) -> list[float]:
    """Forward FLOPs of a mixture-of-experts MLP's GEMMs (whole, before the tensor-parallel split).

    The router is one ``h x E`` GEMM over all tokens (plus the shared expert's ``h x 1`` gate);
    each routed expert gets ``tokens x k / E`` tokens on average (balanced routing), so it runs its
    own, smaller GEMMs; shared experts see every token. One expert alone is a dense MLP."""
    m, t = wl.model, wl.training
    moe, tokens, h = m.moe, t.tokens_per_micro_batch, m.hidden
    mats = _matrices(wl)
    if moe is None:  # a dense model: its MLP
        return [2.0 * tokens * h * m.ffn_hidden] * mats
    gemms: list[float] = []
    if moe.routed:
        gate = 1 if (moe.shared_expert_gate and moe.shared_experts) else 0
        gemms.append(2.0 * tokens * h * (moe.experts + gate))
    per_expert = 2.0 * tokens * moe.experts_per_token / moe.experts * h * moe.expert_ffn_hidden
    gemms += [per_expert] * (mats * moe.experts)
    if moe.shared_experts:
        gemms += [2.0 * tokens * h * moe.shared_experts * moe.shared_width] * mats
    return gemms


def _attention_activation_bytes(wl: Workload) -> tuple[float, float]:
    """Attention bytes kept for backward: (replicated over tensor parallelism, split ``t`` ways).

    Replicated: the attention input and its dropout mask (3sbh). Split: Q, K, V and the context
    (``8sbh`` for MHA), MLA's latents (the inputs of its up-projections), and without flash
    attention the scores, softmax and dropout mask (``5as^2b``)."""
    m, t = wl.model, wl.training
    s, b, h, q = t.seq_len, t.micro_batch, m.hidden, m.q_width
    if m.mla is None:
        kv = m.kv_heads_count * m.head_width
        split = 4 * s * b * q + 4 * s * b * kv  # Q, K, V, context; = 8sbh for MHA
    else:
        a = m.mla
        latents = (a.q_lora_rank or 0) + a.kv_lora_rank + a.qk_rope_head_dim
        split = 2 * s * b * (2 * q + 2 * m.kv_width + latents)  # Q, K (nope+rope), V, context
    if not t.flash_attention:
        split += 5 * m.heads * s * s * b  # scores, softmax, dropout mask
    return 3 * s * b * h, split


def _mlp_activation_bytes(wl: Workload, sparse: bool) -> tuple[float, float]:
    """MLP bytes kept for backward: (replicated, split ``t`` ways). Gated: the input (2sbh) and per
    inner unit gate, up and activation output (6 bytes); standard: input and dropout mask (3sbh)
    and 4 bytes per inner unit (16sbh for f = 4h). A routed MoE keeps, per chosen expert, the
    token's dispatched copy (2sbh) and the expert's inner activations, plus the router's fp32
    probabilities (4sbE); shared experts keep their inner activations."""
    m, t = wl.model, wl.training
    s, b, h = t.seq_len, t.micro_batch, m.hidden
    gated = m.mlp == "gated"
    replicated, per_unit = (2 * s * b * h, 6 * s * b) if gated else (3 * s * b * h, 4 * s * b)
    moe = m.moe
    if not sparse or moe is None:
        return replicated, per_unit * m.ffn_hidden
    k = moe.experts_per_token
    split = k * per_unit * moe.expert_ffn_hidden + moe.shared_experts * per_unit * moe.shared_width
    if moe.routed:
        split += k * 2 * s * b * h + 4 * s * b * moe.experts
    return replicated, split


def block_activation_bytes(wl: Workload, sparse: bool = False) -> float:
    """Bytes one block keeps for backward without checkpointing, per GPU (Korthikanti et al.
    Sec. 4.1; Sec. 4.2.1 for what tensor parallelism splits).

    Replicated on every GPU of a tensor-parallel group: the attention and MLP inputs (2sbh each),
    their dropout masks (sbh each; a gated MLP has none) and the norms' inputs (2sbh per norm, 4sbh
    with two). Split ``t`` ways: Q, K, V, the scores, softmax and its dropout, the context
    (attention) and the MLP's inner activations (:func:`_mlp_activation_bytes`)."""
    m, t = wl.model, wl.training
    s, b, h = t.seq_len, t.micro_batch, m.hidden
    attn_replicated, attn_split = _attention_activation_bytes(wl)
    mlp_replicated, mlp_split = _mlp_activation_bytes(wl, sparse)
    replicated = attn_replicated + mlp_replicated + 2 * m.norms_per_block * s * b * h
    return float(replicated + (attn_split + mlp_split) / t.tensor_parallel)


def _largest_mlp_tensor_bytes(wl: Workload, sparse: bool) -> float:
    """Bytes of the MLP's largest activation tensor (16-bit, per GPU): its inner activation (of a
    routed MoE: all dispatched tokens' expert activations, as grouped-GEMM implementations hold
    them), split over the tensor-parallel group, or a replicated hidden-size tensor."""
    m, t = wl.model, wl.training
    inner = m.ffn_hidden
    if sparse and m.moe is not None:
        moe = m.moe
        inner = max(moe.experts_per_token * moe.expert_ffn_hidden, moe.shared_experts * moe.shared_width)
    return 2.0 * t.tokens_per_micro_batch * max(inner / t.tensor_parallel, m.hidden)


def _largest_attention_tensor_bytes(wl: Workload) -> float:
    """Bytes of the attention's largest activation tensor (16-bit, per GPU): the ``s x s`` scores
    of every head when they are materialised (no flash attention), else a hidden-size tensor."""
    m, t = wl.model, wl.training
    largest = 2.0 * t.tokens_per_micro_batch * m.hidden
    if not t.flash_attention:
        largest = max(largest, 2.0 * m.heads * t.seq_len * t.seq_len * t.micro_batch / t.tensor_parallel)
    return largest


def largest_activation_bytes(wl: Workload, sparse: bool = False) -> float:
    """Bytes of the largest single activation tensor of a block (16-bit): the MLP's inner
    activation or the attention scores when they are materialised (per GPU: both split over the
    tensor-parallel group, the hidden-size tensors replicated)."""
    return max(_largest_mlp_tensor_bytes(wl, sparse), _largest_attention_tensor_bytes(wl))


def recompute_work_bytes(wl: Workload, sparse: bool = False, split_block: bool = False) -> float:
    """GPU bytes of a checkpointed block's backward beyond its checkpoint, per GPU: the larger of
    its two phases, each with two of its largest tensors as activation gradients (the one flowing
    in and the one being produced).

    DeepSpeed's ``CheckpointFunction.backward`` (runtime/activation_checkpointing/checkpointing.py,
    v0.3.15 and edaa722126) re-runs the block's forward under ``torch.enable_grad()``, so every
    tensor the forward saves for backward is alive again (``block_activation_bytes``), then calls
    ``torch.autograd.backward`` on the recomputed outputs. Autograd frees a node's saved tensors
    once the node has run (no ``retain_graph``), and the backward runs the MLP first: by the time
    it reaches the attention, the MLP's saved tensors and its norm's input are gone (Korthikanti et
    al., arXiv 2205.05198, Sec. 4.1: MLP 19sbh, each norm 2sbh; :func:`_mlp_activation_bytes`).

    * MLP phase: everything recomputed + two of the MLP's largest tensors;
    * attention phase: everything recomputed but the MLP half + two of the attention's largest
      tensors (the ``5as^2b`` scores without flash attention).

    With flash attention the MLP phase is the larger, so this equals the recomputed activations
    plus two largest tensors (:attr:`Layer.grad_work_bytes`); without it, when the scores are the
    largest tensor, the attention's two score-sized gradients no longer meet the MLP's saved
    tensors. Memory-centric tiling (runtime/zero/tiling.py ``TiledLinear.forward``) concatenates
    the tiles' outputs (``_combine_output_splits``), so it does not split these activations.

    ``split_block`` (``strategy.checkpoint_split_block``; Megatron-LM-v1.1.5-ZeRO3's
    ``--split-transformers``, ParallelTransformerLayerPart1/Part2 at DeepSpeedExamples bdf8e59a):
    the attention and the MLP are two checkpointed functions, so each backward recomputes one half
    only: the MLP phase holds the MLP half and two of its largest tensors, the attention phase as
    above (the MLP half is not recomputed with it)."""
    m, t = wl.model, wl.training
    full = block_activation_bytes(wl, sparse)
    mlp_replicated, mlp_split = _mlp_activation_bytes(wl, sparse)
    mlp_norms = 2 * (m.norms_per_block // 2) * t.seq_len * t.micro_batch * m.hidden
    mlp_half = mlp_replicated + mlp_norms + mlp_split / t.tensor_parallel
    mlp_phase = (mlp_half if split_block else full) + 2 * _largest_mlp_tensor_bytes(wl, sparse)
    attention_phase = full - mlp_half + 2 * _largest_attention_tensor_bytes(wl)
    return max(mlp_phase, attention_phase)


def _gemm_time_s(gpu: GPU, dtype: str, flop: float) -> float:
    """Time of one GEMM (or one batched GEMM kernel) of ``flop`` FLOPs at the size-dependent
    efficiency of the profile's curve."""
    return flop / (gpu.peak_flops(dtype) * gpu.gemm_fraction(flop))


def block_forward_s(wl: Workload, gpu: GPU, sparse: bool = False) -> float:
    """Forward time of one block: GEMMs at their efficiency plus memory-bound elementwise work.

    Elementwise work (norms, activation function, residual adds, softmax) is charged as the
    block's activation bytes read once and written once at HBM bandwidth.
    """
    dtype = wl.precision.compute
    *dense, attention = block_gemms(wl, sparse)
    t = sum(_gemm_time_s(gpu, dtype, g) for g in dense)
    # attention over all heads and sequences runs as one batched kernel (bmm or a fused
    # attention kernel), so its efficiency follows the total work, not one head's
    t += _gemm_time_s(gpu, dtype, attention)
    t += 2 * block_activation_bytes(wl, sparse) / gpu.hbm_bytes_per_s
    return t


def build_layers(wl: Workload, gpu: GPU, split_block: bool = False) -> list[Layer]:
    """Embedding, ``layers`` blocks and the LM head, in forward order; parameters, FLOPs and
    activations are one GPU's share of its tensor-parallel group. ``split_block``: each block's
    attention and MLP are checkpointed separately (:func:`recompute_work_bytes`), keeping two
    hidden-size inputs per block.

    A mixture-of-experts block owns all its experts' parameters (stored, fetched, updated) while its
    FLOPs and activations are those of the experts its tokens are routed to."""
    m, t = wl.model, wl.training
    tokens, tp = t.tokens_per_micro_batch, t.tensor_parallel
    act_bytes = DTYPE_BYTES["bf16"]  # activations are kept in 16-bit under mixed precision
    hidden_bytes = act_bytes * tokens * m.hidden
    kinds = {sparse: _block_costs(wl, gpu, sparse, split_block)
             for sparse in {m.sparse_block(i) for i in range(m.layers)}}
    ckpt_bytes = hidden_bytes * (2 if split_block else 1)
    layers = [Layer(0, "embed", _split(m.embedding_params, tp), 0.0, hidden_bytes / gpu.hbm_bytes_per_s,
                    hidden_bytes / gpu.hbm_bytes_per_s, hidden_bytes, hidden_bytes, hidden_bytes)]
    for i in range(m.layers):
        block_flop, fwd_block, act_block, block_grads, recompute = kinds[m.sparse_block(i)]
        layers.append(Layer(i + 1, f"block{i}", _split(m.block_params_at(i), tp), block_flop, fwd_block,
                            2 * fwd_block, act_block, ckpt_bytes, block_grads, recompute))
    layers.append(_head_layer(wl, gpu, m.layers + 1, hidden_bytes))
    return layers


def _block_costs(wl: Workload, gpu: GPU, sparse: bool, split_block: bool) -> tuple[float, float, float, float, float]:
    """Forward FLOPs, forward seconds, kept activation bytes, backward gradient bytes and the
    recomputed backward's working bytes of a dense (or, with ``sparse``, a mixture-of-experts)
    block."""
    return (sum(block_gemms(wl, sparse)), block_forward_s(wl, gpu, sparse), block_activation_bytes(wl, sparse),
            2 * largest_activation_bytes(wl, sparse), recompute_work_bytes(wl, sparse, split_block))


def _split(params: int, tp: int) -> int:
    """One GPU's parameters of a tensor split ``tp`` ways (rounded up)."""
    return -(-params // tp)


def head_flop(wl: Workload) -> float:
    """Forward FLOPs per GPU of the LM head per micro-batch (vocab-parallel; 0 when the loss
    reads the hidden state)."""
    m, t = wl.model, wl.training
    return 2.0 * t.tokens_per_micro_batch * m.hidden * m.vocab / t.tensor_parallel if m.lm_head else 0.0


def _head_layer(wl: Workload, gpu: GPU, index: int, hidden_bytes: float) -> Layer:
    """Final norm and LM head. The loss keeps the fp32 softmax of the logits for backward
    (Megatron-LM's vocab-parallel cross-entropy); the 16-bit logits are transient, about the size
    of the logits' gradient. Without a head only the final norm's output remains (elementwise,
    at HBM bandwidth)."""
    m, tokens, tp = wl.model, wl.training.tokens_per_micro_batch, wl.training.tensor_parallel
    flop = head_flop(wl)
    params = _split(m.head_params, tp)
    if not m.lm_head:
        norm_s = 2 * hidden_bytes / gpu.hbm_bytes_per_s
        return Layer(index, "head", params, 0.0, norm_s, 2 * norm_s, hidden_bytes, hidden_bytes, hidden_bytes)
    head_s = _gemm_time_s(gpu, wl.precision.compute, flop)
    softmax_bytes = 4.0 * tokens * m.vocab / tp
    logits_grad_bytes = 2.0 * tokens * m.vocab / tp
    return Layer(index, "head", params, flop, head_s, 2 * head_s,
                 softmax_bytes + hidden_bytes, softmax_bytes + hidden_bytes, logits_grad_bytes)


def model_flop_per_iteration(wl: Workload) -> float:
    """Model FLOPs of one optimizer step on one GPU (forward + backward, no recompute; one
    GPU's share under tensor parallelism)."""
    m = wl.model
    sparse = sum(m.sparse_block(i) for i in range(m.layers))
    blocks = (m.layers - sparse) * sum(block_gemms(wl))
    if sparse:
        blocks += sparse * sum(block_gemms(wl, sparse=True))
    per_micro = blocks + head_flop(wl)
    return 3.0 * per_micro * wl.training.grad_accumulation


@dataclass(frozen=True)
class ReduceBucket:
    """One DeepSpeed ZeRO-3 reduce bucket: ``pieces`` are (layer index, gradient elements) in the
    order they entered it; it is flushed after the backward of ``flush_layer``, the layer of its
    last gradient. DeepSpeed flushes it in the hook of the next gradient, which may come later in
    that layer's backward or in the next layer's; offsim's sites are whole layers, so the flush
    can be early by at most the time to that hook."""

    pieces: tuple[tuple[int, int], ...]
    flush_layer: int

    @property
    def elements(self) -> int:
        """Gradient elements in the bucket."""
        return sum(n for _, n in self.pieces)


def reduce_buckets(tensors: list[tuple[int, tuple[int, ...]]], bucket_elements: float) -> tuple[ReduceBucket, ...]:
    """DeepSpeed ZeRO-3's reduce buckets over one backward. ``tensors``: per layer in backward
    order, (layer index, its tensors' elements in the order their gradients are produced).

    stage3.py ``reduce_independent_p_g_buckets_and_remove_grads`` (read at edaa722126): when a
    gradient arrives and ``bucket.elements + numel > reduce_bucket_size`` with a non-empty
    bucket, the bucket is reduced first (``__reduce_and_partition_ipg_grads``), then the gradient
    is added; a tensor larger than the bucket is a bucket of its own. The epilogue
    (``independent_gradient_partition_epilogue``) flushes the rest. Pieces of one layer in one
    bucket are merged."""
    out: list[ReduceBucket] = []
    pieces: list[tuple[int, int]] = []
    filled = 0
    for layer, sizes in tensors:
        for n in sizes:
            if filled > 0 and filled + n > bucket_elements:
                out.append(ReduceBucket(tuple(pieces), pieces[-1][0]))
                pieces, filled = [], 0
            if pieces and pieces[-1][0] == layer:
                pieces[-1] = (layer, pieces[-1][1] + n)
            else:
                pieces.append((layer, n))
            filled += n
    if pieces:
        out.append(ReduceBucket(tuple(pieces), pieces[-1][0]))
    return tuple(out)
