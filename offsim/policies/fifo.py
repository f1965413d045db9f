"""First in, first out: evict the tensor brought in earliest, however recently it was used."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from offsim.config.base import Frozen
from offsim.policies.base import BuildContext, Evict, KeepsUntilEvicted, MemoryView, evict_in_order


class FifoConfig(Frozen):
    """``{kind: fifo}``."""

    kind: Literal["fifo"] = "fifo"

    def build(self, ctx: BuildContext) -> Fifo:
        """The policy."""
        return Fifo()


class Fifo(KeepsUntilEvicted):
    """Evicts candidates by oldest insertion (ties: lowest id)."""

    name = "fifo"

    def victims(self, view: MemoryView, need_bytes: float) -> Sequence[Evict]:
        """Earliest inserted first."""
        ranked = sorted(view.candidates(), key=lambda t: (view.entries[t].inserted_at, t))
        return evict_in_order(view, need_bytes, ranked)
