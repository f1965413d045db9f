"""Parameter and activation fetching for streamed layers: prefetch window, release, reuse.

The op sequence of one iteration is known in advance (forward layers 0..N-1, backward N-1..0,
for each micro-batch). Before op ``i`` runs, the fetcher makes sure the data of ops
``i .. i + prefetch_depth`` are on their way (DeepSpeed's prefetcher, which records the operator
sequence of the first iteration and fetches ahead of it). After op ``i`` a layer's gathered
parameters are released unless their next use is within ``reuse_distance_params`` parameters
(DeepSpeed ``stage3_max_reuse_distance``).
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass

import simpy


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
    """Keeps streamed layers' parameters on the GPU around their uses.

    Args:
        fetch: starts fetching a layer's parameters; returns a SimPy process.
        release: frees a layer's gathered parameters on the GPU.
        layer_params: parameters per layer (for the reuse distance).
    """

    def __init__(self, env: simpy.Environment, ops: list[Op], depth: int, reuse_distance_params: float,
                 layer_params: list[int], fetch: Callable[[int], simpy.Process],
                 release: Callable[[int], None]) -> None:
        self.env = env
        self.ops = ops
        self.depth = depth
        self.reuse = reuse_distance_params
        self.layer_params = layer_params
        self.fetch = fetch
        self.release_fn = release
        self.present: dict[int, simpy.Process] = {}  # layer -> fetch process (done or in flight)

    def advance(self, op_index: int) -> None:
        """Issue fetches for ops ``op_index .. op_index + depth`` not yet present."""
        last = min(len(self.ops), op_index + self.depth + 1)
        for j in range(op_index, last):
            layer = self.ops[j].layer
            if layer not in self.present:
                self.present[layer] = self.fetch(layer)

    def ready(self, op_index: int) -> simpy.Event:
        """Event that fires when the op's parameters are on the GPU."""
        layer = self.ops[op_index].layer
        if layer not in self.present:
            self.present[layer] = self.fetch(layer)
        return self.present[layer]

    def reuse_distance(self, op_index: int) -> float:
        """Parameters used between op ``op_index`` and the next use of its layer (inf if none)."""
        layer = self.ops[op_index].layer
        seen: set[int] = set()
        for op in self.ops[op_index + 1:]:
            if op.layer == layer:
                return float(sum(self.layer_params[x] for x in seen))
            seen.add(op.layer)
        return float("inf")

    def after(self, op_index: int) -> None:
        """Release the op's layer unless it is reused soon or already needed by the window."""
        layer = self.ops[op_index].layer
        last = min(len(self.ops), op_index + self.depth + 1)
        needed_soon = any(self.ops[j].layer == layer for j in range(op_index + 1, last))
        if needed_soon or self.reuse_distance(op_index) <= self.reuse:
            return
        self.release_fn(layer)
        del self.present[layer]

    def release_all(self) -> Generator:
        """At the end of an iteration, wait for stray fetches and release everything."""
        for layer, proc in list(self.present.items()):
            yield proc
            self.release_fn(layer)
        self.present.clear()
