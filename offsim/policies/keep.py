"""Keep every layer's activations in HBM (no checkpointing, no offload): fastest, most memory."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal

from offsim.config.base import Frozen
from offsim.policies.base import ActivationDecision, BuildContext

if TYPE_CHECKING:
    from offsim.plan.model import Layer


class KeepConfig(Frozen):
    """``{kind: keep}``."""

    kind: Literal["keep"] = "keep"

    def build(self, ctx: BuildContext) -> KeepActivations:
        """The policy."""
        return KeepActivations()


class KeepActivations:
    """Every layer keeps its full activations on the GPU."""

    name = "keep"

    def plan(self, layers: Sequence[Layer]) -> Sequence[ActivationDecision]:
        """No recompute, all in HBM."""
        return [ActivationDecision(lay.index, False, "gpu") for lay in layers]
