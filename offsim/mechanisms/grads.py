"""Gradients: reduced across data-parallel ranks and sent home after each layer's backward.

Gradients kept on the GPU are reduced (ring reduce-scatter for ZeRO-2/3, all-reduce otherwise)
beside the backward. Offloaded gradients are (optionally) projected on the GPU (LSP-Offload),
wait for one of two GPU gradient buffers (DeepSpeed's double-buffered reduce buckets) and, under
a layer-wise schedule with bounded host buffers, for a host gradient buffer; the copy reduces,
copies the partition down and then, on the host: accumulates into the fp32 gradient, casts and
writes it to NVMe (reading the previous micro-batches' sum first), or, under the layer-wise
schedule, hands the layer's last gradient to a CPU update that overlaps the rest of backward
(Fuyou, LSP-Offload, SuperOffload). Without overlap the compute stream waits for each copy.

DeepSpeed ZeRO-3's offload reduces per reduce bucket instead (:class:`GradBucket`: up to
``reduce_bucket_size`` elements across layer boundaries, three reductions in flight, everything on
its one reduction stream; stage3.py ``__reduce_and_partition_ipg_grads``, deepspeed_runtime.md §3).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from offsim.core.enums import Activity, MechanismId, Phase, StreamKind, TensorKind, Tier
from offsim.mechanisms.base import BlockBuilder, Need, Setup, Site, SiteKind, Stage, StorageIO, io_pools, parallel, tag
from offsim.mechanisms.compute import COMPUTE, grad16
from offsim.plan.deepspeed_versions import DEFAULT_Z3_GRAD_FLUSH, Z3GradFlush
from offsim.schedule.ops import (
    CUR_MB,
    Acquire,
    Alloc,
    Delay,
    Flow,
    Free,
    Join,
    PoolSpec,
    Release,
    StreamSpec,
    TensorRef,
    Wait,
)

GRAD_SLOTS = "grad_slots"          # GPU gradient buffers waiting for their copy (2)
HOST_GRAD_SLOTS = "host_grad_slots"  # layer-wise host gradient buffers
GRAD_SWAP_UNITS = "grad_swap_units"  # DeepSpeed's gradient swapper's pool, in MiB units
# DeepSpeed ZeRO-3's reduce_and_partition_stream: one CUDA stream, so the reduce-scatter and every
# copy of partition_grads run in issue order (stage3.py __reduce_and_partition_ipg_grads ->
# partition_grads; deepspeed_runtime.md §3 "All copies are on RS, after the reduce-scatter")
REDUCTION_STREAM = "grad_rs"


def _kept(bucket: int) -> TensorRef:
    """The part of reduce bucket ``bucket``'s boundary gradient kept on the GPU
    (:attr:`LayerGrads.boundary_kept_gpu_bytes`)."""
    return TensorRef(TensorKind.BUFFER, group=bucket)


def _head(bucket: int) -> TensorRef:
    """Reduce bucket ``bucket``'s first gradient, held from the previous bucket's flush
    (:attr:`GradBucket.head_bytes`)."""
    return TensorRef(TensorKind.BUFFER, unit=-4, group=bucket, mb=CUR_MB)


#: DeepSpeed ZeRO-3's IPG bucket buffer(s) (:attr:`Grads.ipg_bytes`)
IPG_BUFFER = TensorRef(TensorKind.BUFFER, unit=-5, group=-5, mb=CUR_MB)


def _last_of(b: BlockBuilder, stream: str) -> list[int]:
    """The last op emitted on ``stream`` so far, as a dependency list (empty: none)."""
    last = b.last_on(stream)
    return [] if last is None else [last]


def grad_home(layer: int) -> TensorRef:
    """A layer's gradient where the optimizer reads it (written by the last micro-batch)."""
    return TensorRef(TensorKind.GRAD_OPT, unit=layer)


@dataclass(frozen=True)
class LayerUpdate:
    """Layer-wise schedule: the CPU update of one layer as soon as its last gradient is home:
    ``swap_in`` / ``swap_out`` of NVMe optimizer state (``state_bytes`` held in pinned memory
    meanwhile), the CPU Adam flow, the flow that sends its 16-bit parameters home."""

    adam: Flow
    swap_in: StorageIO | None
    swap_out: StorageIO | None
    state_bytes: int
    params_home: Flow | None
    params_home_stream: str | None


@dataclass(frozen=True)
class LayerGrads:
    """One layer's gradient path.

    Attributes:
        reduce: the data-parallel collective (None: dp 1 or no GPU-to-GPU path).
        offloaded: gradients leave the GPU (else only ``reduce`` runs, beside the backward).
        compress_s: GPU seconds of the projection before the copy (0: none).
        buffer_bytes: GPU bytes the copy holds (a layer's gradient, at most one bucket).
        d2h: the copy of the partition down (None: nothing leaves, e.g. all updated on the GPU).
        host_buffer_bytes: a layer-wise host gradient buffer (0: the whole-model buffer).
        accumulate_first / accumulate: the host accumulate copy in the first / later micro-batches.
        cast / nvme_read / nvme_write: gradients kept on NVMe (cast, read the partial sum, write).
        update: the layer-wise CPU update (None: after-backward step).
        gpu_adam_s: layer-wise GPU Adam of the GPU-resident share, at the last micro-batch.
        roundtrip_h2d: DeepSpeed ZeRO-3's ``partition_grads`` (stage3.py, v0.6.0+,
            deepspeed_runtime.md §3): the 16-bit accumulator lives in host memory and the addition
            runs on the GPU, so after each micro-batch's D2H the accumulator slice comes back up
            (H2D, b_acc per element); set, the host-side accumulate/cast flows are not used.
        boundary_d2h: on DeepSpeed's path, the boundary micro-batch's fp32 gradient (cast on the
            GPU, D2H 4 B per element, ``_offload_grad_partition_at_boundary``); None: none (e.g.
            MLP-Offload's 16-bit host gradients).
        swap_units: on DeepSpeed's path with gradients on NVMe, the units of the gradient
            swapper's pool the boundary copy holds until its NVMe write is done (0: no swapper).
        boundary_cast: a host pass after the boundary copy (older releases' CPU upcast or
            bounce-buffer copy, :class:`~offsim.plan.deepspeed_versions.Z3Fp32GradCopy`).
        boundary_blocking: the host thread, which issues the compute, waits for the boundary copy
            (a blocking or pageable copy), so the next layer's backward starts after it.
        boundary_norm_s: on DeepSpeed's path, GPU seconds of the boundary's per-parameter fp64 L2
            norms on the reduction stream, before the boundary copy (stage3.py ``partition_grads``
            -> ``_constant_buffered_norm2``); 0: none.
        boundary_gpu_bytes: GPU bytes held from those norms until the boundary copy is done (the
            largest parameter's GPU slice and fp64 chunk; with the gradient swapper also every
            fp32 ``grad_buffer.float()`` of the bucket); 0: none.
        boundary_kept_gpu_bytes: GPU bytes of the boundary gradient kept on the GPU for the
            sub-groups a Deep Optimizer States step updates there (the artifact fork's stage3.py
            ``partition_grads``: ``prefetch_optimizer_gpu_fp32_grads[i]``, deleted as its step
            takes it), allocated at the boundary and freed when backward ends; 0: none.
    """

    reduce: Flow | None
    offloaded: bool
    compress_s: float = 0.0
    buffer_bytes: int = 0
    d2h: Flow | None = None
    host_buffer_bytes: int = 0
    host_tier: Tier = Tier.HOST_PINNED
    accumulate_first: Flow | None = None
    accumulate: Flow | None = None
    cast: Flow | None = None
    nvme_read: Flow | None = None
    nvme_write: Flow | None = None
    update: LayerUpdate | None = None
    gpu_adam_s: float = 0.0
    roundtrip_h2d: Flow | None = None
    boundary_d2h: Flow | None = None
    swap_units: int = 0
    boundary_cast: Flow | None = None
    boundary_blocking: bool = False
    boundary_norm_s: float = 0.0
    boundary_gpu_bytes: int = 0
    boundary_kept_gpu_bytes: int = 0


@dataclass(frozen=True)
class GradBucket:
    """One DeepSpeed ZeRO-3 reduce bucket (stage3.py ``__reduce_and_partition_ipg_grads``): the
    gradients of ``pieces`` ((layer, elements), in the order they entered it) reduce-scattered and
    copied as one, issued after the backward of ``flush_layer`` (the layer of its last gradient,
    :func:`offsim.plan.model.reduce_buckets`). ``flows``: its reduce-scatter and
    ``partition_grads`` copies, sized by its elements (:class:`LayerGrads`, DeepSpeed's fields);
    ``continues``: layers with gradients in an earlier bucket of the same backward.

    ``head_bytes``: GPU bytes of its first gradient (at most ``flows.buffer_bytes``), which exists
    before the previous bucket's flush: its hook is what flushes that bucket (stage3.py
    ``reduce_independent_p_g_buckets_and_remove_grads`` runs in the hook of the gradient that
    would overflow the bucket, after autograd made it), so the previous flush allocates it and
    this bucket's flush the rest of ``buffer_bytes``; 0: the first bucket, or none held.

    ``ready_at``: (layer, fraction of its backward kernels) where the gradient that overflows it
    (the next bucket's first) is ready, its hook flushing it; None: the last bucket (the
    epilogue). ``flush_at``: (layer, cut) where the gradient hook that flushes it runs, inside that layer's
    backward (:meth:`Grads.emit_hook`, called by the compute mechanism after cut ``cut`` of the
    layer's backward kernels: the next bucket's first gradient is ready there); None: issued
    after ``flush_layer``'s backward (the last bucket, flushed by the epilogue, or a compute
    mechanism without gradient hooks)."""

    pieces: tuple[tuple[int, int], ...]
    flush_layer: int
    flows: LayerGrads
    continues: tuple[int, ...] = ()
    head_bytes: int = 0
    ready_at: tuple[int, float] | None = None
    flush_at: tuple[int, int] | None = None

    @property
    def layers(self) -> tuple[int, ...]:
        """The layers whose gradients it holds."""
        return tuple(u for u, _ in self.pieces)


@dataclass(frozen=True)
class Grads:
    """Reduce, compress, offload and accumulate gradients; ``overlap``: backward continues while
    they leave (else it waits); ``host_slots``: layer-wise host gradient buffers (None: none);
    ``swap_pool_units``: DeepSpeed's gradient swapper's pool (0: none), in the units of
    :attr:`LayerGrads.swap_units`; ``drain_at_end``: the backward ends with the host waiting for
    every layer's gradient copies (DeepSpeed ZeRO-3's ``independent_gradient_partition_epilogue``:
    ``reduce_and_partition_stream.synchronize()``, deepspeed_runtime.md §3 "End of backward").
    ``buckets``: DeepSpeed ZeRO-3's reduce buckets (:class:`GradBucket`), which then replace the
    per-layer offload of ``layers``; ``grad_slots``: reductions in flight before the compute
    stream (the host that issues it) waits (2; DeepSpeed ZeRO-3: 3, stage3.py
    ``__reduce_and_partition_ipg_grads`` synchronizes the oldest event while more than
    ``max_param_reduce_events`` = 2 are unfinished).

    DeepSpeed ZeRO-3 only: ``ipg_bytes``, its IPG bucket buffer(s) made per backward (0: none;
    ``NEXT_FLUSH``, v0.3.12-v0.5.10), held while backward runs (from a micro-batch's first
    backward layer to the epilogue); ``SAME_FLUSH``'s one buffer is kept from start-up, a static
    item (:func:`offsim.systems._part_grads.startup_ipg_buffer_bytes`), so 0 here; ``flush``, the release's
    :class:`~offsim.plan.deepspeed_versions.Z3GradFlush` (``NEXT_FLUSH``: a bucket's buffer is
    freed at the next flush, after the host waited for that bucket's reduction);
    ``buckets_alive``: the buckets whose ``buffer_bytes`` can be held at once (the footprint's
    count, as the schedule holds them: the reductions in flight, 1 when every flush is waited
    for, 2 with ``NEXT_FLUSH``)."""

    layers: tuple[LayerGrads, ...]
    overlap: bool
    host_slots: int | None
    io_concurrency: int | None = None
    swap_pool_units: int = 0
    drain_at_end: bool = False
    buckets: tuple[GradBucket, ...] = ()
    grad_slots: int = 2
    ipg_bytes: int = 0
    flush: Z3GradFlush = DEFAULT_Z3_GRAD_FLUSH
    buckets_alive: int = 3
    id: MechanismId = MechanismId.GRADS

    def setup(self) -> Setup:
        names = ("grad_reduce", "grad_d2h", "grad_host", "grad_nvme", "cpu_update", "param_update_h2d")
        # the layer-wise update runs as one program per layer (in order); the rest are queues
        streams = tuple(StreamSpec(s, StreamKind.CPU if s in ("grad_host", "cpu_update") else StreamKind.COPY,
                                   in_order=s == "cpu_update")
                        for s in names)
        if self.buckets or any(g.roundtrip_h2d is not None for g in self.layers):
            streams = (*streams, StreamSpec(REDUCTION_STREAM, StreamKind.COPY, in_order=True))
        pools = [PoolSpec(GRAD_SLOTS, self.grad_slots)]
        if self.host_slots is not None:
            pools.append(PoolSpec(HOST_GRAD_SLOTS, self.host_slots))
        if self.swap_pool_units > 0:
            pools.append(PoolSpec(GRAD_SWAP_UNITS, self.swap_pool_units))
        return Setup(streams=streams, pools=(*pools, *io_pools(self.io_concurrency)))

    def footprint(self) -> tuple[Need, ...]:
        """The two GPU gradient buffers of the offload (:data:`GRAD_SLOTS`; DeepSpeed ZeRO-3:
        :meth:`_buckets_held` and the IPG buffer(s)), DeepSpeed's boundary norm workspace
        (:attr:`LayerGrads.boundary_gpu_bytes`), the layer-wise host gradient buffers
        (:data:`HOST_GRAD_SLOTS`), and the pinned buffer of the one layer-wise update the in-order
        ``cpu_update`` stream swaps at a time."""
        off = [g for g in self.layers if g.offloaded]
        held = [b.flows for b in self.buckets] if self.buckets else off
        held_bytes = self._buckets_held() if self.buckets else self.grad_slots * max(
            (g.buffer_bytes for g in off), default=0)
        needs = [Need(Tier.GPU, "gradient buffers before offload", held_bytes)]
        if self.ipg_bytes > 0:
            needs.append(Need(Tier.GPU, "IPG bucket buffer(s)", self.ipg_bytes))
        norms = max((g.boundary_gpu_bytes for g in held), default=0)
        if norms > 0:  # one boundary at a time: the reduction stream runs them in issue order
            needs.append(Need(Tier.GPU, "boundary gradient norms (fp64 chunk, GPU slices)", norms))
        kept = sum(b.flows.boundary_kept_gpu_bytes for b in self.buckets)
        if kept > 0:
            needs.append(Need(Tier.GPU, "gradients kept on the GPU for its sub-groups' step", kept))
        if self.host_slots is not None and off:
            biggest = max(off, key=lambda g: g.host_buffer_bytes)
            needs.append(Need(biggest.host_tier, f"grads (optimizer format), {self.host_slots} layer buffers",
                              self.host_slots * biggest.host_buffer_bytes))
        swapped = [g.update.state_bytes for g in off if g.update is not None and g.update.swap_in is not None]
        needs.append(Need(Tier.HOST_PINNED, "optimizer swap buffers", max(swapped, default=0)))
        return tuple(needs)

    def _buckets_held(self) -> int:
        """The most bucket bytes the schedule holds at once: ``buckets_alive`` consecutive buckets
        (each from its flush, its head from the flush before) and the head of the bucket after
        them, which that window's last flush allocates."""
        n, held = self.buckets_alive, [b.flows.buffer_bytes for b in self.buckets]
        heads = [b.head_bytes for b in self.buckets] + [0]
        return max((sum(held[i:i + n]) + heads[min(i + n, len(held))] for i in range(len(held))), default=0)

    def emit(self, b: BlockBuilder, site: Site, stage: Stage) -> None:
        if site.what is not SiteKind.BACKWARD or stage is not Stage.AFTER:
            return
        g = self.layers[site.layer]
        if self.buckets:
            self._emit_buckets(b, site)
            return
        if not g.offloaded:
            if g.reduce is not None:
                b.add(g.reduce, tag(Activity.GRAD_REDUCE, self.id, Phase.BACKWARD, site.layer),
                      reads=(grad16(site.layer),), writes=(grad_home(site.layer),))
            return
        self._offload(b, site, g)
        if self.drain_at_end and site.layer == 0:  # the last layer of backward: the epilogue's sync
            self._drain(b, site)

    def _drain(self, b: BlockBuilder, site: Site) -> int:
        """The epilogue's ``reduce_and_partition_stream.synchronize()`` after the last layer."""
        homes = tuple(grad_home(u) for u, lg in enumerate(self.layers) if lg.offloaded)
        return b.add(Join(), tag(Activity.GRAD_OFFLOAD, self.id, Phase.BACKWARD, site.layer,
                          label="waits for the reduction stream (end of backward)"), COMPUTE, reads=homes,
              stall=Wait("the reduction stream at the end of backward"))

    def _emit_buckets(self, b: BlockBuilder, site: Site) -> None:
        """The IPG buffer(s) at the first layer of backward, the buckets flushed after this layer's
        backward, in order, then (after layer 0, the last of backward) the epilogue: the drain,
        the last bucket's buffer with ``NEXT_FLUSH`` (stage3.py v0.3.15
        ``independent_gradient_partition_epilogue``: ``partition_previous_reduced_grads``), the
        IPG buffer(s) (``_release_ipg_buffers``)."""
        t = tag(Activity.GRAD_OFFLOAD, self.id, Phase.BACKWARD, site.layer)
        hooked = any(bk.flush_at is not None for bk in self.buckets)
        if self.ipg_bytes > 0 and site.position == 0 and not hooked:  # after this layer's backward kernels
            b.add(Alloc(Tier.GPU, self.ipg_bytes, IPG_BUFFER), t, after=_last_of(b, COMPUTE))
        for k, bucket in enumerate(self.buckets):
            if bucket.flush_layer == site.layer and bucket.flush_at is None:
                self._bucket(b, site, k, bucket)
        if site.layer != 0:
            return
        ends = [self._drain(b, site)] if self.drain_at_end else []
        if self.flush is Z3GradFlush.NEXT_FLUSH:
            ends += self._free_previous(b, site, len(self.buckets), ends)
        if self.ipg_bytes > 0:  # after the last use of the buffer on the reduction stream
            b.add(Free(Tier.GPU, IPG_BUFFER), t, after=[*ends, *_last_of(b, REDUCTION_STREAM)])
        if self.drain_at_end and site.last_mb:  # the gradients kept on the GPU go when backward ends
            for k, bucket in enumerate(self.buckets):
                if bucket.flows.boundary_kept_gpu_bytes > 0:
                    b.add(Free(Tier.GPU, _kept(k)), tag(Activity.GRAD_OFFLOAD, self.id, Phase.BACKWARD, 0),
                          after=ends[:1])

    def emit_hook(self, b: BlockBuilder, site: Site, cut: int) -> None:
        """The gradient hook after cut ``cut`` of ``site``'s backward kernels: the bucket the
        gradient ready there overflows is reduced and partitioned (stage3.py
        ``reduce_independent_p_g_buckets_and_remove_grads``: ``__reduce_and_partition_ipg_grads``
        when ``bucket.elements + param.ds_numel > reduce_bucket_size``), its host waits (the
        reduce throttle, a blocking copy) on the compute stream before the layer's next kernels,
        its reduction and copies on the reduction stream beside them (the same rule in v0.3.15's
        stage3.py, so no version switch). The IPG buffer(s) made per backward (``NEXT_FLUSH``)
        come at the first layer's first gradient, before any flush."""
        if self.ipg_bytes > 0 and site.position == 0 and cut == 0:
            b.add(Alloc(Tier.GPU, self.ipg_bytes, IPG_BUFFER), tag(Activity.GRAD_OFFLOAD, self.id, Phase.BACKWARD,
                                                                   site.layer), after=_last_of(b, COMPUTE))
        for k, bucket in enumerate(self.buckets):
            if bucket.flush_at == (site.layer, cut):  # its ops named for its own layer, as unhooked
                self._bucket(b, replace(site, layer=bucket.flush_layer), k, bucket)

    def _hold(self, b: BlockBuilder, site: Site, k: int, bucket: GradBucket, slot: int) -> int:
        """At bucket ``k``'s flush: its gradients not yet held (``buffer_bytes`` less the head the
        previous flush took) and the next bucket's head; returns the first allocation (which reads
        the bucket's gradients: the reduction follows it)."""
        t = tag(Activity.GRAD_OFFLOAD, self.id, Phase.BACKWARD, site.layer)
        rest = bucket.flows.buffer_bytes - bucket.head_bytes
        held = b.add(Alloc(Tier.GPU, rest, self._held(k)[0]), t, after=[slot],
                     reads=tuple(grad16(v) for v in bucket.layers))
        if k + 1 < len(self.buckets) and self.buckets[k + 1].head_bytes > 0:
            b.add(Alloc(Tier.GPU, self.buckets[k + 1].head_bytes, _head(k + 1)), t, after=[slot])
        return held

    def _held(self, k: int) -> tuple[TensorRef, ...]:
        """What bucket ``k`` holds: its buffer and, if any, its head."""
        buf = TensorRef(TensorKind.BUFFER, unit=self.buckets[k].flush_layer, group=k, mb=CUR_MB)
        return (buf, _head(k)) if self.buckets[k].head_bytes > 0 else (buf,)

    def _free_previous(self, b: BlockBuilder, site: Site, k: int, after: list[int]) -> list[int]:
        """``NEXT_FLUSH``: at bucket ``k``'s flush (``k`` = the number of buckets: the epilogue) the
        host waits for the previous bucket's reduction (v0.3.15 ``reduce_ipg_grads``:
        ``reduction_stream.synchronize()``), then ``partition_previous_reduced_grads`` frees its
        gradients once its copies are done; returns the frees."""
        if k == 0 or (self.id, "z3_end", k - 1) not in b.marks:
            return []
        reduced, end = b.marks[(self.id, "z3_reduced", k - 1)], b.marks[(self.id, "z3_end", k - 1)]
        t = tag(Activity.GRAD_OFFLOAD, self.id, Phase.BACKWARD, site.layer)
        if k < len(self.buckets):
            b.add(Join(), tag(Activity.GRAD_OFFLOAD, self.id, Phase.BACKWARD, site.layer,
                              label="waits for the previous bucket's reduction"), COMPUTE, after=[reduced],
                  stall=Wait("the previous bucket's reduction"))
        return [b.add(Free(Tier.GPU, ref), t, after=[end, *after]) for ref in self._held(k - 1)]

    def _bucket(self, b: BlockBuilder, site: Site, k: int, bucket: GradBucket) -> None:
        """One bucket on DeepSpeed ZeRO-3's reduction stream (stage3.py
        ``__reduce_and_partition_ipg_grads``): the host waits while 3 earlier reductions are
        unfinished (a :data:`GRAD_SLOTS` slot on the compute stream), then, in issue order on
        ``reduce_and_partition_stream``, the reduce-scatter and ``partition_grads``' copies (the
        round trip every micro-batch; on the boundary the fp32 copy), after which the bucket's
        event is recorded (the slot released) and, but with ``NEXT_FLUSH``, its gradients freed;
        the gradient swapper's NVMe writes follow."""
        g, u = bucket.flows, site.layer
        t = tag(Activity.GRAD_OFFLOAD, self.id, Phase.BACKWARD, u)
        slot = b.add(Acquire(GRAD_SLOTS, 1), tag(Activity.GRAD_OFFLOAD, self.id, Phase.BACKWARD, u,
                                                 label="waits for the reduce throttle (3 buckets in flight)"),
                     COMPUTE, stall=Wait("the reduce throttle (3 buckets in flight)"))
        next_flush = self.flush is Z3GradFlush.NEXT_FLUSH
        if next_flush:
            self._free_previous(b, site, k, [slot])
        last = reduced = self._hold(b, site, k, bucket, slot)
        for flow, activity in ((g.reduce, Activity.GRAD_REDUCE), (g.d2h, Activity.GRAD_OFFLOAD),
                               (g.roundtrip_h2d, Activity.GRAD_OFFLOAD)):
            if flow is not None:
                last = b.add(flow, tag(activity, self.id, Phase.BACKWARD, u), REDUCTION_STREAM, after=[last])
                reduced = last if activity is Activity.GRAD_REDUCE else reduced
        last = self._bucket_boundary(b, site, g, last, k)
        if next_flush:  # freed at the next flush (_free_previous)
            b.marks[(self.id, "z3_reduced", k)], b.marks[(self.id, "z3_end", k)] = reduced, last
        else:
            for ref in self._held(k):
                b.add(Free(Tier.GPU, ref), t, after=[last])
        b.add(Release(GRAD_SLOTS, 1), t, after=[last])
        end = self._bucket_swap(b, site, g, last)
        b.add(Join(), t, after=[end], reads=tuple(grad_home(v) for v in bucket.continues),
              writes=tuple(grad_home(v) for v in bucket.layers))
        if not self.overlap:
            b.add(Join(), tag(Activity.GRAD_OFFLOAD, self.id, Phase.BACKWARD, u, label="waits for gradient offload"),
                  COMPUTE, after=[end], stall=Wait("gradient offload"))

    def _norms(self, b: BlockBuilder, site: Site, g: LayerGrads, last: int, group: int) -> tuple[int, TensorRef]:
        """The boundary's fp64 norms on the reduction stream after ``last``, holding
        ``boundary_gpu_bytes`` (freed by :meth:`_norms_done`); returns the op to follow and the
        buffer (stage3.py ``partition_grads``: ``_constant_buffered_norm2`` per parameter)."""
        buf = TensorRef(TensorKind.WORKSPACE, unit=site.layer, group=group, mb=CUR_MB)
        t = tag(Activity.GRAD_OFFLOAD, self.id, Phase.BACKWARD, site.layer, label="gradient norms (fp64)")
        if g.boundary_gpu_bytes > 0:
            last = b.add(Alloc(Tier.GPU, g.boundary_gpu_bytes, buf), t, after=[last])
        if g.boundary_norm_s > 0:
            last = b.add(Delay(g.boundary_norm_s), t, REDUCTION_STREAM, after=[last])
        return last, buf

    def _norms_done(self, b: BlockBuilder, site: Site, g: LayerGrads, last: int, buf: TensorRef) -> None:
        if g.boundary_gpu_bytes > 0:
            b.add(Free(Tier.GPU, buf), tag(Activity.GRAD_OFFLOAD, self.id, Phase.BACKWARD, site.layer), after=[last])

    def _bucket_boundary(self, b: BlockBuilder, site: Site, g: LayerGrads, last: int, k: int) -> int:
        """The boundary micro-batch's norms and fp32 copy of bucket ``k`` on the reduction stream
        (the copy after a slot of the gradient swapper's pool, which the host waits for), its host
        pass and, when blocking, the compute stream's wait (``_offload_grad_partition_at_boundary``)."""
        if not site.last_mb:
            return last
        t = tag(Activity.GRAD_OFFLOAD, self.id, Phase.BACKWARD, site.layer)
        last, norm_buf = self._norms(b, site, g, last, k)
        if g.boundary_kept_gpu_bytes > 0:
            last = b.add(Alloc(Tier.GPU, g.boundary_kept_gpu_bytes, _kept(k)), t, after=[last])
        deps = [last]
        if g.swap_units > 0:
            deps.append(b.add(Acquire(GRAD_SWAP_UNITS, g.swap_units),
                              tag(Activity.GRAD_OFFLOAD, self.id, Phase.BACKWARD, site.layer,
                                  label="waits for the gradient swapper's buffers"), COMPUTE,
                              stall=Wait("the gradient swapper's buffers")))
        if g.boundary_d2h is not None:
            last = b.add(g.boundary_d2h, t, REDUCTION_STREAM, after=deps)
        self._norms_done(b, site, g, last, norm_buf)
        if g.boundary_cast is not None:
            last = b.add(g.boundary_cast, tag(Activity.GRAD_CAST, self.id, Phase.BACKWARD, site.layer), "grad_host",
                         after=[last])
        if g.boundary_blocking:
            b.add(Join(), tag(Activity.GRAD_OFFLOAD, self.id, Phase.BACKWARD, site.layer,
                              label="waits for the blocking gradient copy"), COMPUTE, after=[last],
                  stall=Wait("a blocking gradient copy"))
        return last

    def _bucket_swap(self, b: BlockBuilder, site: Site, g: LayerGrads, last: int) -> int:
        """On the boundary, the gradient swapper's asynchronous NVMe write of a bucket's fp32
        gradients, then its pool units back."""
        if not site.last_mb:
            return last
        t = tag(Activity.GRAD_OFFLOAD, self.id, Phase.BACKWARD, site.layer)
        if g.nvme_write is not None:
            last = b.add(g.nvme_write, t, "grad_nvme", after=[last])
        if g.swap_units > 0:
            last = b.add(Release(GRAD_SWAP_UNITS, g.swap_units), t, after=[last])
        return last

    def _offload(self, b: BlockBuilder, site: Site, g: LayerGrads) -> None:
        u = site.layer
        t = tag(Activity.GRAD_OFFLOAD, self.id, Phase.BACKWARD, u)
        if g.compress_s > 0:
            b.add(Delay(g.compress_s), tag(Activity.GRAD_COMPRESS, self.id, Phase.BACKWARD, u), COMPUTE)
        if g.host_buffer_bytes > 0:
            b.add(Acquire(HOST_GRAD_SLOTS, 1), tag(Activity.GRAD_OFFLOAD, self.id, Phase.BACKWARD, u,
                                                    label="waits for a free host gradient buffer"), COMPUTE,
                  stall=Wait("a free host gradient buffer"))
        slot = b.add(Acquire(GRAD_SLOTS, 1), tag(Activity.GRAD_OFFLOAD, self.id, Phase.BACKWARD, u,
                                                 label="waits for a free gradient buffer"), COMPUTE,
                     stall=Wait("a free gradient buffer"))
        buf = TensorRef(TensorKind.BUFFER, unit=u, mb=CUR_MB)
        last = b.add(Alloc(Tier.GPU, g.buffer_bytes, buf), t, after=[slot], reads=(grad16(u),))
        rs = g.roundtrip_h2d is not None  # DeepSpeed ZeRO-3: everything below on its reduction stream
        if g.reduce is not None:
            last = b.add(g.reduce, tag(Activity.GRAD_REDUCE, self.id, Phase.BACKWARD, u),
                         REDUCTION_STREAM if rs else "grad_reduce", after=[last])
        if g.d2h is not None:
            last = b.add(g.d2h, t, REDUCTION_STREAM if rs else "grad_d2h", after=[last])
        if g.roundtrip_h2d is not None:  # the accumulator slice back to a GPU tensor, on the same stream
            last = b.add(g.roundtrip_h2d, t, REDUCTION_STREAM, after=[last])
        b.add(Free(Tier.GPU, buf), t, after=[last])
        last = b.add(Release(GRAD_SLOTS, 1), t, after=[last])
        end = self._on_host(b, site, g, last)
        if not self.overlap:
            b.add(Join(), tag(Activity.GRAD_OFFLOAD, self.id, Phase.BACKWARD, u, label="waits for gradient offload"),
                  COMPUTE, after=[end], stall=Wait("gradient offload"))
        if g.gpu_adam_s > 0 and site.last_mb:
            b.add(Delay(g.gpu_adam_s), tag(Activity.OPTIMIZER, MechanismId.GPU_OPTIMIZER, Phase.BACKWARD, u,
                                           label="GPU Adam (GPU-resident share)"), COMPUTE)

    def _on_host(self, b: BlockBuilder, site: Site, g: LayerGrads, last: int) -> int:
        """The host side after the copy; returns the id of its last op (it writes the layer's
        optimizer gradient, or, layer-wise, the layer's update)."""
        u = site.layer
        home = grad_home(u)
        if g.roundtrip_h2d is not None:
            return self._deepspeed_boundary(b, site, g, last)
        host_buf = TensorRef(TensorKind.BUFFER, unit=u, group=0)
        if g.host_buffer_bytes > 0:
            last = b.add(Alloc(g.host_tier, g.host_buffer_bytes, host_buf), tag(Activity.GRAD_OFFLOAD, self.id,
                                                                                 Phase.BACKWARD, u), after=[last])
        if g.update is not None and g.d2h is None:  # all of it is updated on the GPU
            return b.add(Join(), tag(Activity.GRAD_OFFLOAD, self.id, Phase.BACKWARD, u), after=[last],
                         writes=(home,))
        if g.update is not None and site.last_mb:  # the gradient stays in DRAM for the update
            acc = tag(Activity.GRAD_ACCUMULATE, self.id, Phase.BACKWARD, u)
            last = b.add(g.accumulate_first, acc, "grad_host", after=[last])  # type: ignore[arg-type]
            return self._update(b, u, g, last)
        if g.cast is not None:
            last = b.add(g.cast, tag(Activity.GRAD_CAST, self.id, Phase.BACKWARD, u), "grad_host", after=[last])
            t = tag(Activity.GRAD_OFFLOAD, self.id, Phase.BACKWARD, u)
            if not site.first_mb:
                last = b.add(g.nvme_read, t, "grad_nvme", after=[last])  # type: ignore[arg-type]
            return b.add(g.nvme_write, t, "grad_nvme", after=[last], writes=(home,))  # type: ignore[arg-type]
        flow = g.accumulate_first if site.first_mb else g.accumulate
        return b.add(flow, tag(Activity.GRAD_ACCUMULATE, self.id, Phase.BACKWARD, u), "grad_host",  # type: ignore[arg-type]
                     after=[last], writes=(home,))

    def _deepspeed_boundary(self, b: BlockBuilder, site: Site, g: LayerGrads, last: int) -> int:
        """DeepSpeed ZeRO-3's boundary micro-batch (stage3.py ``partition_grads`` ->
        ``_offload_grad_partition_at_boundary``): the fp32 gradient leaves the GPU; with gradients
        on NVMe it is copied into the gradient swapper's buffers (``_swap_out_offload_fp32_gradients``
        -> async_swapper.py ``AsyncTensorSwapper``) and written asynchronously, and the host
        thread, which issues the compute, blocks while the pool has no room
        (``_flush_buffers_until_complete``; deepspeed_runtime.md §7). Earlier micro-batches end
        with the round trip: the gradient is in the host accumulator."""
        u = site.layer
        t = tag(Activity.GRAD_OFFLOAD, self.id, Phase.BACKWARD, u)
        if site.last_mb:
            last, norm_buf = self._norms(b, site, g, last, -1)
            deps = [last]
            if g.swap_units > 0:
                deps.append(b.add(Acquire(GRAD_SWAP_UNITS, g.swap_units),
                                  tag(Activity.GRAD_OFFLOAD, self.id, Phase.BACKWARD, u,
                                      label="waits for the gradient swapper's buffers"), COMPUTE,
                                  stall=Wait("the gradient swapper's buffers")))
            if g.boundary_d2h is not None:  # after this partition's round trip, on the reduction stream
                last = b.add(g.boundary_d2h, t, REDUCTION_STREAM, after=deps)
            self._norms_done(b, site, g, last, norm_buf)
            if g.boundary_cast is not None:
                last = b.add(g.boundary_cast, tag(Activity.GRAD_CAST, self.id, Phase.BACKWARD, u), "grad_host",
                             after=[last])
            if g.boundary_blocking:
                b.add(Join(), tag(Activity.GRAD_OFFLOAD, self.id, Phase.BACKWARD, u,
                                  label="waits for the blocking gradient copy"), COMPUTE, after=[last],
                      stall=Wait("a blocking gradient copy"))
            if g.nvme_write is not None:  # (16-bit host gradients on NVMe: from the accumulator)
                last = b.add(g.nvme_write, t, "grad_nvme", after=[last])
            if g.swap_units > 0:
                last = b.add(Release(GRAD_SWAP_UNITS, g.swap_units), t, after=[last])
        return b.add(Join(), t, after=[last], writes=(grad_home(u),))

    def _update(self, b: BlockBuilder, u: int, g: LayerGrads, last: int) -> int:
        """The layer-wise CPU update on the ``cpu_update`` stream. Its work is tagged the CPU
        optimizer's; the buffers it allocates and frees (the pinned optimizer swap buffer, the host
        gradient buffer) are tagged :class:`Grads`', which declares them in :meth:`footprint`."""
        up = g.update
        assert up is not None
        state = TensorRef(TensorKind.OPT_STATE, unit=u)
        t = lambda a: tag(a, MechanismId.CPU_OPTIMIZER, Phase.BACKWARD, u)  # noqa: E731
        mine = lambda a: tag(a, self.id, Phase.BACKWARD, u)  # noqa: E731
        if up.swap_in is not None:
            last = b.add(Alloc(Tier.HOST_PINNED, up.state_bytes, state), mine(Activity.OPT_SWAP_IN), "cpu_update",
                         after=[last])
            last = parallel(b, up.swap_in, t(Activity.OPT_SWAP_IN), [last], "cpu_update")
        last = b.add(up.adam, t(Activity.OPTIMIZER), "cpu_update", after=[last])
        if up.swap_out is not None:
            last = parallel(b, up.swap_out, t(Activity.OPT_SWAP_OUT), [last], "cpu_update")
            last = b.add(Free(Tier.HOST_PINNED, state), mine(Activity.OPT_SWAP_OUT), "cpu_update", after=[last])
        if up.params_home is not None:
            last = b.add(up.params_home, t(Activity.PARAM_UPDATE), up.params_home_stream or "cpu_update",
                         after=[last])
        if g.host_buffer_bytes > 0:
            host_buf = TensorRef(TensorKind.BUFFER, unit=u, group=0)
            last = b.add(Free(g.host_tier, host_buf), mine(Activity.GRAD_OFFLOAD), "cpu_update", after=[last])
            last = b.add(Release(HOST_GRAD_SLOTS, 1), t(Activity.GRAD_OFFLOAD), "cpu_update", after=[last])
        # the update holds its thread until its parameters are home
        return b.add(Join(), t(Activity.OPTIMIZER), "cpu_update", after=[last], writes=(grad_home(u),))
