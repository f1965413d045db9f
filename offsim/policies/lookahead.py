"""Fixed lookahead: before op ``i`` runs, the data of ops ``i+1 .. i+depth`` are on their way.

This is DeepSpeed's prefetcher, which records the op sequence of the first iteration and fetches
ahead of it (ZeRO-Infinity, arXiv 2104.07857, Sec. 6.2), counted in ops instead of parameters.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from pydantic import Field

from offsim.config.base import Frozen
from offsim.policies.base import BuildContext, Fetch, PrefetchView


class LookaheadConfig(Frozen):
    """``{kind: lookahead, depth: 2}``; without ``depth``, the strategy's ``prefetch_depth``."""

    kind: Literal["lookahead"] = "lookahead"
    depth: int | None = Field(default=None, ge=0, le=64)

    def build(self, ctx: BuildContext) -> LookaheadPrefetch:
        """The policy."""
        return LookaheadPrefetch(ctx.prefetch_depth if self.depth is None else self.depth)


class LookaheadPrefetch:
    """Issues every op up to ``depth`` ahead of the one about to run."""

    def __init__(self, depth: int) -> None:
        self.depth = depth
        self.name = f"lookahead({depth})"

    def fetches(self, view: PrefetchView) -> Sequence[Fetch]:
        """Ops ``issued .. position + depth``."""
        last = min(len(view.sequence), view.position + self.depth + 1)
        return [Fetch(j) for j in range(view.issued, last)]
