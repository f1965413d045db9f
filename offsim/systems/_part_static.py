"""Builder of the static state (what is allocated once at start-up) from a strategy's shared knobs.
"""

from __future__ import annotations

from offsim.core.enums import TensorKind, Tier, home_tier
from offsim.mechanisms.static_state import StaticItem, StaticState
from offsim.plan import footprint as fp
from offsim.systems._ctx import Ctx, whole
from offsim.systems._part_optimizer import subgroups


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
    items.append(StaticItem(home_tier(pl.optimizer_states, pinned),
                            whole(_pinned_groups(c, o * (1.0 - on_pfs), pl.optimizer_states)), "optimizer state",
                            TensorKind.OPT_STATE))
    items.append(StaticItem(Tier.PFS, whole(o * on_pfs), "optimizer state striped to the PFS", TensorKind.OPT_STATE))
    if fp.deepspeed_zero3_offload(cfg):
        items += [StaticItem(Tier(s.tier), whole(s.nbytes), s.what) for s in fp.deepspeed_host_init(cfg, sz)]
    elif st.needs_staging_buffers():
        nbytes = st.pinned_buffer_count * fp.round_pinned(st.pinned_buffer_bytes, st.host_allocator)
        items.append(StaticItem(Tier.HOST_PINNED, whole(nbytes), "pinned staging buffers"))
    return StaticState(tuple(i for i in items if i.nbytes != 0), whole(st.pinned_buffer_count * st.pinned_buffer_bytes))


def _pinned_groups(c: Ctx, nbytes: float, home: str) -> float:
    st = c.st
    if home != "cpu" or not st.pin_memory or st.host_allocator != "caching":
        return nbytes
    n = len(subgroups(c))
    return n * fp.round_pinned(nbytes / n, "caching")
