"""Activations: kept on the GPU, recomputed from a checkpoint, or offloaded to host memory or
NVMe between a layer's forward and its backward.

Per layer the activation policy decides (compile time) whether the block is recomputed and
where what it keeps waits. An offloaded layer's bytes leave the GPU after its forward (through a
pinned staging buffer when bound for NVMe, or straight to the array with GPUDirect Storage) and
come back for its backward: demanded at the layer's backward site, and brought back ahead by the
prefetch hook for the next ``depth`` layers while GPU memory allows, keeping room for the
layer's backward (ZeRO-Infinity, TBA / SSDTrain and Fuyou all read activations ahead of use;
Fuyou's prefetcher fills only the memory that is free). Forward waits while more than
``depth + 1`` offloaded layers still occupy the GPU (bounded swap buffers).
"""

from __future__ import annotations

from dataclasses import dataclass

from offsim.core.enums import Activity, CacheId, MechanismId, Phase, StreamKind, TensorKind, Tier
from offsim.mechanisms.base import BlockBuilder, Moment, Need, Setup, Site, SiteKind, Stage, tag
from offsim.mechanisms.compute import COMPUTE, activation
from offsim.mechanisms.param_fetch import STAGING
from offsim.schedule.ops import (
    CUR_MB,
    Access,
    Acquire,
    Alloc,
    Block,
    CacheSpec,
    Flow,
    Free,
    Join,
    Prefetch,
    Ready,
    Release,
    StreamSpec,
    TensorRef,
    Wait,
)


@dataclass(frozen=True)
class LayerActivations:
    """One layer's activations.

    Attributes:
        kept_bytes: what its forward keeps for backward (a checkpoint when recomputed).
        transient_bytes: the rest of a full forward's activations, freed after the forward.
        work_bytes: its backward's working memory (recompute, activation gradients).
        tier: where the kept bytes wait (GPU, host pinned or pageable, NVMe).
        out / back: the flows that move them (None when kept on the GPU); for NVMe through
            staging, ``out`` is the D2H copy and ``out_storage`` the write (and ``back`` the
            H2D copy, ``back_storage`` the read); with GPUDirect Storage only the storage flows.
        staging_bytes: what the NVMe transfer holds of the staging pool.
    """

    kept_bytes: int
    transient_bytes: int
    work_bytes: int
    tier: Tier
    out: Flow | None = None
    out_storage: Flow | None = None
    back: Flow | None = None
    back_storage: Flow | None = None
    staging_bytes: int = 0

    @property
    def offloaded(self) -> bool:
        return self.tier is not Tier.GPU


def _workspace(layer: int) -> TensorRef:
    return TensorRef(TensorKind.WORKSPACE, unit=layer, mb=CUR_MB)


@dataclass(frozen=True)
class Activations:
    """Keep, offload and bring back activations; ``depth`` bounds offloads in flight and
    prefetches; ``reserve_bytes`` per layer is what its backward needs besides."""

    layers: tuple[LayerActivations, ...]
    depth: int
    reserve_bytes: tuple[int, ...]
    id: MechanismId = MechanismId.ACTIVATIONS

    def setup(self) -> Setup:
        queues = (("act_d2h", StreamKind.COPY), ("act_h2d", StreamKind.COPY), ("act_nvme", StreamKind.AIO))
        streams = tuple(StreamSpec(s, k, in_order=False) for s, k in queues)
        moved = {u: a for u, a in enumerate(self.layers) if a.offloaded}
        cache = CacheSpec(CacheId.GPU_ACTIVATIONS, Tier.GPU, None, {u: a.kept_bytes for u, a in moved.items()},
                          {u: self._fetch_program(u) for u in moved}, {})
        return Setup(streams=streams, caches=(cache,) if moved else ())

    def footprint(self) -> tuple[Need, ...]:
        """On the GPU: what stays for backward, the offloaded layers in flight (the forward
        throttle lets ``depth + 2`` consecutive offloaded layers occupy it: the largest sum of kept
        bytes over such a window, which is at most ``depth + 2`` times the largest layer's and less
        where the layers differ, e.g. Fuyou's GPU rule), and the largest forward transient or
        backward working set; each offloaded layer's kept bytes in its tier (one micro-batch's at a
        time).

        The GPU needs are held at :attr:`Moment.FORWARD_BACKWARD` only: the last backward frees
        them before the step (this mechanism's backward ``Free`` of each layer's activations and
        workspace; DeepSpeed's step after ``backward``, deepspeed_runtime.md §13), so the step's
        transients are counted instead of them, not on top. The offloaded bytes on the host or
        NVMe are still counted as held: this rule is the GPU's."""
        moved = [a for a in self.layers if a.offloaded]
        fb = Moment.FORWARD_BACKWARD
        needs = [Need(Tier.GPU, "activations kept for backward", sum(a.kept_bytes for a in self.layers
                                                                     if not a.offloaded), fb)]
        if moved:
            kept = [a.kept_bytes for a in moved]
            window = min(self.depth + 2, len(kept))
            in_flight = max(sum(kept[i:i + window]) for i in range(len(kept) - window + 1))
            needs.append(Need(Tier.GPU, "activations in flight", in_flight, fb))
        work = max((max(a.work_bytes, a.transient_bytes) for a in self.layers), default=0)
        needs.append(Need(Tier.GPU, "backward working memory (recompute, activation gradients)", work, fb))
        for tier in (Tier.HOST_PINNED, Tier.HOST_PAGEABLE, Tier.NVME):
            needs.append(Need(tier, "offloaded activations", sum(a.kept_bytes for a in moved if a.tier is tier)))
        return tuple(needs)

    def emit(self, b: BlockBuilder, site: Site, stage: Stage) -> None:
        if site.what is SiteKind.FORWARD:
            self._forward(b, site, stage)
        elif site.what is SiteKind.BACKWARD:
            self._backward(b, site, stage)

    # ------------------------------------------------------------ forward
    def _forward(self, b: BlockBuilder, site: Site, stage: Stage) -> None:
        u, a = site.layer, self.layers[site.layer]
        t = tag(Activity.ACT_OFFLOAD, self.id, Phase.FORWARD, u)
        if stage is Stage.BEFORE:
            b.add(Alloc(Tier.GPU, a.kept_bytes, activation(u)), t, COMPUTE)
            if a.transient_bytes:
                b.add(Alloc(Tier.GPU, a.transient_bytes, _workspace(u)), t, COMPUTE)
        elif stage is Stage.AFTER:
            if a.transient_bytes:
                b.add(Free(Tier.GPU, _workspace(u)), t, COMPUTE)
            if a.offloaded:
                self._offload(b, u, a)
                self._throttle(b, u)

    def _offload(self, b: BlockBuilder, u: int, a: LayerActivations) -> None:
        """The copy out: its Free of the GPU bytes is marked ``("off_gpu", u)``."""
        t = tag(Activity.ACT_OFFLOAD, self.id, Phase.FORWARD, u)
        act = activation(u)
        if a.tier is Tier.NVME and a.out is None:  # GPUDirect Storage
            last = b.add(a.out_storage, t, "act_nvme", reads=(act,))  # type: ignore[arg-type]
            b.marks[("off_gpu", u)] = b.add(Free(Tier.GPU, act), t, after=[last])
            b.add(Alloc(Tier.NVME, a.kept_bytes, act), t, after=[last], writes=(act,))
            return
        first = None
        if a.tier is Tier.NVME:
            first = b.add(Acquire(STAGING, a.staging_bytes), t)
        else:
            first = b.add(Alloc(a.tier, a.kept_bytes, act), t)
        assert a.out is not None
        copy = b.add(a.out, t, "act_d2h", after=[first], reads=(act,))
        b.marks[("off_gpu", u)] = b.add(Free(Tier.GPU, act), t, after=[copy])
        if a.tier is not Tier.NVME:
            b.add(Join(), t, after=[copy], writes=(act,))
            return
        alloc = b.add(Alloc(Tier.NVME, a.kept_bytes, act), t, after=[copy])
        write = b.add(a.out_storage, t, "act_nvme", after=[alloc])  # type: ignore[arg-type]
        b.add(Release(STAGING, a.staging_bytes), t, after=[write], writes=(act,))

    def _throttle(self, b: BlockBuilder, u: int) -> None:
        """Forward waits until at most ``depth + 1`` offloaded layers still occupy the GPU."""
        moved = [v for v in range(u + 1) if self.layers[v].offloaded]
        if len(moved) > self.depth + 1:
            oldest = moved[-(self.depth + 2)]
            t = tag(Activity.ACT_OFFLOAD, self.id, Phase.FORWARD, u, label="waits for activation offload")
            b.add(Join(), t, COMPUTE, after=[b.marks[("off_gpu", oldest)]], stall=Wait("activation offload"))

    # ------------------------------------------------------------ backward
    def _backward(self, b: BlockBuilder, site: Site, stage: Stage) -> None:
        u, a = site.layer, self.layers[site.layer]
        t = tag(Activity.ACT_FETCH, self.id, Phase.BACKWARD, u)
        if stage is Stage.ISSUE:
            if a.offloaded:
                b.add(Access(CacheId.GPU_ACTIVATIONS, u), t, COMPUTE)
            upcoming = tuple(v for v in range(u - 1, max(-1, u - 1 - self.depth), -1) if self.layers[v].offloaded)
            if upcoming:
                b.add(Prefetch(CacheId.GPU_ACTIVATIONS, upcoming, self.reserve_bytes[u]), t, COMPUTE)
        elif stage is Stage.WAIT and a.offloaded:
            b.add(Ready(CacheId.GPU_ACTIVATIONS, u), t, COMPUTE, stall=Wait("activations"))
        elif stage is Stage.BEFORE:
            b.add(Alloc(Tier.GPU, a.work_bytes, _workspace(u)), t, COMPUTE)
        elif stage is Stage.AFTER:
            b.add(Free(Tier.GPU, _workspace(u)), t, COMPUTE)
            b.add(Free(Tier.GPU, activation(u)), t, COMPUTE)

    def _fetch_program(self, u: int) -> Block:
        """Bring layer ``u``'s kept bytes back: after its offload has ended."""
        a = self.layers[u]
        act = activation(u)
        b = BlockBuilder(f"fetch activations of layer {u}")
        t = tag(Activity.ACT_FETCH, self.id, Phase.BACKWARD, u)
        start = b.add(Alloc(Tier.GPU, a.kept_bytes, act), t, reads=(act,))
        if a.tier is Tier.NVME and a.back is None:  # GPUDirect Storage
            read = b.add(a.back_storage, t, "act_nvme", after=[start])  # type: ignore[arg-type]
            b.add(Free(Tier.NVME, act), t, after=[read])
            return b.build()
        if a.tier is Tier.NVME:
            take = b.add(Acquire(STAGING, a.staging_bytes), t, after=[start])
            read = b.add(a.back_storage, t, "act_nvme", after=[take])  # type: ignore[arg-type]
            b.add(Free(Tier.NVME, act), t, after=[read])
            up = b.add(a.back, t, "act_h2d", after=[read])  # type: ignore[arg-type]
            b.add(Release(STAGING, a.staging_bytes), t, after=[up])
            return b.build()
        up = b.add(a.back, t, "act_h2d", after=[start])  # type: ignore[arg-type]
        b.add(Free(a.tier, act), t, after=[up])
        return b.build()
