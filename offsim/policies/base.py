"""The policy interface: read-only views in, decisions out (house style §3.4).

The engine asks; a policy answers with data. A policy never yields SimPy events and never
changes a tier: it receives a frozen snapshot (:class:`MemoryView`, :class:`PrefetchView`, or the
layer list) and returns decision records (:class:`Evict`, :class:`Fetch`,
:class:`ActivationDecision`, an order of sub-groups). The engine checks every decision and raises
:class:`~offsim.errors.PolicyError`, naming the policy and the op, when one is illegal.

Tensors are small integers whose meaning depends on the cache: a layer index for the GPU
parameter buffer, an optimizer sub-group index for the DRAM cache over NVMe-resident optimizer
state. Positions count accesses in the known order of use (one iteration's ops for the GPU
buffer: forward layers 0..N-1 then backward N-1..0 per micro-batch; every iteration's sub-group
traversal for the DRAM cache).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol

if TYPE_CHECKING:
    from offsim.plan.model import Layer

ActTier = Literal["gpu", "cpu", "nvme"]


# ---------------------------------------------------------------- decision records
@dataclass(frozen=True)
class Evict:
    """Drop ``tensor`` from the cache (the engine writes it back first when it is dirty)."""

    tensor: int


@dataclass(frozen=True)
class Fetch:
    """Start bringing in the tensor of access ``position`` now (ahead of its use)."""

    position: int


@dataclass(frozen=True)
class ActivationDecision:
    """What one layer's forward leaves for its backward.

    Attributes:
        layer: layer index.
        recompute: keep only the block input and recompute the rest in backward (checkpointing;
            transformer blocks only).
        tier: where what is kept waits for the backward: HBM, host DRAM or NVMe.
    """

    layer: int
    recompute: bool
    tier: ActTier


# ---------------------------------------------------------------- views
@dataclass(frozen=True)
class Entry:
    """One resident tensor, as a policy sees it.

    Attributes:
        size_bytes: bytes it occupies.
        inserted_at: position of the access that brought it in.
        last_use: position of its latest access.
        uses: accesses since it was brought in (the one that brought it in included).
        next_use: position of its next access, or None when it is not used again within the
            known future.
    """

    size_bytes: float
    inserted_at: int
    last_use: int
    uses: int
    next_use: int | None


@dataclass(frozen=True)
class MemoryView:
    """Read-only snapshot of one cache at one decision.

    Attributes:
        cache: the cache's name (``gpu_params``, ``dram_optimizer``).
        position: the access being served (victims) or just finished (releases).
        capacity_bytes: the cache's budget (``inf`` when unbounded).
        used_bytes: bytes resident now.
        entries: resident tensors and their history.
        pinned: tensors that may not be evicted (needed by an issued, unfinished access).
        sequence: the tensor of every access position (the known future and past).
        sizes: bytes of every tensor.
    """

    cache: str
    position: int
    capacity_bytes: float
    used_bytes: float
    entries: Mapping[int, Entry]
    pinned: frozenset[int]
    sequence: Sequence[int]
    sizes: Mapping[int, float]

    @property
    def free_bytes(self) -> float:
        """Capacity not in use."""
        return self.capacity_bytes - self.used_bytes

    def candidates(self) -> list[int]:
        """Resident tensors that may be evicted, in ascending id order."""
        return sorted(t for t in self.entries if t not in self.pinned)


@dataclass(frozen=True)
class PrefetchView:
    """Read-only snapshot for a prefetch decision, taken before the op at ``position`` runs.

    Attributes:
        position: the op about to run.
        issued: accesses ``[0, issued)`` have been issued (fetched, or found resident).
        sequence: the tensor of every op of the iteration.
        sizes: bytes of every tensor.
        resident: tensors resident or on their way.
        pinned_bytes: bytes held for issued accesses that have not run yet (the current one
            included).
        capacity_bytes: the parameter budget on the GPU (``inf`` when unbounded).
        gpu_free_bytes: GPU memory not allocated right now, bytes.
        bytes_per_param: bytes of one parameter as fetched (to read budgets given in params).
    """

    position: int
    issued: int
    sequence: Sequence[int]
    sizes: Mapping[int, float]
    resident: frozenset[int]
    pinned_bytes: float
    capacity_bytes: float
    gpu_free_bytes: float
    bytes_per_param: float


@dataclass(frozen=True)
class BuildContext:
    """What a policy config may read when it is built (strategy-level defaults).

    Attributes:
        n_tensors: tensors the cache manages (layers, or optimizer sub-groups).
        bytes_per_param: bytes of one parameter in this cache's tensors.
        prefetch_depth: the strategy's ``prefetch_depth``.
        reuse_distance_params: the strategy's ``reuse_distance_params``.
        checkpointing: the run's activation checkpointing setting.
        activations_tier: the strategy's ``placement.activations``.
        has_nvme: the hardware profile has NVMe.
    """

    n_tensors: int = 0
    bytes_per_param: float = 2.0
    prefetch_depth: int = 1
    reuse_distance_params: float = 0.0
    checkpointing: bool = False
    activations_tier: ActTier = "gpu"
    has_nvme: bool = True


# ---------------------------------------------------------------- protocols
class EvictionPolicy(Protocol):
    """Chooses victims when a cache lacks room, and what to drop right after a use."""

    name: str

    def victims(self, view: MemoryView, need_bytes: float) -> Sequence[Evict]:
        """Tensors to evict so that at least ``need_bytes`` more bytes are free."""
        ...

    def releases(self, view: MemoryView) -> Sequence[Evict]:
        """Tensors to drop now that the access at ``view.position`` has finished."""
        ...


class PrefetchPolicy(Protocol):
    """Chooses which upcoming accesses to start fetching before the op at ``view.position``."""

    name: str

    def fetches(self, view: PrefetchView) -> Sequence[Fetch]:
        """Accesses to issue now, in order, starting at ``view.issued``."""
        ...


class ActivationPolicy(Protocol):
    """Decides, per layer, whether activations are kept, recomputed or offloaded."""

    name: str

    def plan(self, layers: Sequence[Layer]) -> Sequence[ActivationDecision]:
        """One decision per layer, in layer order."""
        ...


class OrderPolicy(Protocol):
    """Order in which the CPU optimizer visits its sub-groups in one iteration."""

    name: str

    def order(self, iteration: int, n_groups: int) -> Sequence[int]:
        """A permutation of ``range(n_groups)``."""
        ...


class KeepsUntilEvicted:
    """Mixin for caching policies: nothing is dropped right after a use."""

    def releases(self, view: MemoryView) -> Sequence[Evict]:
        """Nothing: a tensor stays until it is evicted for room."""
        return ()


def evict_in_order(view: MemoryView, need_bytes: float, ranked: Sequence[int]) -> list[Evict]:
    """Evict ``ranked`` candidates front to back until ``need_bytes`` are freed.

    The common tail of every ranking policy (LRU, FIFO, MRU, LFU, Belady): they differ only in
    how they rank the candidates.
    """
    out: list[Evict] = []
    freed = 0.0
    for t in ranked:
        if freed >= need_bytes:
            break
        out.append(Evict(t))
        freed += view.entries[t].size_bytes
    return out
