"""Fuyou's automatic activation swapping (Liao et al., arXiv 2403.06504): the first blocks swap
their activations to ``tier``, the others are recomputed, and how many swap is chosen by a cost
model before the run (:mod:`offsim.search.swap_amount`, which fills ``chosen``), not by the user:
the least predicted time among the counts whose swap buffers fit the GPU memory the other needs
leave (Fuyou's GPU-memory bound) and whose footprint fits, then profiled."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal

from pydantic import Field

from offsim.config.base import Frozen
from offsim.errors import PolicyError
from offsim.policies.base import ActivationDecision, BuildContext
from offsim.policies.per_block import PerBlockActivations

if TYPE_CHECKING:
    from offsim.plan.model import Layer


class ChosenSwap(Frozen):
    """The swap amount the search chose (:func:`offsim.search.swap_amount.resolve_auto_swap`).

    Attributes:
        blocks: transformer blocks whose activations are swapped (the first ones).
        total_blocks: the transformer blocks of the model.
        note: the search's prediction, shown in the policy's name.
    """

    blocks: int = Field(ge=0)
    total_blocks: int = Field(ge=0)
    note: str = ""


class AutoSwapConfig(Frozen):
    """``{kind: auto-swap, tier: nvme, checkpoint_tier: cpu}``: swapped blocks go to ``tier``,
    the checkpoints of recomputed blocks wait in ``checkpoint_tier`` (as in per-block).

    ``chosen`` is filled by the search before planning (a user leaves it out); planning a
    configuration whose amount was not chosen is an error."""

    kind: Literal["auto-swap"] = "auto-swap"
    tier: Literal["cpu", "nvme"] = "nvme"
    checkpoint_tier: Literal["gpu", "cpu", "nvme"] = "gpu"
    chosen: ChosenSwap | None = None

    def build(self, ctx: BuildContext) -> AutoSwapActivations:
        """The policy, with the swap count the search chose."""
        if self.chosen is None:
            raise PolicyError("activations policy auto-swap: the swap amount has not been chosen; resolve the "
                              "configuration first (offsim.api.resolve, which offsim.simulate calls)")
        c = self.chosen
        return AutoSwapActivations(c.blocks, c.total_blocks, self.tier, c.note, self.checkpoint_tier)


class AutoSwapActivations:
    """Swap the first ``swapped`` blocks, recompute the rest (a per-block plan with a chosen n)."""

    def __init__(self, swapped: int, total_blocks: int, tier: Literal["cpu", "nvme"], note: str = "",
                 checkpoint_tier: Literal["gpu", "cpu", "nvme"] = "gpu") -> None:
        self._plan = PerBlockActivations(swapped, total_blocks - swapped, tier, checkpoint_tier)
        self.swapped = swapped
        where = "" if checkpoint_tier == "gpu" else f", checkpoints on {checkpoint_tier}"
        self.name = f"auto-swap({swapped} of {total_blocks} blocks to {tier}, rest recomputed{where}{note})"

    def plan(self, layers: Sequence[Layer]) -> Sequence[ActivationDecision]:
        """Decisions in layer order."""
        return self._plan.plan(layers)
