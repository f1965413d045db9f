"""Most recently used: evict the tensor used last. Good for a loop larger than the cache (each
pass then keeps the front of the loop), bad for the forward/backward turn."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from offsim.config.base import Frozen
from offsim.policies.base import BuildContext, Evict, KeepsUntilEvicted, MemoryView, evict_in_order


class MruConfig(Frozen):
    """``{kind: mru}``."""

    kind: Literal["mru"] = "mru"

    def build(self, ctx: BuildContext) -> Mru:
        """The policy."""
        return Mru()


class Mru(KeepsUntilEvicted):
    """Evicts candidates by newest last use (ties: lowest id)."""

    name = "mru"

    def victims(self, view: MemoryView, need_bytes: float) -> Sequence[Evict]:
        """Newest last use first."""
        ranked = sorted(view.candidates(), key=lambda t: (-view.entries[t].last_use, t))
        return evict_in_order(view, need_bytes, ranked)
