"""Least frequently used: evict the tensor with the fewest uses since it came in (ties: LRU)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from offsim.config.base import Frozen
from offsim.policies.base import BuildContext, Evict, KeepsUntilEvicted, MemoryView, evict_in_order


class LfuConfig(Frozen):
    """``{kind: lfu}``."""

    kind: Literal["lfu"] = "lfu"

    def build(self, ctx: BuildContext) -> Lfu:
        """The policy."""
        return Lfu()


class Lfu(KeepsUntilEvicted):
    """Evicts candidates by fewest uses, then oldest last use, then lowest id."""

    name = "lfu"

    def victims(self, view: MemoryView, need_bytes: float) -> Sequence[Evict]:
        """Fewest uses first."""
        ranked = sorted(view.candidates(), key=lambda t: (view.entries[t].uses, view.entries[t].last_use, t))
        return evict_in_order(view, need_bytes, ranked)
