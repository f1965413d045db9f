"""A placement chosen per transformer block (ProTrain, Yang et al., arXiv 2406.08334, block-wise
activation management): the first ``offload`` blocks swap their activations to ``tier``, the
next ``recompute`` blocks are checkpointed, the remaining blocks keep theirs in HBM.
A checkpointed block's input (the checkpoint) waits in ``checkpoint_tier``: HBM by default, or
host memory / NVMe as DeepSpeed's ``cpu_checkpointing`` and Fuyou do (Fuyou's released code,
github.com/Crispig/Ratel ``gpt_model.py``, saves checkpoint inputs through ``save_on_cpu``).

Early blocks are the ones to swap: backward reaches them last, so their transfers have the most
time to hide. The embedding and the LM head keep their activations in HBM.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal

from pydantic import Field

from offsim.config.base import Frozen
from offsim.errors import ConfigError
from offsim.policies.base import ActivationDecision, BuildContext

if TYPE_CHECKING:
    from offsim.plan.model import Layer


class PerBlockConfig(Frozen):
    """``{kind: per-block, offload: 4, recompute: 8, tier: cpu, checkpoint_tier: gpu}``."""

    kind: Literal["per-block"] = "per-block"
    offload: int = Field(default=0, ge=0)
    recompute: int = Field(default=0, ge=0)
    tier: Literal["cpu", "nvme"] = "cpu"
    checkpoint_tier: Literal["gpu", "cpu", "nvme"] = "gpu"

    def build(self, ctx: BuildContext) -> PerBlockActivations:
        """The policy."""
        return PerBlockActivations(self.offload, self.recompute, self.tier, self.checkpoint_tier)


class PerBlockActivations:
    """Swap the first blocks, recompute the next ones, keep the rest."""

    def __init__(self, offload: int, recompute: int, tier: Literal["cpu", "nvme"],
                 checkpoint_tier: Literal["gpu", "cpu", "nvme"] = "gpu") -> None:
        self.offload = offload
        self.recompute = recompute
        self.tier = tier
        self.checkpoint_tier = checkpoint_tier
        where = "" if checkpoint_tier == "gpu" else f", checkpoints on {checkpoint_tier}"
        self.name = f"per-block(offload {offload} to {tier}, recompute {recompute}{where})"

    def plan(self, layers: Sequence[Layer]) -> Sequence[ActivationDecision]:
        """Decisions in layer order; blocks are numbered from 0 in forward order."""
        blocks = [lay for lay in layers if lay.is_block]
        if self.offload + self.recompute > len(blocks):
            raise ConfigError(f"activations policy {self.name}: offload + recompute "
                              f"({self.offload + self.recompute}) exceeds the {len(blocks)} blocks")
        rank = {lay.index: k for k, lay in enumerate(blocks)}
        out = []
        for lay in layers:
            k = rank.get(lay.index, -1)
            if 0 <= k < self.offload:
                out.append(ActivationDecision(lay.index, False, self.tier))
            else:
                recompute = self.offload <= k < self.offload + self.recompute
                out.append(ActivationDecision(lay.index, recompute, self.checkpoint_tier if recompute else "gpu"))
        return out
