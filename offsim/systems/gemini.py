"""Colossal-AI Gemini (``GeminiPlugin``; PatrickStar, Fang et al., arXiv 2108.05818): chunk-based
heterogeneous memory management.

Parameters, in first-use order, are packed into equal-size chunks (a 16-bit chunk and its fp32
master chunk); each chunk is sharded over the data-parallel (ZeRO) group. Before an operator runs,
the chunks holding its parameters are brought to the GPU and all-gathered; once no running
operator needs them they are scattered back to their shards. When a chunk's gradients are
complete (backward) it is reduce-scattered and its gradient shard goes to the device of its
optimizer state. ``HybridAdam`` then steps every shard where it lives, after backward: CPU Adam
(Colossal's SIMD kernel; torch ops when gradients are bf16) for CPU-resident chunks, then one
fused GPU Adam for GPU-resident ones. The 16-bit copy of a CPU-updated shard is not refreshed on
the CPU: at its next access its fp32 master shard is copied H2D (4 B per element) and cast on the
GPU.

Sources (``../shared/reference/new_systems.md`` §4, read at ``hpcaitech/ColossalAI`` 4f9953be33):
``colossalai/zero/gemini/chunk/search_utils.py`` (chunk-size search), ``chunk/manager.py``
(``register_tensor``: whole tensors appended in order, a new chunk when one does not fit, an
oversized tensor in a chunk of its own rounded to the group size), ``gemini_hook.py`` (per-op
access, release before the next op's access), ``placement_policy.py`` (static fractions; auto),
``colossalai/booster/plugin/gemini_plugin.py`` (the knobs and defaults), ``nn/optimizer/hybrid_adam.py``.

What is modelled, per chunk: its padded size (the unit of movement and of memory rounding), its
shard's home (GPU, or CPU with ``offload_param_frac`` / the auto policy's eviction), where its
optimizer state and gradients live (``offload_optim_frac``; auto: the CPU unless
``gpu_margin_mem_ratio`` takes some back), and whether it stays gathered (``shard_param_frac``).
Simplifications (each named where it is made): offsim's unit of compute is a layer, so a chunk is
gathered at the first layer that uses it in a pass and released after the last; the static
policy's chunk choice (a set's order in Colossal) is taken in first-use order; the auto policy's
run-time OPT eviction is its steady state: the chunk shards that do not fit beside the non-model
data's peak are fetched at each use, those that fit stay; every micro-batch reduces and offloads
(no ``no_sync`` accumulation); HybridAdam's optional NVMe share (``nvme_offload_fraction``) is
left out.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Literal

import numpy as np
from pydantic import Field

from offsim.config.base import Frozen
from offsim.config.run import RunConfig
from offsim.config.workload import DTYPE_BYTES
from offsim.core.enums import Activity, MechanismId, Phase, StreamKind, TensorKind, Tier
from offsim.mechanisms.base import BlockBuilder, Need, Setup, Site, SiteKind, Stage, sum_needs, tag
from offsim.mechanisms.compute import COMPUTE, grad16
from offsim.mechanisms.grads import grad_home
from offsim.mechanisms.static_state import StaticItem, StaticState
from offsim.plan.footprint import StateSizes, layer_tensors
from offsim.plan.torch_cpu import TorchPass, torch_pass_flow
from offsim.schedule.ops import Acquire, Alloc, Delay, Flow, Free, Join, PoolSpec, Release, StreamSpec, TensorRef, Wait
from offsim.systems._compile import System
from offsim.systems._parts import Ctx, activations, build_ctx, compute, whole

OPTIONS: frozenset[str] = frozenset(())

MIB_ELEMS = 2**20  # Colossal's "_m" sizes are in 2^20 elements (search_utils.py: round(x * 1024**2))


class PlacementPolicy(StrEnum):
    """``GeminiPlugin(placement_policy=...)``."""

    STATIC = "static"
    AUTO = "auto"


#: the option as a strategy file spells it (strict pydantic takes the value, not the enum)
PlacementName = Literal["static", "auto"]


class Options(Frozen):
    """Gemini's knobs, with ``GeminiPlugin.__init__``'s names and defaults
    (``colossalai/booster/plugin/gemini_plugin.py``; ``new_systems.md`` §4 table).

    Attributes:
        placement_policy: ``static`` (the fractions below) or ``auto`` (a warm-up iteration's
            memory trace decides).
        shard_param_frac: static: share of chunk memory sharded (1.0: ZeRO-3; 0.0: ZeRO-2).
        offload_optim_frac: static: share of chunk memory whose fp32 master, moments and
            gradients live on the CPU (updated by CPU Adam).
        offload_param_frac: static: share of the 16-bit chunk shards kept on the CPU (honoured
            only when both other fractions are 1, as Colossal asserts).
        warmup_non_model_data_ratio: auto: share of GPU memory the warm-up leaves to non-model
            data (its model data is capped at the rest).
        steady_cuda_cap_ratio: auto: share of GPU memory usable after the warm-up.
        gpu_margin_mem_ratio: auto: share of the GPU memory left free after the warm-up that
            takes fp32 chunks and their Adam state back to the GPU (0: all on the CPU).
        max_prefetch: chunks fetched ahead of the operator that needs them (0: on demand).
        search_range_m / min_chunk_size_m: the chunk-size search's range and its least size, in
            2^20 elements.
        hidden_dim: the search's step in elements (None: 1024).
        chunk_size_m: a fixed chunk size in 2^20 elements instead of the search (what
            ``chunk_config_dict`` sets).
    """

    placement_policy: PlacementName = "static"
    shard_param_frac: float = Field(default=1.0, ge=0.0, le=1.0)
    offload_optim_frac: float = Field(default=0.0, ge=0.0, le=1.0)
    offload_param_frac: float = Field(default=0.0, ge=0.0, le=1.0)
    warmup_non_model_data_ratio: float = Field(default=0.8, gt=0.0, lt=1.0)
    steady_cuda_cap_ratio: float = Field(default=0.9, gt=0.0, le=1.0)
    gpu_margin_mem_ratio: float = Field(default=0.0, ge=0.0, le=1.0)
    max_prefetch: int = Field(default=0, ge=0)
    search_range_m: float = Field(default=32.0, ge=0.0)
    min_chunk_size_m: float = Field(default=32.0, ge=0.0)
    hidden_dim: int | None = Field(default=None, ge=1)
    chunk_size_m: float | None = Field(default=None, gt=0.0)


# ---------------------------------------------------------------- chunks
@dataclass(frozen=True)
class Chunk:
    """One chunk: ``capacity`` elements (padding included), ``used`` of them parameters, of the
    layers ``first_layer``..``last_layer`` (forward order); ``keep_gathered``: the whole model is
    smaller than the least chunk size, so it stays gathered on every rank."""

    capacity: int
    used: int
    first_layer: int
    last_layer: int
    keep_gathered: bool = False


def unused_elems(sizes: Sequence[int], chunk_elems: np.ndarray) -> np.ndarray:
    """Elements left unused when ``sizes`` are packed in order into chunks of each size of
    ``chunk_elems`` (``search_utils.py _get_unused_byte``, for all candidates at once)."""
    left = np.zeros_like(chunk_elems)
    acc = np.zeros_like(chunk_elems)
    for s in sizes:
        full = s > left
        acc += np.where(full, left, 0)
        left = np.where(full, chunk_elems, left) - s
    return left + acc


def search_chunk_elems(sizes: Sequence[int], dp: int, opt: Options) -> int:
    """The chunk size Colossal's search picks (``search_chunk_configuration``): drop tensors above
    mean + 3 sd, start at the largest left (at least ``min_chunk_size_m``) rounded up to the step,
    scan ``search_range_m`` in steps of ``hidden_dim`` (1024 if unset) for the least unused space
    (the first of equals), round up to a multiple of the group size."""
    if opt.chunk_size_m is not None:
        best = round(opt.chunk_size_m * MIB_ELEMS)
        return best + (-best % dp)
    arr = np.asarray(sizes, dtype=np.int64)
    kept = [int(s) for s in arr if s <= arr.mean() + 3 * arr.std()]
    step = opt.hidden_dim or 1024
    start = math.ceil(max([round(opt.min_chunk_size_m * MIB_ELEMS), *kept]) / step) * step
    cands = np.arange(start, start + round(opt.search_range_m * MIB_ELEMS) + 1, step, dtype=np.int64)
    best = int(cands[int(np.argmin(unused_elems(kept, cands)))])
    return best + (-best % dp)


def pack_chunks(tensors: Sequence[tuple[int, int]], chunk_elems: int, dp: int) -> tuple[Chunk, ...]:
    """``tensors`` as (layer, elements) in first-use order, appended whole to the last chunk, a
    new one when a tensor does not fit (``ChunkManager.register_tensor``); a tensor larger than
    the chunk size gets a chunk of its own size rounded up to the group size."""
    out: list[Chunk] = []
    for layer, n in tensors:
        last = out[-1] if out else None
        if last is not None and last.used + n <= last.capacity:
            out[-1] = Chunk(last.capacity, last.used + n, last.first_layer, layer)
            continue
        cap = chunk_elems if n <= chunk_elems else n + (-n % dp)
        out.append(Chunk(cap, n, layer, layer))
    return tuple(out)


def model_chunks(cfg: RunConfig, sz: StateSizes, opt: Options) -> tuple[Chunk, ...]:
    """The model's chunks: one gathered chunk when all parameters are fewer than
    ``min_chunk_size_m`` (``search_utils.py``: "let small parameters keep gathered"), else the
    searched size packed in first-use order."""
    tensors = [(lay.index, n) for lay in sz.layers for n in layer_tensors(cfg.workload.model, lay) if n > 0]
    total = sum(n for _, n in tensors)
    dp = sz.dp
    if opt.chunk_size_m is None and total < round(opt.min_chunk_size_m * MIB_ELEMS):
        return (Chunk(total, total, tensors[0][0], tensors[-1][0], keep_gathered=True),)
    return pack_chunks(tensors, search_chunk_elems([n for _, n in tensors], dp, opt), dp)


# ---------------------------------------------------------------- placement
@dataclass(frozen=True)
class Placement:
    """Per chunk: its 16-bit shard on the CPU; its optimizer state (fp32 master, moments,
    gradient shard) on the CPU; held gathered from its forward access until its gradients are
    reduced (the static policy's 1 - ``shard_param_frac``: not scattered after forward, so
    backward does not gather it again)."""

    shard_on_cpu: tuple[bool, ...]
    optim_on_cpu: tuple[bool, ...]
    held: tuple[bool, ...]


def first_chunks(chunks: Sequence[Chunk], frac: float) -> tuple[bool, ...]:
    """Chunks taken in order until their memory reaches ``frac`` of the total (Colossal's static
    policy stops once the running sum is at or above the target, so it may take one more)."""
    target = frac * sum(c.capacity for c in chunks)
    taken, out = 0, []
    for c in chunks:
        out.append(taken < target)
        taken += c.capacity if taken < target else 0
    return tuple(out)


def static_placement(chunks: Sequence[Chunk], opt: Options) -> Placement:
    """``StaticPlacementPolicy``: the first chunks up to ``offload_optim_frac`` keep their optimizer
    on the CPU; up to 1 - ``shard_param_frac`` stay gathered after use (the policy releases
    chunks only while gathered memory is above that share; the reduction after backward scatters
    them); up to ``offload_param_frac`` keep their 16-bit shard on the CPU (only when the other two
    are 1). A replicated chunk (``keep_gathered``) never moves."""
    param_frac = opt.offload_param_frac if opt.shard_param_frac == 1.0 and opt.offload_optim_frac == 1.0 else 0.0
    fixed = [c.keep_gathered for c in chunks]
    return Placement(tuple(p and not f for p, f in zip(first_chunks(chunks, param_frac), fixed, strict=True)),
                     first_chunks(chunks, opt.offload_optim_frac),
                     tuple(h and not f for h, f in zip(first_chunks(chunks, 1.0 - opt.shard_param_frac), fixed,
                                                        strict=True)))


@dataclass(frozen=True)
class Bytes:
    """Bytes per element: 16-bit parameter and gradient, fp32 master, Adam moments."""

    b16: float
    grad: float
    master: float
    moments: float


def element_bytes(cfg: RunConfig) -> Bytes:
    pr, moments = cfg.workload.precision, cfg.workload.optimizer.moments
    return Bytes(DTYPE_BYTES[pr.params], DTYPE_BYTES[pr.grads], DTYPE_BYTES[pr.master_params],
                 moments * DTYPE_BYTES[pr.optimizer_moments])


def auto_placement(c: Ctx, chunks: Sequence[Chunk], opt: Options) -> Placement:
    """``AutoPlacementPolicy`` in steady state: non-model data (the CUDA reserve and the
    activations' peak, what the warm-up's tracer measures) is taken from ``steady_cuda_cap_ratio``
    of GPU memory, and so is the gathered window, reserved as if every chunk in it were fetched
    whole (:func:`fetch_window_bytes`); chunk shards fit in the rest in order, the others stay on
    the CPU and are fetched at each use. Every chunk's optimizer lives on the CPU except what
    ``gpu_margin_mem_ratio`` of the memory still free takes back (fp32 master and moments, in
    order)."""
    b, dp = element_bytes(c.cfg), c.sz.dp
    cap = c.cfg.hardware.gpu.memory_bytes
    acts = activations(c).footprint()
    non_model = c.cfg.hardware.gpu.reserved_bytes + sum(sum_needs(acts, cap)["gpu"].values())
    room = opt.steady_cuda_cap_ratio * cap - non_model - fetch_window_bytes(chunks, len(c.layers), b.b16, opt)
    shard_on_cpu = []
    for ch in chunks:
        shard = b.b16 * ch.capacity / ranks(ch, dp)
        evict = room < shard and not ch.keep_gathered
        shard_on_cpu.append(evict)
        room -= 0.0 if evict else shard
    margin = opt.gpu_margin_mem_ratio * max(0.0, room)
    optim_on_cpu = []
    for ch in chunks:
        state = (b.master * ch.capacity + b.moments * ch.used) / ranks(ch, dp)
        optim_on_cpu.append(margin < state)
        margin -= 0.0 if margin < state else state
    return Placement(tuple(shard_on_cpu), tuple(optim_on_cpu), (False,) * len(chunks))


def ranks(ch: Chunk, dp: int) -> int:
    """The ranks a chunk is sharded over (1: replicated, ``keep_gathered``)."""
    return 1 if ch.keep_gathered else dp


def fetch_window_bytes(chunks: Sequence[Chunk], n_layers: int, b16: float, opt: Options) -> float:
    """GPU bytes of whole 16-bit chunks gathered at once, at most: those the widest layer spans,
    plus the prefetched ones and the ones still being reduced (each as large as the largest)."""
    moving = [ch for ch in chunks if not ch.keep_gathered]
    widest = max((sum(b16 * ch.capacity for ch in moving if ch.first_layer <= k <= ch.last_layer)
                  for k in range(n_layers)), default=0.0)
    largest = max((b16 * ch.capacity for ch in moving), default=0.0)
    return widest + (opt.max_prefetch + REDUCES_IN_FLIGHT) * largest


# ---------------------------------------------------------------- the chunk mechanism
REDUCE_SLOTS = "gemini_reduce_slots"  # chunks being reduce-scattered at once (Colossal's async reduce)
REDUCES_IN_FLIGHT = 2


@dataclass(frozen=True)
class ChunkIO:
    """One chunk's movement.

    Attributes:
        first_layer / last_layer: the layers it spans (forward order).
        gathered_bytes: GPU bytes it takes while gathered beyond its resident shard (0: kept
            gathered, or one rank with its shard on the GPU).
        refresh: the first forward after a step, a CPU-updated chunk's fp32 master shard H2D
            (4 B per element, cast on the GPU); None when its optimizer is on the GPU.
        fetch: every other access, its 16-bit shard H2D when the shard lives on the CPU.
        gather: the all-gather of its shards (None: one rank, or kept gathered).
        reduce: the reduce-scatter of its gradients (all-reduce when kept gathered).
        offload: its gradient shard D2H when its optimizer is on the CPU.
        write_back: its refreshed 16-bit shard D2H when forward releases it and the shard lives
            on the CPU (``Chunk.shard_move`` copies into the pinned CPU shard whenever the CPU
            copy is stale, ``cpu_vis_flag``; the refresh made it stale).
        held: forward does not release it; backward uses it as gathered (static
            ``shard_param_frac`` < 1).
    """

    first_layer: int
    last_layer: int
    gathered_bytes: int
    refresh: Flow | None
    fetch: Flow | None
    gather: Flow | None
    reduce: Flow | None
    offload: Flow | None
    write_back: Flow | None = None
    held: bool = False

    @property
    def moves(self) -> bool:
        """It is fetched or gathered per access (else it stays put on the GPU)."""
        return self.gathered_bytes > 0 or self.fetch is not None or self.refresh is not None or self.gather is not None


#: the fp32 master shards as HybridAdam leaves them (a refresh reads them, the step writes them)
MASTERS = TensorRef(TensorKind.OPT_STATE, unit=-1, group=-4)


def chunk_released(k: int, ch: ChunkIO) -> TensorRef:
    """Written when chunk ``k``'s gathered copy is freed after its gradients are reduced; the next
    gather of it (the next micro-batch's forward) reads it, so the two never overlap."""
    return TensorRef(TensorKind.PARAM16, unit=ch.first_layer, group=20_000 + k)


def chunk_ref(k: int, ch: ChunkIO) -> TensorRef:
    """Chunk ``k`` gathered on the GPU."""
    return TensorRef(TensorKind.PARAM16, unit=ch.first_layer, group=10_000 + k)


@dataclass(frozen=True)
class GeminiChunks:
    """Per-operator chunk access, release, gradient reduction and offload (``GeminiZeROHook``,
    ``GeminiDDP.grad_handle``), at layer granularity.

    A pass (forward, then backward in reverse) accesses a chunk at the first layer that uses it:
    GPU bytes for the gathered chunk, the H2D of its shard when it lives on the CPU (or of its
    fp32 master in the first forward after a step), then the all-gather; the compute stream waits
    for the layer's chunks (``max_prefetch`` > 0: later chunks are issued ahead). Forward releases
    a chunk after its last layer, except those of the last layer, which backward uses first; in
    backward a chunk stays gathered until its gradients are complete (its first layer), then it is
    reduce-scattered (at most :data:`REDUCES_IN_FLIGHT` at once) and its gradient shard goes D2H
    when its optimizer is on the CPU; then it is released. A held chunk stays gathered from its
    forward access to its reduction."""

    chunks: tuple[ChunkIO, ...]
    n_layers: int
    max_prefetch: int
    id: MechanismId = MechanismId.PARAM_FETCH

    def setup(self) -> Setup:
        names = ("chunk_h2d", "chunk_gather", "chunk_reduce", "chunk_d2h")
        return Setup(streams=tuple(StreamSpec(s, StreamKind.COPY, in_order=False) for s in names),
                     pools=(PoolSpec(REDUCE_SLOTS, REDUCES_IN_FLIGHT),))

    def footprint(self) -> tuple[Need, ...]:
        """The chunks gathered at once: the held ones, those the widest layer spans, the
        prefetched and the ones still being reduced."""
        moving = [ch for ch in self.chunks if ch.moves]
        held = sum(ch.gathered_bytes for ch in moving if ch.held)
        window = max((sum(ch.gathered_bytes for ch in moving if ch.first_layer <= k <= ch.last_layer and not ch.held)
                      for k in range(self.n_layers)), default=0)
        largest = max((ch.gathered_bytes for ch in moving), default=0)
        extra = (self.max_prefetch + REDUCES_IN_FLIGHT) * largest
        return (Need(Tier.GPU, "gathered chunks (Gemini)", held + window + extra),)

    def order(self, backward: bool) -> list[int]:
        """Moving chunks in the order a pass first uses them."""
        ks = [k for k, ch in enumerate(self.chunks) if ch.moves]
        return sorted(ks, key=lambda k: -self.chunks[k].last_layer) if backward else ks

    def needed(self, layer: int) -> list[int]:
        return [k for k, ch in enumerate(self.chunks) if ch.moves and ch.first_layer <= layer <= ch.last_layer]

    def emit(self, b: BlockBuilder, site: Site, stage: Stage) -> None:
        if site.what not in (SiteKind.FORWARD, SiteKind.BACKWARD):
            return
        backward = site.what is SiteKind.BACKWARD
        if stage is Stage.ISSUE:
            self._issue(b, site, backward)
        elif stage is Stage.WAIT:
            ready = [b.marks[("gemini", backward, k)] for k in self.needed(site.layer)]
            phase = Phase.BACKWARD if backward else Phase.FORWARD
            b.add(Join(), tag(Activity.PARAM_FETCH, self.id, phase, site.layer, label="waits for its chunks"),
                  COMPUTE, after=ready, stall=Wait("params"))
        elif stage is Stage.DONE and not backward:
            self._release_forward(b, site)
        elif stage is Stage.AFTER and backward:
            self._reduce(b, site)

    def _issue(self, b: BlockBuilder, site: Site, backward: bool) -> None:
        """Access the layer's chunks not yet gathered in this pass, and up to ``max_prefetch``
        chunks beyond them."""
        seq = self.order(backward)
        need = self.needed(site.layer)
        if not need:
            return
        upto = max(seq.index(k) for k in need) + self.max_prefetch
        for k in seq[:upto + 1]:
            if ("gemini", backward, k) not in b.marks:
                b.marks[("gemini", backward, k)] = self._access(b, k, site, backward)

    def _access(self, b: BlockBuilder, k: int, site: Site, backward: bool) -> int:
        """Gather chunk ``k`` (kept from forward when it is held or backward starts with it)."""
        ch = self.chunks[k]
        if backward and (ch.held or ch.last_layer == self.n_layers - 1) and ("gemini", False, k) in b.marks:
            return b.marks[("gemini", False, k)]
        phase = Phase.BACKWARD if backward else Phase.FORWARD
        t = tag(Activity.PARAM_FETCH, self.id, phase, ch.first_layer, group=k)
        freed = b.marks.get(("gemini freed", k))  # forward's release, when it waits for a write-back
        last = b.add(Alloc(Tier.GPU, ch.gathered_bytes, chunk_ref(k, ch)), t, COMPUTE,
                     after=[] if freed is None else [freed],
                     reads=(chunk_released(k, ch),) if ch.moves else ()) if ch.gathered_bytes else None
        after = [] if last is None else [last]
        refresh = not backward and site.first_mb and ch.refresh is not None
        up = ch.refresh if refresh else ch.fetch
        if up is not None:
            last = b.add(up, t, "chunk_h2d", after=after, reads=(MASTERS,) if refresh else ())
            after = [last]
        if ch.gather is not None:
            last = b.add(ch.gather, tag(Activity.PARAM_GATHER, self.id, phase, ch.first_layer, group=k),
                         "chunk_gather", after=after)
        return last if last is not None else b.add(Join(), t, COMPUTE)

    def _release_forward(self, b: BlockBuilder, site: Site) -> None:
        """Chunks whose last forward layer this is (not the last layer's: backward starts with
        them) are scattered; a refreshed shard that lives on the CPU is written back first."""
        layer = site.layer
        for k in self.needed(layer):
            ch = self.chunks[k]
            if not (ch.last_layer == layer < self.n_layers - 1 and ch.gathered_bytes) or ch.held:
                continue
            t = tag(Activity.PARAM_FETCH, self.id, Phase.FORWARD, layer, group=k)
            if ch.write_back is not None and site.first_mb:
                done = b.add(ch.write_back, t, "chunk_d2h", after=[b.last_on(COMPUTE) or 0])
                b.marks[("gemini freed", k)] = b.add(Free(Tier.GPU, chunk_ref(k, ch)), t, after=[done])
            else:
                b.add(Free(Tier.GPU, chunk_ref(k, ch)), t, COMPUTE)

    def _reduce(self, b: BlockBuilder, site: Site) -> None:
        """Chunks whose gradients are complete at this layer: reduce, offload, release; then the
        layer's gradients are home."""
        u, ends = site.layer, []
        for k, ch in enumerate(self.chunks):
            if ch.first_layer != u:
                continue
            t = tag(Activity.GRAD_REDUCE, self.id, Phase.BACKWARD, u, group=k)
            last = b.add(Acquire(REDUCE_SLOTS, 1), tag(Activity.GRAD_OFFLOAD, self.id, Phase.BACKWARD, u, group=k,
                                                       label="waits for a chunk reduction to finish"),
                         COMPUTE, reads=(grad16(u),), stall=Wait("a free gradient buffer"))
            if ch.reduce is not None:
                last = b.add(ch.reduce, t, "chunk_reduce", after=[last])
            if ch.offload is not None:
                last = b.add(ch.offload, tag(Activity.GRAD_OFFLOAD, self.id, Phase.BACKWARD, u, group=k),
                             "chunk_d2h", after=[last])
            if ch.gathered_bytes and ch.moves:
                last = b.add(Free(Tier.GPU, chunk_ref(k, ch)), t, after=[last], writes=(chunk_released(k, ch),))
            ends.append(b.add(Release(REDUCE_SLOTS, 1), t, after=[last]))
        b.add(Join(), tag(Activity.GRAD_OFFLOAD, self.id, Phase.BACKWARD, u), after=ends, reads=(grad16(u),),
              writes=(grad_home(u),))


# ---------------------------------------------------------------- composition
def chunk_io(c: Ctx, ch: Chunk, shard_on_cpu: bool, optim_on_cpu: bool, held: bool) -> ChunkIO:
    """One chunk's flows from its placement; a shard is ``capacity / dp`` elements (the whole
    chunk when it is replicated)."""
    b, dp, pinned = element_bytes(c.cfg), c.sz.dp, c.st.pin_memory
    shard = ch.capacity // ranks(ch, dp)
    full = b.b16 * ch.capacity
    if ch.keep_gathered:
        net = 0
    elif shard_on_cpu:
        net = whole(full)
    else:
        net = whole(full * (dp - 1) / dp)
    refresh = c.paths.dma(True, whole(b.master * shard), pinned) if optim_on_cpu else None
    fetch = c.paths.dma(True, whole(b.b16 * shard), pinned) if shard_on_cpu else None
    gather = None if ch.keep_gathered else c.collective(full, 1.0)
    reduce = c.collective(b.grad * ch.capacity, 2.0 if ch.keep_gathered else 1.0)
    offload = c.paths.dma(False, whole(b.grad * shard), pinned) if optim_on_cpu else None
    write_back = c.paths.dma(False, whole(b.b16 * shard), pinned) if fetch is not None and refresh is not None else None
    return ChunkIO(ch.first_layer, ch.last_layer, net, refresh, fetch, gather, reduce, offload, write_back, held)


def static_items(c: Ctx, chunks: Sequence[Chunk], pl: Placement) -> StaticState:
    """What Gemini allocates at start-up, per rank: 16-bit shards (whole chunks when replicated)
    on the GPU or, offloaded, in host memory; fp32 master chunks and moments where the optimizer
    runs; the gradient shards of CPU-updated chunks in host memory (pinned with ``pin_memory``;
    Adam's moments are ``zeros_like`` tensors, pageable). A chunk's gradient is written into its
    16-bit chunk (``reuse_fp16_chunk``) and moved to the chunk's one CPU shard, so a chunk whose
    16-bit shard already lives on the CPU holds no second one."""
    b, dp = element_bytes(c.cfg), c.sz.dp
    host = c.host
    tot: dict[tuple[Tier, str], float] = {}

    def add(tier: Tier, what: str, nbytes: float) -> None:
        tot[(tier, what)] = tot.get((tier, what), 0.0) + nbytes

    for ch, cpu_shard, cpu_optim in zip(chunks, pl.shard_on_cpu, pl.optim_on_cpu, strict=True):
        n = ranks(ch, dp)
        add(host if cpu_shard else Tier.GPU, "16-bit chunk shards (Gemini)", b.b16 * ch.capacity / n)
        add(host if cpu_optim else Tier.GPU, "fp32 master chunk shards", b.master * ch.capacity / n)
        add(Tier.HOST_PAGEABLE if cpu_optim else Tier.GPU, "Adam moments", b.moments * ch.used / n)
        if cpu_optim and not cpu_shard:  # the gradient lands in the 16-bit chunk's CPU shard
            add(host, "gradient chunk shards (CPU)", b.grad * ch.capacity / n)
    kinds = {"16-bit chunk shards (Gemini)": TensorKind.PARAM16, "gradient chunk shards (CPU)": TensorKind.GRAD_OPT}
    items = [StaticItem(Tier.GPU, whole(c.cfg.hardware.gpu.reserved_bytes), "reserved (CUDA context, allocator)",
                        TensorKind.RESERVED)]
    items += [StaticItem(tier, whole(n), what, kinds.get(what, TensorKind.OPT_STATE))
              for (tier, what), n in tot.items() if whole(n) > 0]
    return StaticState(tuple(items), 0)


#: DRAM bytes per element of Colossal's CPU Adam kernel (``cpu_adam_op.step``, the SIMD kernel
#: derived from DeepSpeed's): reads the fp32 master and two moments and the 16-bit gradient, writes
#: master and moments back (the 16-bit copy is refreshed on the GPU at its next access).
SIMD_ADAM_BYTES = 2 * 12 + 2
#: DRAM bytes per element of ``CPUAdam.torch_adam_update``, which HybridAdam runs when the
#: gradient is bf16 ("cpu adam kernel does not support bf16 now", hybrid_adam.py): one ATen pass per
#: op, weight_decay 0 (HybridAdam's default): grad.to(fp32) 2 + 4; exp_avg mul_ 4 + 4, add_ 8 + 4;
#: exp_avg_sq mul_ 4 + 4, addcmul_ 8 + 4; sqrt 4 + 4; / 4 + 4; add_(eps) 4 + 4; addcdiv_ 12 + 4.
TORCH_ADAM_BYTES = 6 + 8 + 12 + 8 + 12 + 8 + 8 + 8 + 16
#: those passes, priced as every system's torch CPU code is (:func:`offsim.plan.torch_cpu.torch_pass_flow`)
TORCH_ADAM = (TorchPass("HybridAdam torch ops (bf16 gradients)", TORCH_ADAM_BYTES),)


def cpu_adam_flow(c: Ctx, params: float) -> Flow:
    """HybridAdam's CPU update of ``params`` elements: Colossal's SIMD CPU Adam for fp16 gradients
    (the shared CPU Adam path, :data:`SIMD_ADAM_BYTES` of DRAM each), or its torch-op fallback for
    bf16 gradients (:data:`TORCH_ADAM`, priced as every system's torch CPU code is)."""
    if c.cfg.workload.precision.grads == "bf16":
        return torch_pass_flow(c.cfg.hardware, c.sz.ranks_per_node, None, params, TORCH_ADAM)
    return c.paths.cpu_optimizer(whole(params * SIMD_ADAM_BYTES), SIMD_ADAM_BYTES)


STEP_CPU = "hybrid_adam"  # the step's host thread


@dataclass(frozen=True)
class HybridAdamStep:
    """``HybridAdam.step`` after backward (``hybrid_adam.py``): per parameter group the host loops
    over the CPU-resident parameters (CPU Adam, ``cpu``: its flow, bound by the CPU and the rank's
    DRAM share), then launches one fused multi-tensor GPU Adam over the CUDA-resident ones
    (``gpu_s``: HBM-bound seconds); the next forward waits for both."""

    cpu: Flow | None
    gpu_s: float
    n_layers: int
    id: MechanismId = MechanismId.CPU_OPTIMIZER

    def setup(self) -> Setup:
        return Setup(streams=(StreamSpec(STEP_CPU, StreamKind.CPU),))

    def footprint(self) -> tuple[Need, ...]:
        return ()  # its state is the chunks' (static state)

    def emit(self, b: BlockBuilder, site: Site, stage: Stage) -> None:
        if site.what is not SiteKind.STEP or stage is not Stage.RUN:
            return
        t = lambda label: tag(Activity.OPTIMIZER, self.id, Phase.OPTIMIZER, label=label)  # noqa: E731
        last = b.add(Join(), t("gradients home"), STEP_CPU, reads=tuple(grad_home(u) for u in range(self.n_layers)))
        if self.cpu is not None:
            last = b.add(self.cpu, t("CPU Adam (CPU-resident chunks)"), STEP_CPU, after=[last], writes=(MASTERS,))
        if self.gpu_s > 0:
            b.add(Delay(self.gpu_s), tag(Activity.OPTIMIZER, MechanismId.GPU_OPTIMIZER, Phase.OPTIMIZER,
                                         label="GPU Adam (CUDA-resident chunks)"), COMPUTE, after=[last])
        else:
            b.add(Join(), t("waits for the step"), COMPUTE, after=[last])


def hybrid_adam(c: Ctx, chunks: Sequence[Chunk], pl: Placement) -> HybridAdamStep:
    """HybridAdam's two halves from the placement: CPU Adam over the CPU-resident chunks'
    parameters (:func:`cpu_adam_flow`), fused GPU Adam over the others (reads and
    writes master and moments, reads the gradient, writes the 16-bit copy)."""
    b, dp = element_bytes(c.cfg), c.sz.dp
    cpu = sum(ch.used / ranks(ch, dp) for ch, o in zip(chunks, pl.optim_on_cpu, strict=True) if o)
    gpu = sum(ch.used / ranks(ch, dp) for ch, o in zip(chunks, pl.optim_on_cpu, strict=True) if not o)
    hbm_bpp = 2 * (b.master + b.moments) + b.grad + b.b16
    flow = cpu_adam_flow(c, cpu) if cpu > 0 else None
    return HybridAdamStep(flow, gpu * hbm_bpp / c.cfg.hardware.gpu.hbm_bytes_per_s, len(c.layers))


FORWARD = (("params", Stage.ISSUE), ("params", Stage.WAIT), ("activations", Stage.BEFORE),
           ("compute", Stage.RUN), ("activations", Stage.AFTER), ("params", Stage.DONE))
BACKWARD = (("params", Stage.ISSUE), ("activations", Stage.ISSUE), ("activations", Stage.WAIT),
            ("params", Stage.WAIT), ("activations", Stage.BEFORE), ("compute", Stage.RUN),
            ("activations", Stage.AFTER), ("params", Stage.AFTER))


def placement(c: Ctx, chunks: Sequence[Chunk], opt: Options) -> Placement:
    """The placement policy's decisions."""
    if PlacementPolicy(opt.placement_policy) is PlacementPolicy.AUTO:
        return auto_placement(c, chunks, opt)
    return static_placement(chunks, opt)


def compose(cfg: RunConfig, sz: StateSizes | None = None) -> System:
    """Compute and activations as every system has them; Gemini's chunks, start-up state and
    HybridAdam from its options."""
    from offsim.systems._options import read_options

    opt = read_options(cfg.strategy, Options)
    c = build_ctx(cfg, sz)
    chunks = model_chunks(cfg, c.sz, opt)
    pl = placement(c, chunks, opt)
    ios = tuple(chunk_io(c, ch, *flags) for ch, *flags in zip(chunks, pl.shard_on_cpu, pl.optim_on_cpu, pl.held,
                                                              strict=True))
    mechs = {"static": static_items(c, chunks, pl), "compute": compute(c), "activations": activations(c),
             "params": GeminiChunks(ios, len(c.layers), opt.max_prefetch), "optimizer": hybrid_adam(c, chunks, pl)}
    sites = {SiteKind.INIT: (("static", Stage.RUN),), SiteKind.FORWARD: FORWARD, SiteKind.BACKWARD: BACKWARD,
             SiteKind.STEP: (("optimizer", Stage.RUN),)}
    return System(mechs, sites, len(c.layers), cfg.workload.training.grad_accumulation,  # type: ignore[arg-type]
                  cfg.iterations, 1, (), tuple(lay.name for lay in c.layers))
