"""Activations as the strategy says: checkpoint the blocks when checkpointing is on, and keep
what is left in ``placement.activations``, except the last layers, which the backward needs
within the prefetch window and so stay in HBM. This is offsim's default."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal

from offsim.config.base import Frozen
from offsim.policies.base import ActivationDecision, ActTier, BuildContext

if TYPE_CHECKING:
    from offsim.plan.model import Layer


class PlacementConfig(Frozen):
    """``{kind: placement}``."""

    kind: Literal["placement"] = "placement"

    def build(self, ctx: BuildContext) -> PlacementActivations:
        """The policy, from the strategy's placement, checkpointing and prefetch depth."""
        return PlacementActivations(ctx.checkpointing, ctx.activations_tier, ctx.prefetch_depth)


class PlacementActivations:
    """Checkpointing on or off for all blocks; one offload tier for all but the last layers."""

    def __init__(self, checkpointing: bool, tier: ActTier, keep_last: int) -> None:
        self.checkpointing = checkpointing
        self.tier = tier
        self.keep_last = keep_last
        self.name = "placement"

    def plan(self, layers: Sequence[Layer]) -> Sequence[ActivationDecision]:
        """Offload a layer when the backward reaches it more than ``keep_last`` layers later."""
        n = len(layers)
        return [ActivationDecision(lay.index, self.checkpointing and lay.is_block,
                                   self.tier if n - 1 - lay.index > self.keep_last else "gpu")
                for lay in layers]
