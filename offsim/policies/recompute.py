"""Checkpoint every transformer block: keep only its input in HBM and recompute its forward in
backward (Chen et al., "Training Deep Nets with Sublinear Memory Cost", arXiv 1604.06174;
Korthikanti et al., arXiv 2205.05198, Sec. 4)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal

from offsim.config.base import Frozen
from offsim.policies.base import ActivationDecision, BuildContext

if TYPE_CHECKING:
    from offsim.plan.model import Layer


class RecomputeConfig(Frozen):
    """``{kind: recompute}``."""

    kind: Literal["recompute"] = "recompute"

    def build(self, ctx: BuildContext) -> RecomputeActivations:
        """The policy."""
        return RecomputeActivations()


class RecomputeActivations:
    """Blocks are recomputed; the embedding and the head keep their activations."""

    name = "recompute"

    def plan(self, layers: Sequence[Layer]) -> Sequence[ActivationDecision]:
        """Recompute blocks, everything in HBM."""
        return [ActivationDecision(lay.index, lay.is_block, "gpu") for lay in layers]
