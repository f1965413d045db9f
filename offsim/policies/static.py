"""Static residency: some tensors, once fetched, stay until the end of the iteration.

ProTrain's persistent chunks (Yang et al., arXiv 2406.08334) and, for the GPU parameter buffer,
"keep the last K layers": they are the first ones backward needs, so keeping them saves their
re-fetch at the turn from forward to backward. Updated parameters come back from the CPU after
each optimizer step, so kept layers are still fetched once per iteration. The other tensors
are managed by the policy named in ``then``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Literal

from pydantic import Field

from offsim.config.base import Frozen
from offsim.policies.base import BuildContext, Evict, EvictionPolicy, MemoryView
from offsim.policies.belady import BeladyConfig
from offsim.policies.fifo import FifoConfig
from offsim.policies.lfu import LfuConfig
from offsim.policies.lru import LruConfig
from offsim.policies.mru import MruConfig
from offsim.policies.opt import OptConfig
from offsim.policies.reuse_distance import ReuseDistanceConfig

Fallback = Literal["reuse-distance", "lru", "fifo", "mru", "lfu", "belady", "opt"]
#: the policy each ``then`` names, with its default parameters
_FALLBACKS = {"reuse-distance": ReuseDistanceConfig, "lru": LruConfig, "fifo": FifoConfig, "mru": MruConfig,
              "lfu": LfuConfig, "belady": BeladyConfig, "opt": OptConfig}


class StaticConfig(Frozen):
    """``{kind: static, keep_last: 4, then: reuse-distance}``.

    Attributes:
        keep_first: the first K tensors (layers from the embedding on, or sub-groups 0..K-1).
        keep_last: the last K tensors (the LM head and the blocks before it).
        tensors: further tensor indices to keep (ProTrain's chosen persistent chunks).
        then: the eviction policy for everything else.
    """

    kind: Literal["static"] = "static"
    keep_first: int = Field(default=0, ge=0)
    keep_last: int = Field(default=0, ge=0)
    tensors: list[int] = Field(default_factory=list)
    then: Fallback = "reuse-distance"

    def kept(self, n_tensors: int) -> frozenset[int]:
        """Indices kept resident among ``n_tensors``."""
        first = range(min(self.keep_first, n_tensors))
        last = range(max(0, n_tensors - self.keep_last), n_tensors)
        return frozenset([*first, *last, *(t for t in self.tensors if 0 <= t < n_tensors)])

    def build(self, ctx: BuildContext) -> StaticResidency:
        """The policy over ``ctx.n_tensors`` tensors."""
        label = ",".join(f"{k}={v}" for k, v in (("first", self.keep_first), ("last", self.keep_last),
                                                   ("tensors", self.tensors)) if v)
        then = _FALLBACKS[self.then]().build(ctx)
        return StaticResidency(self.kept(ctx.n_tensors), then, f"static({label})")


class StaticResidency:
    """Never gives up the kept tensors; asks ``then`` about the rest."""

    def __init__(self, keep: frozenset[int], then: EvictionPolicy, name: str = "static") -> None:
        self.keep = keep
        self.then = then
        self.name = f"{name}+{then.name}"

    def _hide(self, view: MemoryView) -> MemoryView:
        return replace(view, pinned=view.pinned | self.keep)

    def victims(self, view: MemoryView, need_bytes: float) -> Sequence[Evict]:
        """``then``'s victims among the tensors not kept."""
        return self.then.victims(self._hide(view), need_bytes)

    def releases(self, view: MemoryView) -> Sequence[Evict]:
        """``then``'s releases, minus the kept tensors."""
        return [e for e in self.then.releases(self._hide(view)) if e.tensor not in self.keep]
