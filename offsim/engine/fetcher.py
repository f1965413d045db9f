"""Parameter fetching for streamed layers: the GPU parameter buffer as a policy-managed cache.

The op sequence of one iteration is known in advance (forward layers 0..N-1, backward N-1..0,
for each micro-batch). Before op ``i`` runs, the fetcher issues op ``i``'s access (demand) and
asks the prefetch policy which later accesses to issue too, in order; each issued access is a
hit, or a miss that evicts what the eviction policy names and starts a fetch. After op ``i`` the
eviction policy may release tensors (DeepSpeed's release-after-use). The buffer is emptied at
the end of each iteration, since the optimizer step changes every parameter.

Defaults (lookahead by ``prefetch_depth``, the reuse-distance rule, no budget) reproduce
DeepSpeed's prefetcher and ``stage3_max_reuse_distance``.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass
from types import MappingProxyType

import simpy

from offsim.engine.cache import Cache
from offsim.errors import PolicyError
from offsim.policies.base import PrefetchPolicy, PrefetchView


@dataclass(frozen=True)
class Op:
    """One GPU op of the iteration: a layer's forward or backward for one micro-batch."""

    index: int
    layer: int
    phase: str  # "forward" or "backward"
    micro_batch: int


def build_ops(n_layers: int, micro_batches: int) -> list[Op]:
    """Forward 0..N-1 then backward N-1..0, for each micro-batch."""
    ops: list[Op] = []
    for mb in range(micro_batches):
        for layer in range(n_layers):
            ops.append(Op(len(ops), layer, "forward", mb))
        for layer in reversed(range(n_layers)):
            ops.append(Op(len(ops), layer, "backward", mb))
    return ops


class ParamFetcher:
    """Keeps streamed layers' parameters on the GPU around their uses, as the policies decide.

    Args:
        env: the engine's clock.
        ops: the iteration's ops.
        cache: the GPU parameter cache over ``ops`` (its eviction policy decides what goes).
        prefetch: the prefetch policy.
        fetch: starts fetching a layer's parameters; returns a SimPy process.
        release: frees a layer's gathered parameters on the GPU.
        gpu_free_bytes: GPU memory not allocated now.
        bytes_per_param: bytes of one fetched parameter.
        log: records a cache event ``(kind, layer, bytes)``.
    """

    def __init__(self, env: simpy.Environment, ops: list[Op], cache: Cache, prefetch: PrefetchPolicy,
                 fetch: Callable[[int], simpy.Process], release: Callable[[int], None],
                 gpu_free_bytes: Callable[[], float], bytes_per_param: float,
                 log: Callable[[str, int, float], None]) -> None:
        self.env = env
        self.ops = ops
        self.cache = cache
        self.prefetch = prefetch
        self.fetch = fetch
        self.release_fn = release
        self.gpu_free_bytes = gpu_free_bytes
        self.bytes_per_param = bytes_per_param
        self.log = log
        self.sizes = MappingProxyType(cache.sizes)
        self.present: dict[int, simpy.Process] = {}  # layer -> fetch process (done or in flight)
        self.issued = 0

    def _issue(self, position: int, due: bool) -> bool:
        served = self.cache.serve(position, due=due)
        if served is None:
            return False
        for v in served.victims:
            self._drop(v, "evict")
        layer = served.tensor
        self.log("hit" if served.hit else "miss", layer, self.sizes[layer])
        if not served.hit:
            self.present[layer] = self.fetch(layer)
        self.issued = position + 1
        return True

    def _drop(self, layer: int, kind: str) -> None:
        self.release_fn(layer)
        del self.present[layer]
        self.log(kind, layer, self.sizes[layer])

    def _view(self, op_index: int) -> PrefetchView:
        return PrefetchView(op_index, self.issued, self.cache.sequence, self.sizes, frozenset(self.present),
                            self.cache.pinned_bytes(), self.cache.capacity_bytes, self.gpu_free_bytes(),
                            self.bytes_per_param)

    def advance(self, op_index: int) -> None:
        """Issue op ``op_index`` if it is not yet, then the prefetches the policy asks for."""
        if self.issued <= op_index:
            self._issue(op_index, due=True)
        for f in self.prefetch.fetches(self._view(op_index)):
            if f.position != self.issued or f.position >= len(self.ops):
                raise PolicyError(f"prefetch policy '{self.prefetch.name}' before op {op_index}: asks for "
                                  f"op {f.position}, but prefetches go in order and the next is op "
                                  f"{self.issued} (of {len(self.ops)})")
            if not self._issue(f.position, due=False):
                break

    def ready(self, op_index: int) -> simpy.Event:
        """Event that fires when the op's parameters are on the GPU."""
        return self.present[self.ops[op_index].layer]

    def after(self, op_index: int) -> None:
        """The op has run: unpin its layer and drop what the eviction policy releases."""
        self.cache.done(op_index)
        for layer in self.cache.releases(op_index):
            self._drop(layer, "release")

    def release_all(self) -> Generator:
        """At the end of an iteration, wait for stray fetches and release everything."""
        for layer, proc in list(self.present.items()):
            yield proc
            self.release_fn(layer)
        self.present.clear()
        self.cache.flush()
