"""A plain pre-norm transformer block in PyTorch (imports torch: load it only when torch is there).

Attention is ``scaled_dot_product_attention`` (causal) over a fused QKV projection; the MLP is
two linear layers with GELU; no biases in the linear layers, LayerNorm with weight and bias.
Used by the GPU part (block forward/backward timing) and by the real offloaded trainer.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn


class Block(nn.Module):
    """``x + attn(ln1(x))`` then ``+ mlp(ln2(x))``."""

    def __init__(self, hidden: int, heads: int, ffn_hidden: int) -> None:
        super().__init__()
        if hidden % heads:
            raise ValueError(f"hidden ({hidden}) must be divisible by heads ({heads})")
        self.heads = heads
        self.ln1 = nn.LayerNorm(hidden)
        self.qkv = nn.Linear(hidden, 3 * hidden, bias=False)
        self.proj = nn.Linear(hidden, hidden, bias=False)
        self.ln2 = nn.LayerNorm(hidden)
        self.fc1 = nn.Linear(hidden, ffn_hidden, bias=False)
        self.fc2 = nn.Linear(ffn_hidden, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        qkv = self.qkv(self.ln1(x)).view(b, s, 3, self.heads, h // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, s, h))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


def block_flops(batch: int, seq: int, hidden: int, ffn_hidden: int) -> float:
    """Forward FLOPs of one :class:`Block`: the four projections and the MLP (2 FLOP per MAC),
    plus ``Q K^T`` and ``A V`` counted in full (``4 b s^2 h``; causal masking is not subtracted)."""
    tokens = batch * seq
    return 2.0 * tokens * (4 * hidden * hidden + 2 * hidden * ffn_hidden) + 4.0 * batch * seq * seq * hidden
