"""Sliding window over free GPU memory (Fuyou, Liao et al., arXiv 2403.06504).

Fetches ahead as far as memory allows instead of a fixed number of layers: upcoming ops are
issued while their parameters fit in the parameter budget (``gpu_param_buffer_gib``) beside
the layers already held for issued ops; without a budget, in the GPU memory free now minus
``reserve_gib``. Use it with a budget (``auto`` leaves room for everything else the plan puts on
the GPU) or with a reserve that covers the activations the forward pass still has to keep.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

from pydantic import Field

from offsim.config.base import Frozen
from offsim.policies.base import BuildContext, Fetch, PrefetchView
from offsim.units import GiB


class WindowConfig(Frozen):
    """``{kind: window, reserve_gib: 1.0, max_ops: 64}``."""

    kind: Literal["window"] = "window"
    reserve_gib: float = Field(default=0.0, ge=0)
    max_ops: int = Field(default=64, ge=0)

    def build(self, ctx: BuildContext) -> WindowPrefetch:
        """The policy."""
        return WindowPrefetch(self.reserve_gib * GiB, self.max_ops)


class WindowPrefetch:
    """Issues upcoming ops while they fit in free memory and in the parameter budget."""

    def __init__(self, reserve_bytes: float, max_ops: int) -> None:
        self.reserve_bytes = reserve_bytes
        self.max_ops = max_ops
        self.name = f"window(reserve {reserve_bytes / GiB:.3g} GiB)"

    def fetches(self, view: PrefetchView) -> Sequence[Fetch]:
        """Ops from ``issued`` on while the new bytes fit."""
        if math.isfinite(view.capacity_bytes):
            room = view.capacity_bytes - view.pinned_bytes
        else:
            room = view.gpu_free_bytes - self.reserve_bytes
        out: list[Fetch] = []
        seen = set(view.resident)
        new = 0.0
        last = min(len(view.sequence), view.position + self.max_ops + 1)
        for j in range(view.issued, last):
            t = view.sequence[j]
            cost = 0.0 if t in seen else view.sizes[t]
            if new + cost > room:
                break
            out.append(Fetch(j))
            seen.add(t)
            new += cost
        return out
