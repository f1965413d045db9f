"""Optimizer sub-groups visited in the same order every iteration (DeepSpeed's behaviour)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from offsim.config.base import Frozen
from offsim.policies.base import BuildContext


class SameOrderConfig(Frozen):
    """``{kind: same}``."""

    kind: Literal["same"] = "same"

    def build(self, ctx: BuildContext) -> SameOrder:
        """The policy."""
        return SameOrder()


class SameOrder:
    """0, 1, ..., n-1 every iteration."""

    name = "same"

    def order(self, iteration: int, n_groups: int) -> Sequence[int]:
        """Ascending."""
        return list(range(n_groups))
