"""Pluggable cache, prefetch, activation and optimizer-order policies.

The tagged unions below are the registry: a policy is one file with an ``XConfig`` model (its
``kind`` and parameters, and ``build(ctx)``) next to the class that makes the decisions; adding
one means a new file plus its config in the union. An unknown ``kind`` fails when the strategy
loads, with the list of valid kinds.
"""

from __future__ import annotations

import typing
from typing import Annotated

from pydantic import Field

from offsim.errors import ConfigError
from offsim.policies.alternating import AlternatingConfig
from offsim.policies.auto_swap import AutoSwapConfig
from offsim.policies.base import (
    ActivationDecision,
    ActivationPolicy,
    BuildContext,
    Entry,
    Evict,
    EvictionPolicy,
    Fetch,
    MemoryView,
    OrderPolicy,
    PrefetchPolicy,
    PrefetchView,
)
from offsim.policies.belady import BeladyConfig
from offsim.policies.belady_size import BeladySizeConfig
from offsim.policies.bucket import BucketConfig
from offsim.policies.fifo import FifoConfig
from offsim.policies.keep import KeepConfig
from offsim.policies.lfu import LfuConfig
from offsim.policies.lookahead import LookaheadConfig
from offsim.policies.lru import LruConfig
from offsim.policies.mru import MruConfig
from offsim.policies.no_prefetch import NoPrefetchConfig
from offsim.policies.offload import OffloadConfig
from offsim.policies.opt import OptConfig
from offsim.policies.per_block import PerBlockConfig
from offsim.policies.placement import PlacementConfig
from offsim.policies.recompute import RecomputeConfig
from offsim.policies.reuse_distance import ReuseDistanceConfig
from offsim.policies.same_order import SameOrderConfig
from offsim.policies.static import StaticConfig
from offsim.policies.window import WindowConfig

EvictionConfig = Annotated[
    ReuseDistanceConfig | LruConfig | FifoConfig | MruConfig | LfuConfig | BeladyConfig | BeladySizeConfig
    | OptConfig | StaticConfig,
    Field(discriminator="kind"),
]
PrefetchConfig = Annotated[
    LookaheadConfig | NoPrefetchConfig | BucketConfig | WindowConfig, Field(discriminator="kind")
]
ActivationConfig = Annotated[
    PlacementConfig | KeepConfig | RecomputeConfig | OffloadConfig | PerBlockConfig | AutoSwapConfig,
    Field(discriminator="kind"),
]
OrderConfig = Annotated[SameOrderConfig | AlternatingConfig, Field(discriminator="kind")]

FAMILIES = {"eviction": EvictionConfig, "prefetch": PrefetchConfig, "activations": ActivationConfig,
            "optimizer_order": OrderConfig}


def kinds(family: str) -> list[str]:
    """The valid ``kind`` values of a policy family (``eviction``, ``prefetch``, ...)."""
    union = typing.get_args(FAMILIES[family])[0]
    out: list[str] = []
    for cfg in typing.get_args(union):
        out += list(typing.get_args(cfg.model_fields["kind"].annotation))
    return out


def available() -> dict[str, list[str]]:
    """Every family and its kinds (for the CLI and error messages)."""
    return {family: kinds(family) for family in FAMILIES}


def build_eviction_kind(kind: str, ctx: BuildContext) -> EvictionPolicy:
    """Build an eviction policy from its kind alone (default parameters)."""
    for cfg in typing.get_args(typing.get_args(EvictionConfig)[0]):
        if kind in typing.get_args(cfg.model_fields["kind"].annotation):
            return cfg(kind=kind).build(ctx)
    raise ConfigError(f"unknown eviction policy kind '{kind}'; valid kinds: {', '.join(kinds('eviction'))}")


__all__ = [
    "ActivationConfig",
    "ActivationDecision",
    "ActivationPolicy",
    "BuildContext",
    "Entry",
    "Evict",
    "EvictionConfig",
    "EvictionPolicy",
    "Fetch",
    "MemoryView",
    "OrderConfig",
    "OrderPolicy",
    "PrefetchConfig",
    "PrefetchPolicy",
    "PrefetchView",
    "available",
    "build_eviction_kind",
    "kinds",
]
