"""Offload activations to host DRAM (ZeRO-Infinity's activation checkpoint offload, ProTrain's
swapping) or to NVMe (TBA / SSDTrain, Wu et al., arXiv 2408.10013): written during forward,
read back during backward. The last layers, which backward needs first, stay in HBM."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal

from pydantic import Field

from offsim.config.base import Frozen
from offsim.policies.base import ActivationDecision, BuildContext

if TYPE_CHECKING:
    from offsim.plan.model import Layer


class OffloadConfig(Frozen):
    """``{kind: offload-cpu}`` or ``{kind: offload-nvme}``.

    Attributes:
        checkpoint: offload only each block's checkpoint (its input) and recompute the rest.
        keep_last: layers at the end kept in HBM; default: the strategy's prefetch depth.
    """

    kind: Literal["offload-cpu", "offload-nvme"] = "offload-cpu"
    checkpoint: bool = False
    keep_last: int | None = Field(default=None, ge=0)

    def build(self, ctx: BuildContext) -> OffloadActivations:
        """The policy."""
        keep = ctx.prefetch_depth if self.keep_last is None else self.keep_last
        tier: Literal["cpu", "nvme"] = "nvme" if self.kind == "offload-nvme" else "cpu"
        return OffloadActivations(tier, self.checkpoint, keep, self.kind)


class OffloadActivations:
    """All layers but the last ``keep_last`` + 1 send what they keep to ``tier``."""

    def __init__(self, tier: Literal["cpu", "nvme"], checkpoint: bool, keep_last: int, name: str) -> None:
        self.tier = tier
        self.checkpoint = checkpoint
        self.keep_last = keep_last
        self.name = name

    def plan(self, layers: Sequence[Layer]) -> Sequence[ActivationDecision]:
        """Offload a layer when the backward reaches it more than ``keep_last`` layers later."""
        n = len(layers)
        return [ActivationDecision(lay.index, self.checkpoint and lay.is_block,
                                   self.tier if n - 1 - lay.index > self.keep_last else "gpu")
                for lay in layers]
