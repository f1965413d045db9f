"""State allocated once, before the first iteration: the CUDA reserve, each kind of state at
its home (16-bit parameters, gradients, optimizer state, the PFS share), the pinned staging
buffers, and DeepSpeed ZeRO-3's host set-up replayed in order (persistent swap buffers and
gradient partitions, with the transient pageable copies on the way;
:func:`offsim.plan.footprint.deepspeed_host_init`)."""

from __future__ import annotations

from dataclasses import dataclass

from offsim.core.enums import Activity, MechanismId, Phase, TensorKind, Tier
from offsim.mechanisms.base import BlockBuilder, Moment, Need, Setup, Site, SiteKind, Stage, tag
from offsim.schedule.ops import Alloc, Free, PoolSpec, TensorRef

STAGING = "staging"


@dataclass(frozen=True)
class StaticItem:
    """One allocation (``nbytes`` > 0) or the free of an earlier one with the same ``what``."""

    tier: Tier
    nbytes: int
    what: str
    kind: TensorKind = TensorKind.BUFFER


@dataclass(frozen=True)
class StaticState:
    """Allocations at start-up, in order; ``staging_bytes``: the pinned staging pool (bytes)."""

    items: tuple[StaticItem, ...]
    staging_bytes: int
    id: MechanismId = MechanismId.STATIC_STATE

    def setup(self) -> Setup:
        return Setup(pools=(PoolSpec(STAGING, self.staging_bytes),))

    def emit(self, b: BlockBuilder, site: Site, stage: Stage) -> None:
        if site.what is not SiteKind.INIT or stage is not Stage.RUN:
            return
        live: dict[str, list[TensorRef]] = {}
        for k, item in enumerate(self.items):
            t = tag(Activity.HOST_SETUP, self.id, Phase.INIT, label=item.what)
            if item.nbytes > 0:
                ref = TensorRef(item.kind, unit=-1, group=1000 + k)  # one tensor per allocation
                live.setdefault(item.what, []).append(ref)
                b.add(Alloc(item.tier, item.nbytes, ref), t, "init")
            elif item.nbytes < 0:
                b.add(Free(item.tier, live[item.what].pop()), t, "init")

    def footprint(self) -> tuple[Need, ...]:
        """What the items leave allocated, per item; and the set-up's transient: the highest host
        total (pinned and pageable) on the way, above what is left (DeepSpeed's pageable sources
        of ``pin_memory()`` copies and scratch, :func:`offsim.plan.footprint.deepspeed_host_init`)."""
        left: dict[tuple[Tier, str], float] = {}
        host, peak = 0.0, 0.0
        for item in self.items:
            left[(item.tier, item.what)] = left.get((item.tier, item.what), 0.0) + item.nbytes
            if item.tier in (Tier.HOST_PINNED, Tier.HOST_PAGEABLE):
                host += item.nbytes
                peak = max(peak, host)
        needs = [Need(tier, what, nbytes) for (tier, what), nbytes in left.items() if nbytes > 0]
        if peak > host:
            needs.append(Need(Tier.HOST_PAGEABLE, "transient peak at start-up (pin_memory() copies, scratch)",
                              peak - host, Moment.START_UP))
        return tuple(needs)

