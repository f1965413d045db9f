"""Least recently used: evict the tensor whose latest access is oldest."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from offsim.config.base import Frozen
from offsim.policies.base import BuildContext, Evict, KeepsUntilEvicted, MemoryView, evict_in_order


class LruConfig(Frozen):
    """``{kind: lru}``."""

    kind: Literal["lru"] = "lru"

    def build(self, ctx: BuildContext) -> Lru:
        """The policy."""
        return Lru()


class Lru(KeepsUntilEvicted):
    """Evicts candidates by oldest last use (ties: lowest id)."""

    name = "lru"

    def victims(self, view: MemoryView, need_bytes: float) -> Sequence[Evict]:
        """Oldest last use first."""
        ranked = sorted(view.candidates(), key=lambda t: (view.entries[t].last_use, t))
        return evict_in_order(view, need_bytes, ranked)
