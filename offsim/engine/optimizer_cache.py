"""A DRAM cache over NVMe-resident optimizer state, one entry per optimizer sub-group.

Without it (DeepSpeed's behaviour) every step reads each sub-group's fp32 master parameters and
moments from NVMe and writes them back. With it, a sub-group stays in DRAM after its update
(dirty) and is written back only when the eviction policy drops it; a step that finds it there
skips both transfers. Which sub-groups survive depends on the eviction policy and on the order
the optimizer visits them (MLP-Offload alternates the direction between iterations so that the
groups updated last are needed first; Maurya et al., SC 2025, arXiv 2509.02480).

Gradients kept on NVMe are still read every step (they are new each step).
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

from offsim.engine.cache import Cache
from offsim.engine.ledger import MemoryLedger
from offsim.engine.policy_hooks import DRAM_OPTIMIZER, PolicyHooks
from offsim.engine.transfers import Transfers
from offsim.plan.footprint import round_pinned
from offsim.plan.policy_plan import build_context


class OptimizerCache:
    """Reads and writes of sub-groups through the DRAM cache (a write-back cache).

    Args:
        hooks: the run's policies (order, eviction, event log).
        io: the transfers.
        ledger: the memory ledger (cached sub-groups occupy host memory).
        groups: parameters of each sub-group.
    """

    def __init__(self, hooks: PolicyHooks, io: Transfers, ledger: MemoryLedger, groups: list[float]) -> None:
        cfg, sz = hooks.cfg, hooks.sz
        st = cfg.strategy
        self.hooks, self.io, self.ledger = hooks, io, ledger
        n = len(groups)
        self.state_bytes = {g: p * sz.optimizer_bytes_per_param for g, p in enumerate(groups)}
        policy = st.policies.dram_eviction.build(build_context(cfg, n, sz.optimizer_bytes_per_param))
        orders = [hooks.group_order(it, n) for it in range(cfg.iterations)]
        self.position = {(it, g): it * n + k for it, order in enumerate(orders) for k, g in enumerate(order)}
        sequence = [g for order in orders for g in order]
        self.cache = Cache(DRAM_OPTIMIZER, policy, sequence, self.state_bytes, hooks.dram_bytes,
                           lambda p: f"sub-group {sequence[p]} of iteration {p // n}")
        self.tier = "host_pinned" if st.pin_memory else "host_pageable"
        self.grad_bytes_per_param = sz.host_grad_bytes_per_param if st.placement.grads == "nvme" else 0.0
        self.allocator = st.host_allocator

    @staticmethod
    def _meta(iteration: int, kind: str, name: str) -> dict[str, Any]:
        return {"iteration": iteration, "phase": "optimizer", "kind": kind, "name": name, "layer": -1}

    def read(self, iteration: int, g: int, params: float) -> Generator:
        """Bring sub-group ``g``'s state (unless cached) and its gradients into DRAM."""
        served = self.cache.serve(self.position[(iteration, g)])
        assert served is not None  # a due access is always served
        size = self.state_bytes[g]
        self.hooks.log(iteration, DRAM_OPTIMIZER, "hit" if served.hit else "miss", g, size)
        for v in served.victims:
            yield from self._write_back(iteration, v, "evict")
        if not served.hit:
            self.ledger.alloc(self.tier, size, f"sub-group {g} in the DRAM cache")
            self.hooks.note_peak(DRAM_OPTIMIZER, self.cache.used_bytes)
            meta = self._meta(iteration, "optimizer_swap_in", f"sub-group {g} state in")
            yield from self.io.nvme_read(size, **meta)
        grads = params * self.grad_bytes_per_param
        if grads > 0:
            pinned = round_pinned(grads, self.allocator)
            self.ledger.alloc("host_pinned", pinned, f"sub-group {g} gradient buffer")
            meta = self._meta(iteration, "optimizer_swap_in", f"sub-group {g} grads in")
            yield from self.io.nvme_read(grads, **meta)

    def write(self, iteration: int, g: int, params: float) -> Generator:
        """After the update: the state stays in DRAM (dirty); free the gradient buffer, and write
        back what the policy releases."""
        grads = params * self.grad_bytes_per_param
        if grads > 0:
            self.ledger.free("host_pinned", round_pinned(grads, self.allocator))
        position = self.position[(iteration, g)]
        self.cache.done(position)
        for t in self.cache.releases(position):
            yield from self._write_back(iteration, t, "release")

    def _write_back(self, iteration: int, g: int, why: str) -> Generator:
        size = self.state_bytes[g]
        self.hooks.log(iteration, DRAM_OPTIMIZER, why, g, size)
        self.hooks.log(iteration, DRAM_OPTIMIZER, "writeback", g, size)
        meta = self._meta(iteration, "optimizer_swap_out", f"sub-group {g} state out ({why})")
        yield from self.io.nvme_write(size, **meta)
        self.ledger.free(self.tier, size)
