"""The run-time policies of one run, built from ``cfg.strategy.policies`` for the caches and
choices a compiled schedule names, and what the metrics say about each cache.

Two caches exist when the strategy calls for them:

* ``gpu_params``: the GPU buffer of gathered parameters of streamed layers (ZeRO-3), one unit
  per layer, emptied at every iteration end; misses move bytes over the host link (``h2d``,
  after ``nvme_read`` when parameters live on NVMe; ``gpu_link`` for the all-gather);
* ``dram_optimizer``: host DRAM over NVMe-resident optimizer state, one unit per sub-group,
  kept across iterations; misses read over ``nvme_read``, dirty victims go out over
  ``nvme_write`` (with no DRAM cache every sub-group misses and is written back each step).

The policies of run-time choices (Deep Optimizer States' split) come from the system that
names them (:func:`offsim.systems._registry.choice_policies`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from offsim.config.run import RunConfig
from offsim.core.enums import CacheId, ChoiceId
from offsim.engine.hooks import CachePolicy, ChoicePolicy
from offsim.errors import InfeasibleError
from offsim.plan.footprint import StateSizes, params_streamed
from offsim.plan.policy_plan import build_context, dram_cache_bytes
from offsim.schedule.ops import Schedule
from offsim.systems._registry import choice_policies
from offsim.trace import Recorder


@dataclass(frozen=True)
class RunPolicies:
    """What the executor asks at run time: per cache its policies, per choice its policy."""

    caches: dict[CacheId, CachePolicy]
    choices: dict[ChoiceId, ChoicePolicy]


def run_policies(cfg: RunConfig, sz: StateSizes, schedule: Schedule, rec: Recorder) -> RunPolicies:
    """The policies of ``schedule``'s caches and choices; describes each cache in
    ``rec.cache_info``. Raises InfeasibleError when the GPU parameter buffer cannot hold the
    largest layer."""
    pol = cfg.strategy.policies
    bpp_param = sz.param_bytes / sz.params_total
    ctx = build_context(cfg, len(sz.layers), bpp_param)
    caches = {CacheId.GPU_PARAMS: CachePolicy(pol.eviction.build(ctx), pol.prefetch.build(ctx), bpp_param)}
    params = schedule.cache(CacheId.GPU_PARAMS)
    if params_streamed(cfg) and params is not None:
        budget = math.inf if params.capacity_bytes is None else float(params.capacity_bytes)
        _describe_param_buffer(cfg, sz, rec, caches[CacheId.GPU_PARAMS].eviction.name, budget)
    dram = schedule.cache(CacheId.DRAM_OPTIMIZER)
    if dram is not None:
        dram_ctx = build_context(cfg, len(dram.unit_bytes), sz.optimizer_bytes_per_param)
        caches[CacheId.DRAM_OPTIMIZER] = CachePolicy(pol.dram_eviction.build(dram_ctx))
    if _optimizer_on_nvme(cfg):
        nbytes = dram_cache_bytes(cfg, sz)
        _info(rec, CacheId.DRAM_OPTIMIZER, "host", ["nvme_read"], ["nvme_write"], nbytes, True,
              pol.dram_eviction.kind if nbytes > 0 else "none (no DRAM cache)")
    choices = {cid: policy for cid, policy in choice_policies(cfg, sz).items() if schedule.choice(cid) is not None}
    return RunPolicies(caches, choices)


def _optimizer_on_nvme(cfg: RunConfig) -> bool:
    st = cfg.strategy
    return (st.placement.optimizer_states == "nvme" and st.optimizer_device == "cpu"
            and st.optimizer_schedule == "after-backward")


def _describe_param_buffer(cfg: RunConfig, sz: StateSizes, rec: Recorder, policy: str, budget: float) -> None:
    """Check the GPU parameter buffer (``budget`` bytes) holds the largest layer, and describe it."""
    bpp_param = sz.param_bytes / sz.params_total
    biggest = max(lay.params * bpp_param for lay in sz.layers)
    if biggest > budget * (1 + 1e-9):
        raise InfeasibleError("gpu", biggest, budget, "policies.gpu_param_buffer_gib is smaller than the largest "
                              "layer's parameters")
    home = cfg.strategy.placement.params
    links = [] if home == "gpu" else ["nvme_read", "h2d"] if home == "nvme" else ["h2d"]
    if sz.param_part > 1:
        links.append("gpu_link")
    _info(rec, CacheId.GPU_PARAMS, "gpu", links, [], budget, False, policy)


def _info(rec: Recorder, cache: CacheId, tier: str, fetch_links: list[str], writeback_links: list[str],
          capacity_bytes: float, persistent: bool, policy: str) -> None:
    rec.cache_info[str(cache)] = {
        "tier": tier, "fetch_links": fetch_links, "writeback_links": writeback_links,
        "capacity_bytes": capacity_bytes if math.isfinite(capacity_bytes) else None,
        "persistent": persistent, "policy": policy, "peak_bytes": 0.0,
    }
