"""Optimizer sub-groups visited in alternating direction, so that the groups an iteration
updated last, still in the DRAM cache, are the first the next iteration needs (MLP-Offload,
Maurya et al., SC 2025, arXiv 2509.02480)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from offsim.config.base import Frozen
from offsim.policies.base import BuildContext


class AlternatingConfig(Frozen):
    """``{kind: alternating}``."""

    kind: Literal["alternating"] = "alternating"

    def build(self, ctx: BuildContext) -> AlternatingOrder:
        """The policy."""
        return AlternatingOrder()


class AlternatingOrder:
    """Ascending in even iterations, descending in odd ones."""

    name = "alternating"

    def order(self, iteration: int, n_groups: int) -> Sequence[int]:
        """Ascending or descending by iteration parity."""
        groups = list(range(n_groups))
        return groups if iteration % 2 == 0 else groups[::-1]
