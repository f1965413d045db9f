"""Host memory at start-up: the model loaded and the optimizer's host buffers built and pinned.

Before the first optimizer step, host memory can hold more than during training: a process that
builds the model without ``deepspeed.zero.Init`` holds a whole copy of it, and every tensor that
DeepSpeed pins is pinned by copy (``accelerator/cuda_accelerator.py`` ``pin_memory``: a new
page-locked block is filled from the pageable source, and both are resident until the source is
dropped). The steady footprint (:func:`offsim.fit_check.footprint`) counts what training
holds; this module counts the highest point of start-up, per tier, with the items resident then.
File and function names below are DeepSpeed's (``deepspeed/runtime/``), read at commit
``edaa722126``; the order of the allocations is ``../shared/reference/deepspeed_runtime.md`` §8.

Phases, per rank; every rank of a node goes through them at once, so a node holds
``ranks_per_node`` times the per-rank figure (as DeepSpeed's estimator counts ``4 g P``):

1. **Loading the model.** Without ``zero.Init`` (every ZeRO stage below 3; the Hugging Face
   integration builds stage 3 under it), each process materialises the whole model on the host
   in fp32 before ``deepspeed.initialize`` moves it to the GPU: the ``4 * num_gpus_per_node``
   bytes per parameter of ``estimate_zero2_model_states_mem_needs`` (``zero/stage_1_and_2.py``)
   and of the ``zero_init=0`` lines of ``estimate_zero3_model_states_mem_needs``
   (``zero/stage3.py``). Nothing else is on the host yet.
2. **Building the optimizer.** The buffers training keeps on the host (the steady items) except
   what appears later: the optimizer's moments (made by the first step: ``ops/adam/cpu_adam.py``
   states are created lazily), offloaded activations (made by the forward pass) and the
   step-time transients; the fp32 master copy is resident (built from the 16-bit parameters).
   Beside them, the largest transient of the build:

   * ZeRO-1/2 with the optimizer on the CPU (``zero/stage_1_and_2.py``
     ``DeepSpeedZeroOptimizer.__init__``): the fp32 master partition is made by
     ``.clone().to(device=cpu, dtype=fp32)`` and then pinned, so its pageable source (4 bytes per
     element) and the pinned copy coexist; the 16-bit staging buffer (``torch.full``) and, in
     ``initialize_optimizer_states``, the fp32 gradient partition (``torch.zeros``) are pinned the
     same way;
   * ZeRO-3 (``zero/stage3.py``): ``_create_fp16_partitions_with_defragmentation`` with
     ``offload_param`` allocates the flat pinned 16-bit buffer and moves the per-parameter
     partitions in, freeing them one by one (both sets resident at the start: pinned when
     ``offload_param.pin_memory``); ``_create_fp32_partitions`` casts each sub-group to fp32 and
     clones it (one sub-group's cast is scratch; the fp32 master is pageable); and the transients
     of :func:`offsim.plan.footprint.deepspeed_host_init` (pinned gradient buffers made from
     ``torch.zeros``).

Not counted: the checkpoint file itself (safetensors are memory-mapped: page cache, not process
memory), the GPU side of start-up, NVMe writes of the initial fp32 state, and CUDA's own pinned
staging of unpinned copies.
"""

from __future__ import annotations

from dataclasses import dataclass

from offsim.config.run import RunConfig
from offsim.config.workload import DTYPE_BYTES
from offsim.plan.footprint import (
    Footprint,
    StateSizes,
    deepspeed_host_init,
    deepspeed_sub_groups,
    deepspeed_zero3_offload,
    host_steps_peak,
    param_partitions,
    round_pinned,
)

#: Steady host items that do not exist yet at start-up (prefixes of footprint item names).
LATER = ("offloaded activations", "transient peak", "optimizer state")
#: The start-up phases, as reported.
LOADING = "loading the model (no zero.Init)"
BUILDING = "building the optimizer"


@dataclass(frozen=True)
class StartupPeak:
    """The start-up peak of host memory.

    Attributes:
        need_bytes: ``host_pinned`` and ``host`` (pinned included), per node, at the highest point.
        phase: :data:`LOADING` or :data:`BUILDING`, where the host peak is.
        items: per tier (``host_pinned``; ``host``, pinned included), the bytes per rank of
            each item resident at the peak of that tier.
    """

    need_bytes: dict[str, float]
    phase: str
    items: dict[str, dict[str, float]]


def loaded_model_bytes(cfg: RunConfig, sz: StateSizes) -> float:
    """Bytes per rank of the model materialised on the host before ``deepspeed.initialize``:
    the whole model (or a tensor-parallel share) in fp32 without ``zero.Init``, none with it
    (ZeRO-3 partitions each module as it is built)."""
    if cfg.strategy.zero_stage >= 3:
        return 0.0
    return sz.params_total * DTYPE_BYTES["fp32"]


def master_bytes(cfg: RunConfig, sz: StateSizes) -> float:
    """Bytes per rank of the fp32 master parameters the host optimizer owns (its share updated on
    the host), resident from start-up; 0 when the optimizer state is not in host memory."""
    st = cfg.strategy
    if st.placement.optimizer_states != "cpu":
        return 0.0
    return sz.local_params * DTYPE_BYTES[cfg.workload.precision.master_params] * (1.0 - st.optimizer_gpu_fraction)


def _zero12_transients(cfg: RunConfig, sz: StateSizes) -> dict[str, float]:
    """ZeRO-1/2 with the optimizer on the CPU: pageable sources of the tensors pinned by copy
    (stage_1_and_2.py ``DeepSpeedZeroOptimizer.__init__``, ``initialize_optimizer_states``)."""
    st, pr = cfg.strategy, cfg.workload.precision
    if st.zero_stage >= 3 or st.placement.optimizer_states != "cpu" or not (st.pin_memory and st.pin_by_copy):
        return {}
    local = sz.local_params * (1.0 - st.optimizer_gpu_fraction)
    return {"fp32 master partition: pageable source of pin_memory()": local * DTYPE_BYTES[pr.master_params],
            "16-bit staging buffer: pageable source of pin_memory()": local * DTYPE_BYTES[pr.params],
            "fp32 gradient partition: pageable source of pin_memory()": local * DTYPE_BYTES[pr.optimizer_grads]}


def _zero3_transients(cfg: RunConfig, sz: StateSizes) -> dict[str, tuple[str, float]]:
    """ZeRO-3 offload: item -> (tier, bytes) of each transient of the build (stage3.py)."""
    st, pr = cfg.strategy, cfg.workload.precision
    if not deepspeed_zero3_offload(cfg):
        return {}
    parts = param_partitions(cfg, sz)
    out: dict[str, tuple[str, float]] = {}
    if st.placement.params == "cpu":  # _create_fp16_partitions_with_defragmentation
        tier = "host_pinned" if st.pin_memory else "host"
        out["16-bit partitions before defragmentation (zero.Init)"] = (tier, sum(parts) * DTYPE_BYTES[pr.params])
    if st.placement.optimizer_states == "cpu":  # _create_fp32_partitions: a cast, then a clone
        largest = max(deepspeed_sub_groups(parts, st.sub_group_params))
        out["fp32 cast of one sub-group (_create_fp32_partitions)"] = ("host", largest * DTYPE_BYTES["fp32"])
    left, peak = host_steps_peak(deepspeed_host_init(cfg, sz))
    out["pageable sources of pinned gradient buffers (initialize_optimizer_states)"] = (
        "host", peak - sum(left.values()))
    if st.placement.grads == "cpu" and st.delayed_grad_conversion and st.pin_memory and st.pin_by_copy:
        # MLP-Offload: the 16-bit gradients' home is grad_partitions_flat_buffer, torch.zeros then
        # pin_memory() (DataStates/DeepSpeed dist_nvme_opt stage3.py _setup_for_real_optimizer)
        out["pageable source of grad_partitions_flat_buffer (_setup_for_real_optimizer)"] = (
            "host", sz.local_params * sz.host_grad_bytes_per_param * (1.0 - st.optimizer_gpu_fraction))
    return out


def _resident(fp: Footprint, cfg: RunConfig, sz: StateSizes) -> dict[str, dict[str, float]]:
    """Per tier (``host_pinned``, ``host`` pageable), the steady host items already built at
    start-up; the optimizer state reduced to its fp32 master copy, in the tier the footprint puts
    the optimizer state."""
    out: dict[str, dict[str, float]] = {"host_pinned": {}, "host": {}}
    for tier in out:
        for what, nbytes in fp.breakdown[tier].items():
            if not what.startswith(LATER):
                out[tier][what] = nbytes
    master = master_bytes(cfg, sz)
    if master > 0:
        pinned = any(what.startswith("optimizer state") for what in fp.breakdown["host_pinned"])
        if pinned:
            master = round_pinned(master, cfg.strategy.host_allocator)
        out["host_pinned" if pinned else "host"]["fp32 master params (built from the 16-bit params)"] = master
    return out


def _largest_transient(cfg: RunConfig, sz: StateSizes) -> tuple[str, str, float]:
    """(tier, item, bytes) of the largest single transient of the optimizer build, or an empty item."""
    found = [("host", what, b) for what, b in _zero12_transients(cfg, sz).items()]
    found += [(tier, what, b) for what, (tier, b) in _zero3_transients(cfg, sz).items()]
    found = [f for f in found if f[2] > 0]
    return max(found, key=lambda f: f[2]) if found else ("host", "", 0.0)


def startup_peak(cfg: RunConfig, sz: StateSizes, fp: Footprint) -> StartupPeak:
    """The start-up peak of pinned and of all host memory, per node, with the items of each
    (module docstring). ``fp`` is the steady footprint of ``cfg``."""
    ranks = sz.ranks_per_node
    building = _resident(fp, cfg, sz)
    tier, what, nbytes = _largest_transient(cfg, sz)
    if nbytes > 0:
        building[tier][what] = building[tier].get(what, 0.0) + nbytes
    pinned = dict(building["host_pinned"])
    every = {**building["host"], **pinned}
    loaded = loaded_model_bytes(cfg, sz)
    if loaded > sum(every.values()):
        every = {"whole model in fp32 on every rank (no zero.Init)": loaded}
        phase = LOADING
    else:
        phase = BUILDING
    need = {"host_pinned": sum(pinned.values()) * ranks, "host": sum(every.values()) * ranks}
    return StartupPeak(need, phase, {"host_pinned": pinned, "host": every})
