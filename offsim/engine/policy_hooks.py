"""The engine's one contact with the policies: builds them and the caches they manage, checks
their decisions, and records cache events for the metrics.

Two caches exist when the strategy calls for them:

* ``gpu_params``: the GPU buffer of gathered parameters of streamed layers (ZeRO-3), one
  tensor per layer, emptied at every iteration end; misses move bytes over the host link
  (``h2d``, after ``nvme_read`` when parameters live on NVMe; ``gpu_link`` for the all-gather);
* ``dram_optimizer``: host DRAM over NVMe-resident optimizer state, one tensor per sub-group,
  kept across iterations; misses read over ``nvme_read``, dirty victims go out over
  ``nvme_write``.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import simpy

from offsim.config.run import RunConfig
from offsim.engine.cache import Cache
from offsim.engine.fetcher import Op, ParamFetcher
from offsim.engine.ledger import MemoryLedger
from offsim.errors import InfeasibleError, PolicyError
from offsim.plan.footprint import StateSizes, params_streamed
from offsim.plan.policy_plan import (
    activation_decisions,
    build_context,
    custom_activations,
    dram_cache_bytes,
    param_budget_bytes,
)
from offsim.policies import ActivationDecision
from offsim.trace import CacheEvent, Recorder

GPU_PARAMS = "gpu_params"
DRAM_OPTIMIZER = "dram_optimizer"


class PolicyHooks:
    """Policies of one run, built from ``cfg.strategy.policies``."""

    def __init__(self, cfg: RunConfig, sz: StateSizes, recorder: Recorder) -> None:
        self.cfg, self.sz, self.rec = cfg, sz, recorder
        st = cfg.strategy
        pol = st.policies
        self.bpp_param = sz.param_bytes / sz.params_total
        ctx = build_context(cfg, len(sz.layers), self.bpp_param)
        self.eviction = pol.eviction.build(ctx)
        self.prefetch = pol.prefetch.build(ctx)
        self.order_policy = pol.optimizer_order.build(ctx)
        self.activations: dict[int, ActivationDecision] | None = None
        if custom_activations(cfg):
            self.activations = {d.layer: d for d in activation_decisions(cfg, sz)}
        self.param_sizes = {lay.index: lay.params * self.bpp_param for lay in sz.layers}
        self.param_budget = math.inf
        if params_streamed(cfg):
            self._init_param_cache()
        self.opt_on_nvme = (st.placement.optimizer_states == "nvme" and st.optimizer_device == "cpu"
                            and st.optimizer_schedule == "after-backward")
        self.dram_bytes = dram_cache_bytes(cfg, sz)
        if self.opt_on_nvme:
            self._info(DRAM_OPTIMIZER, "host", ["nvme_read"], ["nvme_write"], self.dram_bytes, True,
                       pol.dram_eviction.kind if self.dram_bytes > 0 else "none (no DRAM cache)")

    # ------------------------------------------------------------ records
    def _info(self, cache: str, tier: str, fetch_links: list[str], writeback_links: list[str],
              capacity_bytes: float, persistent: bool, policy: str) -> None:
        self.rec.cache_info[cache] = {
            "tier": tier, "fetch_links": fetch_links, "writeback_links": writeback_links,
            "capacity_bytes": capacity_bytes if math.isfinite(capacity_bytes) else None,
            "persistent": persistent, "policy": policy, "peak_bytes": 0.0,
        }

    def log(self, iteration: int, cache: str, kind: str, tensor: int, nbytes: float = 0.0,
            seconds: float = 0.0) -> None:
        """Record one cache event."""
        self.rec.cache(CacheEvent(iteration, cache, kind, tensor, nbytes, seconds))

    def note_peak(self, cache: str, used_bytes: float) -> None:
        info = self.rec.cache_info[cache]
        info["peak_bytes"] = max(info["peak_bytes"], used_bytes)

    # ------------------------------------------------------------ GPU parameter buffer
    def _init_param_cache(self) -> None:
        self.param_budget = param_budget_bytes(self.cfg, self.sz)
        biggest = max(self.param_sizes.values())
        if biggest > self.param_budget * (1 + 1e-9):
            raise InfeasibleError("gpu", biggest, self.param_budget, "policies.gpu_param_buffer_gib is "
                                  "smaller than the largest layer's parameters")
        links = ["nvme_read", "h2d"] if self.cfg.strategy.placement.params == "nvme" else ["h2d"]
        if self.cfg.strategy.placement.params == "gpu":
            links = []
        if self.sz.param_part > 1:
            links.append("gpu_link")
        self._info(GPU_PARAMS, "gpu", links, [], self.param_budget, False, self.eviction.name)

    def param_fetcher(self, env: simpy.Environment, ops: list[Op], iteration: int,
                      fetch: Callable[[int], simpy.Process], release: Callable[[int], None],
                      ledger: MemoryLedger) -> ParamFetcher:
        """A fetcher (and its cache) for one iteration's ops."""
        names = {lay.index: lay.name for lay in self.sz.layers}

        def describe(p: int) -> str:
            op = ops[p]
            where = f"micro-batch {op.micro_batch}, iteration {iteration}"
            return f"op {p} ({op.phase} {names[op.layer]}, {where})"

        sequence = [op.layer for op in ops]
        cache = Cache(GPU_PARAMS, self.eviction, sequence, self.param_sizes, self.param_budget, describe)

        def log(kind: str, layer: int, nbytes: float) -> None:
            self.log(iteration, GPU_PARAMS, kind, layer, nbytes)
            self.note_peak(GPU_PARAMS, cache.used_bytes)

        def free() -> float:
            return ledger.capacity["gpu"] - ledger.rank_bytes["gpu"]

        return ParamFetcher(env, ops, cache, self.prefetch, fetch, release, free, self.bpp_param, log)

    # ------------------------------------------------------------ activations
    def activation(self, layer: int) -> ActivationDecision | None:
        """The activation policy's decision for a layer; None under the default policy."""
        return None if self.activations is None else self.activations[layer]

    # ------------------------------------------------------------ optimizer sub-groups
    def group_order(self, iteration: int, n_groups: int) -> list[int]:
        """The order policy's traversal for one iteration, checked to be a permutation."""
        order = list(self.order_policy.order(iteration, n_groups))
        if sorted(order) != list(range(n_groups)):
            raise PolicyError(f"optimizer order policy '{self.order_policy.name}' at iteration {iteration}: "
                              f"{order} is not a permutation of the {n_groups} sub-groups")
        return order

    def uncached_group(self, iteration: int, g: int, params: float) -> None:
        """Record a sub-group read and written back with no DRAM cache (a miss every step)."""
        if self.opt_on_nvme and self.dram_bytes <= 0:
            nbytes = params * self.sz.optimizer_bytes_per_param
            self.log(iteration, DRAM_OPTIMIZER, "miss", g, nbytes)
            self.log(iteration, DRAM_OPTIMIZER, "writeback", g, nbytes)

    def optimizer_stall(self, iteration: int, seconds: float) -> None:
        """Record the CPU optimizer waiting for a sub-group's state."""
        if self.opt_on_nvme and seconds > 0:
            self.log(iteration, DRAM_OPTIMIZER, "stall", -1, 0.0, seconds)
