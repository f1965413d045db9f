"""Builder of the static state (what is allocated once at start-up) from a strategy's shared knobs.
"""

from __future__ import annotations

from offsim.config.workload import DTYPE_BYTES
from offsim.core.enums import TensorKind, Tier, home_tier
from offsim.mechanisms.static_state import StaticItem, StaticState
from offsim.plan import footprint as fp
from offsim.systems._ctx import Ctx, whole
from offsim.systems._part_optimizer import subgroups

#: Systems whose host optimizer state DeepSpeed's ZeRO optimizers allocate (DeepSpeed and its forks:
#: ZeRO-Offload, ZeRO-Infinity, Twin-Flow, SuperOffload, ZenFlow, MemAscend, MLP-Offload); the others
#: (Harmony, ProTrain, LSP-Offload, ...) keep one item in the home's tier, and so does Deep Optimizer
#: States when it streams sub-groups to the GPU (:func:`_deepspeed_host_state`)
DEEPSPEED_HOST_STATE = frozenset({"zero-offload", "zero-infinity", "twin-flow", "superoffload", "zenflow",
                                  "memascend", "mlp-offload"})


def _deepspeed_host_state(c: Ctx) -> bool:
    """Whether DeepSpeed's own allocation of host optimizer state applies. Deep Optimizer States'
    fork follows it only with its GPU prefetch off (a fixed split and no GPU share: the artifact's
    vanilla run, whose log grows by 22.24 GiB, the unrounded fp32 master of 5.95e9 parameters, at
    "After creating fp32 partitions"); with the prefetch on, the same log line grows by 104.4 GiB,
    master and moments pinned per 1e7-element sub-group and rounded (DataStates/artifacts
    deep-optimizer-states sample logs, 7B)."""
    st = c.st
    if st.system == "deep-optimizer-states":
        return st.optimizer_split == "fixed" and st.optimizer_gpu_fraction == 0.0
    return st.system in DEEPSPEED_HOST_STATE


def static_state(c: Ctx) -> StaticState:
    """The engine's ``_allocate_static`` as data."""
    cfg, sz, st = c.cfg, c.sz, c.st
    pl, pinned = st.placement, st.pin_memory
    items = [StaticItem(Tier.GPU, whole(cfg.hardware.gpu.reserved_bytes), "reserved (CUDA context, allocator)",
                        TensorKind.RESERVED),
             StaticItem(home_tier(pl.params, pinned), whole(fp.home_param_bytes(cfg, sz)), "params (16-bit)",
                        TensorKind.PARAM16)]
    share = 1.0 - st.optimizer_gpu_fraction
    if pl.grads == "gpu":
        items.append(StaticItem(Tier.GPU, whole(sz.grad_bytes / sz.grad_part), "grads (16-bit)", TensorKind.GRAD_OPT))
    elif fp.layerwise_grad_buffers(cfg) is None:
        g = sz.params_total / sz.grad_part * sz.host_grad_bytes_per_param * share
        items.append(StaticItem(home_tier(pl.grads, pinned), whole(_pinned_groups(c, g, pl.grads)),
                                "grads (optimizer format)", TensorKind.GRAD_OPT))
    o = sz.local_params * sz.optimizer_bytes_per_param * share
    f = st.optimizer_gpu_fraction
    items.append(StaticItem(Tier.GPU, whole(f * sz.local_params * sz.optimizer_bytes_per_param),
                            "optimizer state of the GPU-updated share", TensorKind.OPT_STATE))
    items.append(StaticItem(Tier.GPU, whole(f * sz.params_total / sz.grad_part * sz.host_grad_bytes_per_param),
                            "grads (optimizer format) of the GPU-updated share", TensorKind.GRAD_OPT))
    on_pfs = fp.pfs_share(cfg)
    items += _optimizer_state(c, o * (1.0 - on_pfs))
    items.append(StaticItem(Tier.PFS, whole(o * on_pfs), "optimizer state striped to the PFS", TensorKind.OPT_STATE))
    if fp.deepspeed_zero3_offload(cfg):
        items += [StaticItem(Tier(s.tier), whole(s.nbytes), s.what) for s in fp.deepspeed_host_init(cfg, sz)]
    elif st.needs_staging_buffers():
        nbytes = st.pinned_buffer_count * fp.round_pinned(st.pinned_buffer_bytes, st.host_allocator)
        items.append(StaticItem(Tier.HOST_PINNED, whole(nbytes), "pinned staging buffers"))
    return StaticState(tuple(i for i in items if i.nbytes != 0), whole(st.pinned_buffer_count * st.pinned_buffer_bytes))


def _optimizer_state(c: Ctx, nbytes: float) -> list[StaticItem]:
    """The optimizer state at its home, ``nbytes`` per rank. Updated by CPU Adam in host memory, it
    is two allocations, as DeepSpeed makes them (deepspeed_runtime.md 8): the fp32 master
    partition, pinned iff ``pin_memory`` under ZeRO-1/2 (stage_1_and_2.py ``__init__``,
    ``single_partition_of_fp32_groups``) and pageable under ZeRO-3 (stage3.py
    ``_create_fp32_partitions``: ``.to(cpu).clone().float()``), and the Adam moments, always
    pageable (ops/adam/cpu_adam.py ``step``: ``torch.zeros_like`` on the CPU at the first step),
    so neither the moments nor a ZeRO-3 master are rounded up by the pinned allocator. Elsewhere
    one item in the home's tier."""
    st, pl = c.st, c.st.placement
    home = home_tier(pl.optimizer_states, st.pin_memory)
    if pl.optimizer_states != "cpu" or st.optimizer_device != "cpu" or not _deepspeed_host_state(c):
        return [StaticItem(home, whole(_pinned_groups(c, nbytes, pl.optimizer_states)), "optimizer state",
                           TensorKind.OPT_STATE)]
    pr = c.cfg.workload.precision
    master = nbytes * DTYPE_BYTES[pr.master_params] / c.sz.optimizer_bytes_per_param
    pinned = st.pin_memory and st.zero_stage < 3
    tier = Tier.HOST_PINNED if pinned else Tier.HOST_PAGEABLE
    return [StaticItem(tier, whole(_pinned_groups(c, master, "cpu") if pinned else master),
                       "optimizer state: fp32 master params", TensorKind.OPT_STATE),
            StaticItem(Tier.HOST_PAGEABLE, whole(nbytes - master), "optimizer state: Adam moments (pageable)",
                       TensorKind.OPT_STATE)]


def _pinned_groups(c: Ctx, nbytes: float, home: str) -> float:
    st = c.st
    if home != "cpu" or not st.pin_memory or st.host_allocator != "caching":
        return nbytes
    n = len(subgroups(c))
    return n * fp.round_pinned(nbytes / n, "caching")
