"""No prefetch: each layer's parameters are fetched when its op starts, so every transfer is
exposed on the GPU's critical path."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from offsim.config.base import Frozen
from offsim.policies.base import BuildContext, Fetch, PrefetchView


class NoPrefetchConfig(Frozen):
    """``{kind: none}``."""

    kind: Literal["none"] = "none"

    def build(self, ctx: BuildContext) -> NoPrefetch:
        """The policy."""
        return NoPrefetch()


class NoPrefetch:
    """Fetches nothing ahead (the engine still fetches the current op on demand)."""

    name = "none"

    def fetches(self, view: PrefetchView) -> Sequence[Fetch]:
        """Nothing."""
        return ()
