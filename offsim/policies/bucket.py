"""DeepSpeed-style prefetch by a byte budget.

DeepSpeed ZeRO-3 fetches ahead until the parameters in flight reach ``stage3_prefetch_bucket_size``
elements, and never holds more than ``stage3_max_live_parameters`` gathered at once (DeepSpeed
config documentation, zero_optimization; defaults 5e7 and 1e9).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from pydantic import Field

from offsim.config.base import Frozen
from offsim.policies.base import BuildContext, Fetch, PrefetchView


class BucketConfig(Frozen):
    """``{kind: bucket, bucket_params: 5e7, max_live_params: 1e9}`` (parameter counts)."""

    kind: Literal["bucket"] = "bucket"
    bucket_params: float = Field(default=5e7, gt=0)
    max_live_params: float = Field(default=1e9, gt=0)

    def build(self, ctx: BuildContext) -> BucketPrefetch:
        """The policy."""
        return BucketPrefetch(self.bucket_params, self.max_live_params)


class BucketPrefetch:
    """Issues upcoming ops while the bytes fetched ahead stay within the bucket."""

    def __init__(self, bucket_params: float, max_live_params: float) -> None:
        self.bucket_params = bucket_params
        self.max_live_params = max_live_params
        self.name = f"bucket({bucket_params:.3g} params)"

    def fetches(self, view: PrefetchView) -> Sequence[Fetch]:
        """Ops from ``issued`` on, until the next one would overflow the bucket or the live cap."""
        bucket = self.bucket_params * view.bytes_per_param
        live_cap = self.max_live_params * view.bytes_per_param
        current = view.sizes[view.sequence[view.position]]
        ahead = max(0.0, view.pinned_bytes - current)
        live = view.pinned_bytes
        out: list[Fetch] = []
        seen = set(view.resident)
        for j in range(view.issued, len(view.sequence)):
            t = view.sequence[j]
            cost = 0.0 if t in seen else view.sizes[t]
            if ahead + cost > bucket or live + cost > live_cap:
                break
            out.append(Fetch(j))
            seen.add(t)
            ahead += cost
            live += cost
        return out
