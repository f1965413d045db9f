"""Belady's offline rule (OPT): evict the tensor whose next use is furthest in the future.

Belady, "A study of replacement algorithms for a virtual-storage computer", IBM Systems Journal
5(2), 1966. With equal-sized tensors it minimises misses, hence bytes fetched, over every
replacement policy; the schedule of one training iteration is known in advance, so it can be
run exactly. With tensors of several sizes it is not always optimal in bytes (see
:mod:`offsim.policies.opt`). Tensors never used again (``next_use`` None) go first, largest
first.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

from offsim.config.base import Frozen
from offsim.policies.base import BuildContext, Evict, KeepsUntilEvicted, MemoryView, evict_in_order


class BeladyConfig(Frozen):
    """``{kind: belady}``."""

    kind: Literal["belady"] = "belady"

    def build(self, ctx: BuildContext) -> Belady:
        """The policy."""
        return Belady()


class Belady(KeepsUntilEvicted):
    """Evicts candidates by furthest next use (never-used-again first; ties: larger, lower id)."""

    name = "belady"

    def victims(self, view: MemoryView, need_bytes: float) -> Sequence[Evict]:
        """Furthest next use first."""

        def key(t: int) -> tuple[float, float, int]:
            e = view.entries[t]
            nxt = math.inf if e.next_use is None else e.next_use
            return (-nxt, -e.size_bytes, t)

        return evict_in_order(view, need_bytes, sorted(view.candidates(), key=key))
