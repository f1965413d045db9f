"""The model as a list of layers with parameters, FLOPs, activation bytes and compute time.

Pure functions of the workload and the GPU; no SimPy. Formulas:

* FLOPs: a GEMM of ``m x k`` by ``k x n`` costs ``2mkn``; backward costs twice forward
  (Kaplan et al. 2020, "6N" rule); attention scores and context add ``4 b s^2 h`` forward
  (Narayanan et al., SC 2021, Sec. 5.1).
* Activation bytes per block with 16-bit activations: Korthikanti et al., "Reducing Activation
  Recomputation in Large Transformer Models" (MLSys 2023, arXiv 2205.05198) Sec. 4.1:
  attention ``11sbh + 5as^2b``, MLP ``19sbh``, norms ``4sbh`` (34sbh + 5as^2b in total),
  generalised here to GQA widths, any FFN width and gated MLPs; flash attention does not keep the
  ``s x s`` terms.
* A checkpointed block keeps only its 16-bit input, ``2sbh`` bytes.
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
        recomputed = self.act_full_bytes if (checkpointing and self.is_block) else 0.0
        return recomputed + self.grad_work_bytes


def block_gemms(wl: Workload) -> list[float]:
    """FLOPs per GPU of each forward GEMM of one block (QKV, attention scores+context, out,
    MLP): the whole GEMM divided by the tensor-parallel degree."""
    m, t = wl.model, wl.training
    tp = t.tensor_parallel
    tokens = t.tokens_per_micro_batch
    h, f = m.hidden, m.ffn_hidden
    kv = m.kv_heads_count * m.head_dim
    gemms = [2.0 * tokens * h * (h + 2 * kv), 2.0 * tokens * h * h]
    gemms += [2.0 * tokens * h * f] * (3 if m.mlp == "gated" else 2)
    attention = 4.0 * t.micro_batch * t.seq_len**2 * h  # QK^T and AV
    gemms.append(attention)
    return [g / tp for g in gemms]


def block_activation_bytes(wl: Workload) -> float:
    """Bytes one block keeps for backward without checkpointing, per GPU (Korthikanti et al.
    Sec. 4.1; Sec. 4.2.1 for what tensor parallelism splits).

    Replicated on every GPU of a tensor-parallel group: the attention and MLP inputs (2sbh each),
    their dropout masks (sbh each; a gated MLP has none) and the norms' inputs (4sbh), 10sbh in
    all. Split ``t`` ways:
    Q, K, V, the scores, softmax and its dropout, the context (attention) and the MLP's inner
    activations."""
    m, t = wl.model, wl.training
    s, b, h, f = t.seq_len, t.micro_batch, m.hidden, m.ffn_hidden
    kv = m.kv_heads_count * m.head_dim
    attn_split = 4 * s * b * h + 4 * s * b * kv  # Q, K, V, context; = 8sbh for MHA
    if not t.flash_attention:
        attn_split += 5 * m.heads * s * s * b  # scores, softmax, dropout mask
    if m.mlp == "gated":
        mlp_replicated, mlp_split = 2 * s * b * h, 6 * s * b * f  # input; gate, up, activation output
    else:
        mlp_replicated, mlp_split = 3 * s * b * h, 4 * s * b * f  # input + dropout mask; 16sbh for f = 4h
    replicated = 3 * s * b * h + mlp_replicated + 4 * s * b * h  # attention input + mask, MLP, norms
    return float(replicated + (attn_split + mlp_split) / t.tensor_parallel)


def largest_activation_bytes(wl: Workload) -> float:
    """Bytes of the largest single activation tensor of a block (16-bit): the MLP's inner
    activation, or the attention scores when they are materialised (per GPU: both split over the
    tensor-parallel group, the hidden-size tensors replicated)."""
    m, t = wl.model, wl.training
    tokens, tp = t.tokens_per_micro_batch, t.tensor_parallel
    largest = 2.0 * tokens * max(m.ffn_hidden / tp, m.hidden)
    if not t.flash_attention:
        largest = max(largest, 2.0 * m.heads * t.seq_len * t.seq_len * t.micro_batch / tp)
    return largest


def _gemm_time_s(gpu: GPU, dtype: str, flop: float) -> float:
    """Time of one GEMM (or one batched GEMM kernel) of ``flop`` FLOPs at the size-dependent
    efficiency of the profile's curve."""
    return flop / (gpu.peak_flops(dtype) * gpu.gemm_fraction(flop))


def block_forward_s(wl: Workload, gpu: GPU) -> float:
    """Forward time of one block: GEMMs at their efficiency plus memory-bound elementwise work.

    Elementwise work (norms, activation function, residual adds, softmax) is charged as the
    block's activation bytes read once and written once at HBM bandwidth.
    """
    dtype = wl.precision.compute
    *dense, attention = block_gemms(wl)
    t = sum(_gemm_time_s(gpu, dtype, g) for g in dense)
    # attention over all heads and sequences runs as one batched kernel (bmm or a fused
    # attention kernel), so its efficiency follows the total work, not one head's
    t += _gemm_time_s(gpu, dtype, attention)
    t += 2 * block_activation_bytes(wl) / gpu.hbm_bytes_per_s
    return t


def build_layers(wl: Workload, gpu: GPU) -> list[Layer]:
    """Embedding, ``layers`` blocks and the LM head, in forward order; parameters, FLOPs and
    activations are one GPU's share of its tensor-parallel group."""
    m, t = wl.model, wl.training
    tokens, tp = t.tokens_per_micro_batch, t.tensor_parallel
    act_bytes = DTYPE_BYTES["bf16"]  # activations are kept in 16-bit under mixed precision
    hidden_bytes = act_bytes * tokens * m.hidden
    fwd_block = block_forward_s(wl, gpu)
    block_flop = sum(block_gemms(wl))
    act_block = block_activation_bytes(wl)
    layers = [Layer(0, "embed", _split(m.embedding_params, tp), 0.0, hidden_bytes / gpu.hbm_bytes_per_s,
                    hidden_bytes / gpu.hbm_bytes_per_s, hidden_bytes, hidden_bytes, hidden_bytes)]
    block_grads = 2 * largest_activation_bytes(wl)
    for i in range(m.layers):
        layers.append(Layer(i + 1, f"block{i}", _split(m.block_params, tp), block_flop, fwd_block, 2 * fwd_block,
                            act_block, hidden_bytes, block_grads))
    layers.append(_head_layer(wl, gpu, m.layers + 1, hidden_bytes))
    return layers


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
    per_micro = m.layers * sum(block_gemms(wl)) + head_flop(wl)
    return 3.0 * per_micro * wl.training.grad_accumulation
