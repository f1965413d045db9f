"""Belady-Size: a size-aware heuristic that evicts the tensor with the largest product of size
and distance to its next use (tensors never used again first, largest first).

The rule ranks by the room-time a tensor would hold until it is needed again, so a large tensor
used soon can outlast a small one used far ahead. It is one of the size-aware heuristics
Berger, Beckmann and Harchol-Balter compare against their bound ("Practical Bounds on Optimal
Caching with Variable Object Sizes", SIGMETRICS 2018). It is a heuristic, not an optimum: the
bound of :mod:`offsim.policies.bounds` is what it is scored against.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

from offsim.config.base import Frozen
from offsim.policies.base import BuildContext, Evict, KeepsUntilEvicted, MemoryView, evict_in_order


class BeladySizeConfig(Frozen):
    """``{kind: belady-size}``."""

    kind: Literal["belady-size"] = "belady-size"

    def build(self, ctx: BuildContext) -> BeladySize:
        """The policy."""
        return BeladySize()


def room_time(view: MemoryView, tensor: int) -> float:
    """Bytes times accesses until the tensor's next use (``inf`` when it is not used again)."""
    e = view.entries[tensor]
    if e.next_use is None:
        return math.inf
    return e.size_bytes * (e.next_use - view.position)


class BeladySize(KeepsUntilEvicted):
    """Evicts candidates by largest size x next-use distance (ties: larger, then lower id)."""

    name = "belady-size"

    def victims(self, view: MemoryView, need_bytes: float) -> Sequence[Evict]:
        """Largest room-time first."""

        def key(t: int) -> tuple[float, float, int]:
            return (-room_time(view, t), -view.entries[t].size_bytes, t)

        return evict_in_order(view, need_bytes, sorted(view.candidates(), key=key))
