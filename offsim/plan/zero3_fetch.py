"""DeepSpeed ZeRO-3's gathered-parameter window, sized by submodules (issue 23).

ZeRO-3 gathers parameters per *submodule*, not per transformer layer: every Linear, norm and
embedding is its own module with a pre-forward hook that gathers it and a post hook that
releases it (``deepspeed/runtime/zero/parameter_offload.py`` ``_register_deepspeed_module``;
``partitioned_param_coordinator.py`` ``fetch_sub_module`` / ``release_sub_module``;
deepspeed_runtime.md section 1). While one module computes, the GPU holds:

* the current module, always whole, whatever its size (``max_live_parameters`` does not split
  or delay it). A gather costs its size once when it holds one parameter and twice while in
  flight when it holds several and the partition group has more than one rank
  (``partition_parameters.py`` ``all_gather_coalesced``, read at v0.6.0, v0.13.3 and edaa722126:
  ``len(params) == 1`` all-gathers straight into one buffer of the parameter's size,
  "an opportunity to avoid some intermediate memory allocations"; several go through
  ``_all_gather_dtype``, a flat buffer of every rank's partitions, and
  ``AllGatherCoalescedHandle.wait`` rebuilds each parameter with ``torch.cat``, a second
  full-size copy). Up to v0.5.x every parameter was gathered alone (``_allgather_param``, views
  of one flat tensor), once. A submodule's unit is one weight matrix, so its own gather is
  counted once (the block's remainder of norms and biases is one unit too, and small);
* what the prefetcher gathered ahead (``fetch_sub_module``, read at DeepSpeed edaa722126): issued
  after the current module's wait, with the budget
  ``min(stage3_max_live_parameters - n_available, stage3_prefetch_bucket_size)`` elements
  (``n_available`` counts the current module), the test before each add so the last parameter
  overshoots by at most one unit; nothing when the current module alone reaches the live cap;
  the prefetched bucket is one gather (``__all_gather_params`` of all its parameters), twice
  while in flight when it holds several parameters, once when one; the loop stops at the
  first parameter still on NVMe (the NVMe prefetch reads it into host buffers instead), which
  this rule does not model: for NVMe-homed parameters it counts the bucket as if gathered (an
  upper bound);
* parameters retained because they are used again within ``stage3_max_reuse_distance``
  elements; at the forward-to-backward turn the k-th layer from the end is kept from its forward
  to its next use when the modules visited in between, ``(2k - 1) P_L - U + 2 P_H`` elements (the
  later layers' forward and recompute/backward, the rest of its own layer, the head's forward
  and backward), stay under the distance (deepspeed_runtime.md section 1, "Retention at the
  forward-to-backward turn", with its own layer's modules counted).

Memory-centric tiling (``deepspeed.zero.TiledLinear``, ``runtime/zero/tiling.py``; ZeRO-Infinity,
arXiv 2104.07857, Sec. 5.1.3) splits a Linear into ``in_splits x out_splits`` submodules fetched
one by one: ``strategy.zero3_tiles_per_linear`` tiles per transformer-block weight matrix. It is
opt-in (the model code builds it), so the default is 1.

Granularity: the timeline stays per layer, the memory follows this rule
(:func:`offsim.systems._part_fetch.by_submodules`). A layer's fetch still moves the whole layer
before its compute and is prefetched and released as before: DeepSpeed's module-ahead prefetch
overlaps the next modules' gathers with the current compute as the layer-ahead prefetch does,
and with no prefetch the per-module fetch-compute chain sums to the same time as fetching the
layer then computing it. Each layer holds its peak of gathered submodules
(:func:`trace_peaks`) from its issue to its done, the cache unit nothing in between; the window
(:func:`window_params`, the footprint's) is the largest peak plus the turn's retention, which the
engine's GPU level does not hold. It replaces the whole-layer window only where it is smaller.
Persistent small parameters (``stage3_param_persistence_threshold``) are not counted (offsim
partitions every parameter, ``offsim/config/ds_config.py``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from offsim.config.workload import ModelShape
from offsim.plan.footprint import _mlp_tensors, layer_tensors
from offsim.plan.model import Layer

#: ``stage3_prefetch_bucket_size`` as DeepSpeed's code defaults it (elements;
#: ``runtime/zero/config.py`` ``DeepSpeedZeroConfig.prefetch_bucket_size`` 5e7; the docs say 5e8,
#: deepspeed_runtime.md section 0); a strategy sets it (``zero3_prefetch_bucket_params``)
PREFETCH_BUCKET_PARAMS = 5e7
#: ``stage3_max_live_parameters`` default (elements; ``runtime/zero/config.py``
#: ``DeepSpeedZeroConfig.max_live_parameters`` 1e9); a strategy sets it (``zero3_max_live_params``)
MAX_LIVE_PARAMS = 1e9


@dataclass(frozen=True)
class Zero3FetchRule:
    """The knobs of DeepSpeed's gather window, in elements.

    Attributes:
        tiles_per_linear: tiles per transformer-block weight matrix (1: no tiling).
        gather_copies: copies of a gather of several parameters while it is in flight (2 with a
            partition group of more than one rank, else 1); a gather of one parameter costs 1.
        prefetch_bucket_params: ``stage3_prefetch_bucket_size`` (0: no prefetch).
        max_live_params: ``stage3_max_live_parameters``.
        reuse_distance_params: ``stage3_max_reuse_distance``.
    """

    tiles_per_linear: int = 1
    gather_copies: int = 2
    prefetch_bucket_params: float = PREFETCH_BUCKET_PARAMS
    max_live_params: float = MAX_LIVE_PARAMS
    reuse_distance_params: float = 1e9


def fetch_units(model: ModelShape, layer: Layer, tiles_per_linear: int = 1) -> list[int]:
    """Elements of each submodule ZeRO-3 gathers for ``layer``: every weight matrix of a block
    (:func:`~offsim.plan.footprint.layer_tensors`) cut into ``tiles_per_linear`` tiles of
    ``ceil(n / tiles)`` (the last holds the remainder), the block's norms and biases as one small
    unit; the embedding, the LM head and their norms are not tiled (``TiledLinear`` replaces the
    block Linears the model code builds with it)."""
    tensors = layer_tensors(model, layer)
    if not layer.is_block or tiles_per_linear == 1:
        return tensors
    index = int(layer.name.removeprefix("block"))
    n_mats = len(model.attention_matrices()) + len(_mlp_tensors(model, index))
    out: list[int] = []
    for k, n in enumerate(tensors):
        tile = math.ceil(n / tiles_per_linear) if k < n_mats else n
        out += [tile] * (n // tile) + ([n % tile] if n % tile else [])
    return out


#: one module of the fetch trace: (the layer it runs in, its identity (layer, unit index) of the
#: parameter it gathers, elements); a tied LM head gathers the embedding's, identity (0, 0)
Module = tuple[int, tuple[int, int], int]


def prefetch_params(current: Module, following: Sequence[Module], rule: Zero3FetchRule) -> float:
    """Elements the prefetcher gathers ahead once ``current`` is gathered: the modules of
    ``following`` (the trace after it) in order while their sum is under the budget
    ``min(max_live - current, bucket)``, the test before each add (so the last one overshoots);
    a parameter already gathered (the current one, or one taken) is skipped; 0 when the budget is
    not positive (``fetch_sub_module``'s prefetch step, deepspeed_runtime.md section 1)."""
    return _prefetch(current, following, rule)[0]


def _prefetch(current: Module, following: Sequence[Module], rule: Zero3FetchRule) -> tuple[float, int]:
    """:func:`prefetch_params`'s elements and the number of parameters it takes."""
    budget = min(rule.max_live_params - current[2], rule.prefetch_bucket_params)
    taken, seen = 0.0, {current[1]}
    for _, ident, n in following:
        if taken >= budget:
            break
        if ident not in seen:
            seen.add(ident)
            taken += n
    return taken, len(seen) - 1


def trace_peaks(trace: Sequence[Module], n_layers: int, rule: Zero3FetchRule) -> list[float]:
    """Per layer, the most gathered elements at once while one of its modules is the current
    one in ``trace``: the module (its own gather, one parameter: once) plus its prefetch in
    flight (:func:`prefetch_params`; ``gather_copies`` x when it holds several parameters, once
    when one: ``all_gather_coalesced``'s ``len(params) == 1`` path)."""
    c, peaks = rule.gather_copies, [0.0] * n_layers
    for pos, m in enumerate(trace):
        ahead, count = _prefetch(m, trace[pos + 1:], rule)
        peaks[m[0]] = max(peaks[m[0]], m[2] + (c if count > 1 else 1) * ahead)
    return peaks


def fetch_trace(units: Sequence[Sequence[int]], recompute: Sequence[bool], tied_head: bool = False) -> list[Module]:
    """The modules of one micro-batch in fetch order: forward over the layers, then backward in
    reverse, a checkpointed layer's recompute forward before its backward (the order DeepSpeed's
    trace records, deepspeed_runtime.md section 1); with ``tied_head`` the last layer (the LM
    head) first gathers the embedding's first unit, the tied weight (an external parameter of
    the head module, ``ZeROOrderedDict.__getitem__``)."""
    mods = [[(i, (i, k), u) for k, u in enumerate(us)] for i, us in enumerate(units)]
    if tied_head and len(units) > 1 and units[0]:
        mods[-1] = [(len(units) - 1, (0, 0), units[0][0]), *mods[-1]]
    out = [m for ms in mods for m in ms]
    for i in reversed(range(len(units))):
        out += (mods[i] if recompute[i] else []) + mods[i][::-1]
    return out


def retained_params(block_params: Sequence[int], largest_block_unit: int, head_gathered_params: int,
                    rule: Zero3FetchRule) -> float:
    """Elements of the last layers kept gathered across the forward-to-backward turn: the k-th
    block from the end while ``(2k - 1) P_L - U + 2 P_H < reuse distance`` (``P_L``: its
    parameters, ``U``: its largest unit, the one most likely kept; ``P_H``: what the head
    gathers, the embedding matrix when tied), counted whole (an upper bound)."""
    kept, visited = 0.0, 2.0 * head_gathered_params
    for p in reversed(block_params):
        if visited + p - largest_block_unit >= rule.reuse_distance_params:
            break
        kept += p
        visited += 2.0 * p
    return kept


@dataclass(frozen=True)
class Zero3Window:
    """The submodule rule's answer, in elements: per layer, its peak (the cache unit's held
    size), and the window (the most gathered at once: the largest peak plus what is retained)."""

    layer_peak_params: tuple[float, ...]
    window_params: float


def window_params(model: ModelShape, layers: Sequence[Layer], recompute: Sequence[bool],
                  rule: Zero3FetchRule) -> Zero3Window:
    """Per layer the peak of gathered submodules (:func:`trace_peaks` over :func:`fetch_trace`),
    and the window: the largest peak plus :func:`retained_params`."""
    units = [fetch_units(model, lay, rule.tiles_per_linear) for lay in layers]
    tied = model.tied_embeddings and layers[-1].name == "head"
    peaks = trace_peaks(fetch_trace(units, recompute, tied), len(layers), rule)
    largest = [max(u, default=0) for u in units]
    blocks = [(lay.params, big) for lay, big in zip(layers, largest, strict=True) if lay.is_block]
    head = largest[0] if model.tied_embeddings else largest[-1]  # a tied head gathers the embedding
    retained = retained_params([p for p, _ in blocks], max((b for _, b in blocks), default=0), head, rule)
    return Zero3Window(tuple(peaks), max(peaks, default=0.0) + retained)
