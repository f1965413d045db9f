"""Parameter fetch: a streamed layer's 16-bit parameters are gathered on the GPU around each use.

The GPU parameter buffer is a policy-managed cache (``gpu_params``), one unit per layer, emptied
at every iteration end (the step changes every parameter). At each forward and backward site the
layer's demand is issued (:class:`~offsim.schedule.ops.Access`: a hit, or a miss that runs the
layer's fetch program after the victims the eviction policy names, then the prefetches the
prefetch policy asks for), the compute stream waits until it is resident, and when the layer's
ops have run the eviction policy may release it (DeepSpeed's release after use, kept within
``stage3_max_reuse_distance``).

A layer's fetch program: hold the gathered bytes on the GPU (with DeepSpeed's per-submodule
gather, :mod:`offsim.plan.zero3_fetch`, none: the layer's peak of gathered submodules is held on
the compute stream from its issue to its done instead, and its fetch moves the whole layer); read
its partition from NVMe into a pinned staging buffer and copy it up (parameters on NVMe), or copy
it up from host memory (parameters on the CPU); all-gather the partitions over the GPU link (ZeRO-3, dp > 1).
"""

from __future__ import annotations

from dataclasses import dataclass

from offsim.core.enums import Activity, CacheId, MechanismId, Phase, StreamKind, TensorKind, Tier
from offsim.mechanisms.base import BlockBuilder, Moment, Need, Setup, Site, SiteKind, Stage, tag
from offsim.mechanisms.compute import COMPUTE
from offsim.schedule.ops import (
    Access,
    Acquire,
    Alloc,
    Block,
    CacheSpec,
    Done,
    Flow,
    Flush,
    Free,
    Ready,
    Release,
    StreamSpec,
    TensorRef,
    Wait,
)

STAGING = "staging"  # the pinned staging pool (bytes), owned by the static-state mechanism


@dataclass(frozen=True)
class LayerFetch:
    """How one layer's parameters arrive: gathered bytes on the GPU, then the flows in order
    (``nvme``: NVMe read into staging; ``h2d``: the copy up; ``gather``: the all-gather);
    ``staging_bytes``: what the NVMe read holds of the staging pool."""

    gathered_bytes: int
    nvme: Flow | None
    h2d: Flow | None
    gather: Flow | None
    staging_bytes: int = 0
    #: GPU bytes the cache unit holds from its fetch to its release (None: ``gathered_bytes``);
    #: DeepSpeed's per-submodule gather (:mod:`offsim.plan.zero3_fetch`) holds 0 there
    held_bytes: int | None = None
    #: GPU bytes held on the compute stream from a site's issue to its done: the layer's
    #: submodules gathered while it runs (the per-submodule peak; 0: none beyond the unit)
    working_bytes: int = 0

    @property
    def resident_bytes(self) -> int:
        """What the cache unit allocates while resident."""
        return self.gathered_bytes if self.held_bytes is None else self.held_bytes


def gathered(layer: int) -> TensorRef:
    """A layer's gathered 16-bit parameters on the GPU."""
    return TensorRef(TensorKind.PARAM16, unit=layer)


def working(layer: int, backward: bool) -> TensorRef:
    """A layer's submodules gathered while a forward (``group`` 0) or backward (1) site of it
    runs: held from the site's issue to its done, stages a wrapper may emit once per unit-major
    visit (:class:`~offsim.mechanisms.unit_visit.FetchOncePerVisit`: the issue with the first
    micro-batch, the done with the last), so the pair stays balanced in either order."""
    return TensorRef(TensorKind.PARAM16, unit=layer, group=1 if backward else 0)


@dataclass(frozen=True)
class ParamFetch:
    """Fetch, prefetch and release of streamed layers' parameters (cache ``gpu_params``).

    Attributes:
        layers: per layer, how its parameters arrive.
        budget_bytes: the buffer's capacity (None: unbounded, the policy alone decides).
        window_bytes: the most gathered bytes on the GPU at once: the budget when there is one,
            else the eviction and prefetch policies' estimate
            (:func:`offsim.plan.policy_plan.param_window_bytes`).
        released_before_step: the system releases every gathered parameter between the last
            backward and the step, so the window is held only through forward and backward
            (:data:`Moment.FORWARD_BACKWARD`); False: counted as held through the step. DeepSpeed
            ZeRO-3 does: stage3.py ``step`` begins with ``_partition_all_parameters`` (v0.6.0 to
            edaa72212), and v0.3.16-v0.5.10's ``backward`` ends with it. The timeline releases
            the window there in every system (:meth:`emit` flushes the cache at the iteration's
            end, before the step); False keeps the footprint's count through the step where a
            system's source has not been read on this point.
    """

    layers: tuple[LayerFetch, ...]
    budget_bytes: int | None
    window_bytes: int = 0
    released_before_step: bool = False
    id: MechanismId = MechanismId.PARAM_FETCH

    def footprint(self) -> tuple[Need, ...]:
        moment = Moment.FORWARD_BACKWARD if self.released_before_step else None
        return (Need(Tier.GPU, "gathered params window", self.window_bytes, moment),)

    def setup(self) -> Setup:
        queues = (("param_nvme", StreamKind.AIO), ("param_h2d", StreamKind.COPY), ("param_gather", StreamKind.COPY))
        streams = tuple(StreamSpec(s, k, in_order=False) for s, k in queues)
        cache = CacheSpec(CacheId.GPU_PARAMS, Tier.GPU, self.budget_bytes,
                          {u: f.gathered_bytes for u, f in enumerate(self.layers)},
                          {u: self._fetch_program(u) for u in range(len(self.layers))},
                          {u: self._release_program(u) for u in range(len(self.layers))})
        return Setup(streams=streams, caches=(cache,))

    def _fetch_program(self, u: int) -> Block:
        f = self.layers[u]
        b = BlockBuilder(f"fetch params of layer {u}")
        t = tag(Activity.PARAM_FETCH, self.id, Phase.FORWARD, u)
        b.add(Alloc(Tier.GPU, f.resident_bytes, gathered(u)), t)
        if f.nvme is not None:
            b.add(Acquire(STAGING, f.staging_bytes), t, after=[0])
            b.add(f.nvme, t, "param_nvme", after=[1])
        if f.h2d is not None:
            b.add(f.h2d, t, "param_h2d", after=[len(b.ops) - 1])
        if f.nvme is not None:
            b.add(Release(STAGING, f.staging_bytes), t, after=[len(b.ops) - 1])
        if f.gather is not None:
            b.add(f.gather, tag(Activity.PARAM_GATHER, self.id, Phase.FORWARD, u), "param_gather",
                  after=[len(b.ops) - 1])
        return b.build()

    def _release_program(self, u: int) -> Block:
        b = BlockBuilder(f"release params of layer {u}")
        b.add(Free(Tier.GPU, gathered(u)), tag(Activity.PARAM_FETCH, self.id, Phase.FORWARD, u))
        return b.build()

    def emit(self, b: BlockBuilder, site: Site, stage: Stage) -> None:
        phase = Phase.FORWARD if site.what is SiteKind.FORWARD else Phase.BACKWARD
        t = tag(Activity.PARAM_FETCH, self.id, phase, site.layer)
        backward = site.what is SiteKind.BACKWARD
        work = self.layers[site.layer].working_bytes if site.what in (SiteKind.FORWARD, SiteKind.BACKWARD) else 0
        if site.what is SiteKind.ITERATION_END and stage is Stage.DONE:
            # the iteration's end, before the step: counted in the optimizer phase
            b.add(Flush(CacheId.GPU_PARAMS), tag(Activity.PARAM_FETCH, self.id, Phase.OPTIMIZER), COMPUTE)
        elif site.what not in (SiteKind.FORWARD, SiteKind.BACKWARD):
            return
        elif stage is Stage.ISSUE:
            b.add(Access(CacheId.GPU_PARAMS, site.layer), t, COMPUTE)
            if work:
                b.add(Alloc(Tier.GPU, work, working(site.layer, backward)), t, COMPUTE)
        elif stage is Stage.WAIT:
            b.add(Ready(CacheId.GPU_PARAMS, site.layer), t, COMPUTE, stall=Wait("params"))
        elif stage is Stage.DONE:
            if work:
                b.add(Free(Tier.GPU, working(site.layer, backward)), t, COMPUTE)
            b.add(Done(CacheId.GPU_PARAMS, site.layer), t, COMPUTE)
