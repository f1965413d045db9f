"""Builder of the static state (what is allocated once at start-up) from a strategy's shared knobs.
"""

from __future__ import annotations

from offsim.config.run import RunConfig
from offsim.config.workload import DTYPE_BYTES
from offsim.core.enums import TensorKind, Tier, home_tier
from offsim.mechanisms.static_state import StaticItem, StaticState
from offsim.plan import footprint as fp
from offsim.plan.policy_plan import dram_cache_bytes
from offsim.systems._ctx import Ctx, whole
from offsim.systems._part_grads import startup_ipg_buffer_bytes
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
    elif fp.layerwise_grad_buffers(cfg) is None and not _flat_16bit_grads(c):
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
    ipg = startup_ipg_buffer_bytes(c)
    if ipg > 0:  # kept from start-up, v0.6.0+ (offsim.plan.deepspeed_versions.Z3GradFlush.SAME_FLUSH)
        items.append(StaticItem(Tier.GPU, ipg, "IPG bucket buffer (stage3.py, kept from start-up)", TensorKind.BUFFER))
    scores = megatron_attention_buffer_bytes(cfg)
    if scores > 0:
        items.append(StaticItem(Tier.GPU, scores, MEGATRON_ATTENTION_BUFFER, TensorKind.BUFFER))
    if fp.deepspeed_zero3_offload(cfg):
        items += _host_init_items(c)
        items += _flat_16bit_grad_items(c) if _flat_16bit_grads(c) else []
    elif st.needs_staging_buffers():
        nbytes = st.pinned_buffer_count * fp.round_pinned(st.pinned_buffer_bytes, st.host_allocator)
        items.append(StaticItem(Tier.HOST_PINNED, whole(nbytes), "pinned staging buffers"))
    return StaticState(tuple(i for i in items if i.nbytes != 0), whole(st.pinned_buffer_count * st.pinned_buffer_bytes))


#: the item name of Megatron's attention buffer (:func:`megatron_attention_buffer_bytes`)
MEGATRON_ATTENTION_BUFFER = "attention score buffer (Megatron GlobalMemoryBuffer, kept from the first forward)"


def megatron_attention_buffer_bytes(cfg: RunConfig) -> int:
    """Bytes of Megatron's persistent buffer for the unfused attention's score GEMM, per GPU; 0
    without ``workload.training.megatron_attention_buffer`` or with flash attention.

    Megatron-LM / Megatron-DeepSpeed's ``CoreAttention.forward`` (megatron/model/transformer.py)
    takes ``torch.baddbmm``'s input, ``[b * np, sq, sk]`` in the query's format, from
    ``get_global_memory_buffer().get_tensor(..., "mpu")`` (megatron/core/utils.py
    ``GlobalMemoryBuffer``: one tensor per (name, dtype), allocated on first use, grown only when a
    larger one is asked for, never freed), and ``baddbmm`` (beta 0) writes the scores to a new
    tensor, so the buffer is held beside every activation from the first forward on; ``np`` is the
    query heads of one tensor-parallel rank. The query is in the model's format (Megatron's
    ``Float16Module`` casts the model to ``params_dtype``): ``precision.params``.

    dos-7b (micro-batch 1, 32 heads, seq 2048, bf16): 1 x 32 x 2048^2 x 2 = 268,435,456 B; the
    Deep Optimizer States vanilla log's MA before forward rises 12.02 -> 12.28 GiB after the first
    iteration (DataStates/artifacts deep-optimizer-states 7B sample log).

    offsim allocates it with the static state, at start-up rather than in the first forward: the
    GPU holds no start-up transient it could add to (only the host's pin-by-copy sources are), so
    the footprint and every steady iteration's peak are the same."""
    wl = cfg.workload
    t = wl.training
    if not t.megatron_attention_buffer or t.flash_attention:
        return 0
    heads_per_rank = wl.model.heads // t.tensor_parallel
    return whole(t.micro_batch * heads_per_rank * t.seq_len ** 2 * DTYPE_BYTES[wl.precision.params])


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


#: the item name of DeepSpeed's optimizer swap buffers (:func:`offsim.plan.footprint.deepspeed_host_init`)
SWAP_BUFFERS = "optimizer swap buffers (offload_optimizer)"


def _flat_16bit_grads(c: Ctx) -> bool:
    """Whether the host gradients are MLP-Offload's 16-bit accumulator on DeepSpeed ZeRO-3's offload
    path (``delayed_grad_conversion``, the fork's ``dist_opt_grad_skip``): their home is then
    ``grad_partitions_flat_buffer`` itself, one flat tensor (:func:`_flat_16bit_grad_items`)."""
    st = c.st
    return fp.deepspeed_zero3_offload(c.cfg) and st.delayed_grad_conversion and st.placement.grads == "cpu"


def _flat_16bit_grad_items(c: Ctx) -> list[StaticItem]:
    """The 16-bit gradients' home as the DataStates fork makes it (DataStates/DeepSpeed branch
    dist_nvme_opt, stage3.py ``_setup_for_real_optimizer``, the last host allocation of the set-up):
    ``grad_partitions_flat_buffer = torch.zeros(sum of the rank's partition numels, grad dtype)``,
    then ``get_accelerator().pin_memory(...)`` when ``offload_optimizer.pin_memory``: ONE tensor,
    so the caching host allocator rounds it up once (31.95 GiB -> 32 GiB for 70B at dp 4), not per
    sub-group; its written pageable source is resident beside the pinned copy until the name is
    rebound (``strategy.pin_by_copy``). The 70B artifact logs (DataStates/artifacts MLP-Offload/logs,
    both runs) grow by 145.8 GiB over the node's four ranks across this call (223.8 -> 369.6 GiB,
    "After initializing contiguous gradients buffer" to "At end of the setup for real_optimizer")."""
    st, sz = c.st, c.sz
    g = sz.params_total / sz.grad_part * sz.host_grad_bytes_per_param * (1.0 - st.optimizer_gpu_fraction)
    what = "grads (optimizer format)"
    if not st.pin_memory:
        return [StaticItem(Tier.HOST_PAGEABLE, whole(g), what, TensorKind.GRAD_OPT)]
    pinned = StaticItem(Tier.HOST_PINNED, whole(fp.round_pinned(g, st.host_allocator)), what, TensorKind.GRAD_OPT)
    if not st.pin_by_copy:
        return [pinned]
    source = "grad_partitions_flat_buffer: pageable source of pin_memory()"
    return [StaticItem(Tier.HOST_PAGEABLE, whole(g), source), pinned, StaticItem(Tier.HOST_PAGEABLE, -whole(g), source)]


def _host_init_items(c: Ctx) -> list[StaticItem]:
    """DeepSpeed ZeRO-3's host set-up (:func:`offsim.plan.footprint.deepspeed_host_init`) as items;
    on the MLP-Offload fork its optimizer swap buffers are those of :func:`fork_swap_buffer_items`."""
    steps = fp.deepspeed_host_init(c.cfg, c.sz)
    if c.st.system != "mlp-offload" or c.st.placement.optimizer_states != "nvme":
        return [StaticItem(Tier(s.tier), whole(s.nbytes), s.what) for s in steps]
    items: list[StaticItem] = []
    for s in steps:
        if not s.what.startswith(SWAP_BUFFERS):
            items.append(StaticItem(Tier(s.tier), whole(s.nbytes), s.what))
        elif not any(i.what.startswith(SWAP_BUFFERS) for i in items):
            items += fork_swap_buffer_items(c)
    return items


def swap_paths(cfg: RunConfig) -> int:
    """Storage paths of the MLP-Offload fork's optimizer state: ``nvme_path: "NVMe;PFS"`` is split on
    ';' and each path gets its own swapper (DataStates/DeepSpeed dist_nvme_opt, stage3.py
    ``_configure_tensor_swapping``: one ``PipelinedOptimizerSwapper`` per path, at most 2,
    ``_get_opt_swapper_id``); offsim stripes to the PFS iff its share is above 0."""
    return 2 if fp.pfs_share(cfg) > 0 else 1


def cached_subgroups_per_path(buffer_count: int) -> int:
    """Sub-groups each swapper of the MLP-Offload fork keeps cached in its own swap buffers:
    ``dist_opt_buffer_count = buffer_count // 4 - 1`` ("for p, m, v, g": four buffers each, the rest
    for the pipeline; stage3.py ``_configure_tensor_swapping``); a cached sub-group is not flushed,
    its swap-in operation and buffers are kept (``_optimizer_states_and_gradient_swap_out`` ->
    pipelined_optimizer_swapper.py ``swap_in_clear_prev``)."""
    return max(0, buffer_count // 4 - 1)


def fork_swap_buffer_items(c: Ctx) -> list[StaticItem]:
    """The MLP-Offload fork's pinned optimizer swap buffers, per rank: every swapper (one per path,
    :func:`swap_paths`) builds a ``SwapBufferManager`` of ``buffer_count`` buffers of the largest
    sub-group in fp32, each ``pin_memory(torch.zeros(...))`` (swap_tensor/utils.py
    ``SwapBufferManager.__init__``; one pageable source at a time), rounded up to a power of two by
    PyTorch's caching host allocator. The 70B MLP-Offload log prints two SwapBufferManagers of 25
    buffers, largest_numel 211,816,448 (847 MB each), and the node's memory grows by 4 x 50.17 GiB
    across them (17.94 -> 219.68 GiB): 50 buffers of 1 GiB per rank.

    The fork's DRAM cache lives in these buffers (:func:`cached_subgroups_per_path`) and the optimizer
    declares it (``DRAM cache of optimizer state``, :func:`offsim.plan.policy_plan.dram_cache_bytes`),
    so the buffers are counted here less those bytes (at least 0), the total being the buffers'."""
    cfg, st = c.cfg, c.st
    groups = fp.deepspeed_sub_groups(fp.param_partitions(cfg, c.sz), st.sub_group_params)
    one = max(groups) * DTYPE_BYTES[cfg.workload.precision.master_params]
    torch_pinned = st.nvme_swap_buffers == "torch_pinned"  # else locked: the exact size (footprint._swap_buffer)
    each = fp.round_pinned(one, st.host_allocator) if torch_pinned else one
    total = swap_paths(cfg) * st.optimizer_buffer_count * each
    held = total - min(total, dram_cache_bytes(cfg, c.sz))
    items = [StaticItem(Tier.HOST_PINNED, whole(held), f"{SWAP_BUFFERS}, less the DRAM cache they hold")]
    if st.pin_by_copy and torch_pinned:
        source = f"{SWAP_BUFFERS}: pageable source of pin_memory()"
        items = [StaticItem(Tier.HOST_PAGEABLE, whole(one), source), *items,
                 StaticItem(Tier.HOST_PAGEABLE, -whole(one), source)]
    return items
