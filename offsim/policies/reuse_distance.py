"""DeepSpeed ZeRO-3's rule: drop a layer's gathered parameters right after use unless the same
layer is needed again within ``max_reuse_distance_params`` parameters of other layers.

Source: DeepSpeed config ``stage3_max_reuse_distance`` ("do not release a parameter if it will
be reused within this threshold of parameters"); the default strategy behaviour of offsim. When
a budget is set and room is still short, victims are chosen least recently used first.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from pydantic import Field

from offsim.config.base import Frozen
from offsim.policies.base import BuildContext, Evict, MemoryView
from offsim.policies.lru import Lru


class ReuseDistanceConfig(Frozen):
    """``{kind: reuse-distance, max_reuse_distance_params: 1e9}``; without the field, the
    strategy's ``reuse_distance_params``."""

    kind: Literal["reuse-distance"] = "reuse-distance"
    max_reuse_distance_params: float | None = Field(default=None, ge=0)

    def build(self, ctx: BuildContext) -> ReuseDistance:
        """The policy, with the threshold in bytes of this cache's tensors."""
        params = self.max_reuse_distance_params
        params = ctx.reuse_distance_params if params is None else params
        return ReuseDistance(params * ctx.bytes_per_param, params)


def reuse_distance_bytes(view: MemoryView, tensor: int) -> float:
    """Bytes of the distinct other tensors used before ``tensor``'s next use (inf if none)."""
    seen: set[int] = set()
    for t in view.sequence[view.position + 1:]:
        if t == tensor:
            return float(sum(view.sizes[x] for x in seen))
        seen.add(t)
    return float("inf")


class ReuseDistance:
    """Releases after use unless reused soon; LRU when a budget forces an eviction."""

    def __init__(self, max_distance_bytes: float, max_distance_params: float | None = None) -> None:
        self.max_distance_bytes = max_distance_bytes
        label = f"{max_distance_bytes:.3g} B" if max_distance_params is None else f"{max_distance_params:.3g} params"
        self.name = f"reuse-distance({label})"

    def victims(self, view: MemoryView, need_bytes: float) -> Sequence[Evict]:
        """Least recently used first."""
        return Lru().victims(view, need_bytes)

    def releases(self, view: MemoryView) -> Sequence[Evict]:
        """The tensor just used, unless it is pinned or its reuse distance is within bounds."""
        t = view.sequence[view.position]
        if t in view.pinned or t not in view.entries:
            return ()
        if reuse_distance_bytes(view, t) <= self.max_distance_bytes:
            return ()
        return (Evict(t),)
