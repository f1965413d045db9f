"""Closed sets are enums: memory tiers, shared resources, traffic links, op kinds, activities,
tensor kinds, phases, caches and mechanisms.

They are ``StrEnum``: a member compares equal to its value and serialises as it, so JSON output
and the span and metric columns keep today's names (``"host_pinned"``, ``"param_fetch"``) while
code names members, never strings.
"""

from __future__ import annotations

from enum import StrEnum


class Tier(StrEnum):
    """A memory tier. GPU is per rank; host and NVMe per node; the PFS per job."""

    GPU = "gpu"
    HOST_PINNED = "host_pinned"
    HOST_PAGEABLE = "host_pageable"
    NVME = "nvme"
    PFS = "pfs"


def home_tier(home: str, pinned: bool) -> Tier:
    """The tier of a YAML placement home (``gpu``, ``cpu``, ``nvme``): ``cpu`` is pinned or
    pageable host memory as ``pin_memory`` says. The one mapping from placement names to tiers."""
    if home == "gpu":
        return Tier.GPU
    if home == "nvme":
        return Tier.NVME
    return Tier.HOST_PINNED if pinned else Tier.HOST_PAGEABLE


class Res(StrEnum):
    """A shared-capacity resource, divided max-min fair among the flows that use it."""

    H2D = "h2d"
    D2H = "d2h"
    SWITCH_H2D = "switch_h2d"
    SWITCH_D2H = "switch_d2h"
    DRAM = "dram"
    MEMCPY = "memcpy"
    CPU = "cpu"
    NVME = "nvme"
    PFS_READ = "pfs_read"
    PFS_WRITE = "pfs_write"
    GPU_LINK_TX = "gpu_link_tx"
    GPU_LINK_RX = "gpu_link_rx"


class Link(StrEnum):
    """A traffic column: where a flow's bytes are counted (and the track its span lies on)."""

    H2D = "h2d"
    D2H = "d2h"
    NVME_READ = "nvme_read"
    NVME_WRITE = "nvme_write"
    PFS_READ = "pfs_read"
    PFS_WRITE = "pfs_write"
    GPU_LINK = "gpu_link"
    DRAM_COPY = "dram_copy"
    CPU = "cpu"


class OpKind(StrEnum):
    """What an op does to the engine's state."""

    DELAY = "delay"      # busy for a fixed time (a GPU kernel)
    FLOW = "flow"        # move bytes over shared resources
    ALLOC = "alloc"      # hold bytes of a tier
    FREE = "free"        # release exactly what an ALLOC of the same tensor held
    ACQUIRE = "acquire"  # take units of a pool (staging bytes, buffer slots)
    RELEASE = "release"  # give them back
    ACCESS = "access"    # issue a policy-managed cache's demand for a unit (and prefetches)
    READY = "ready"      # wait until the cache holds the unit
    PREFETCH = "prefetch"  # start fetches early while memory allows
    DONE = "done"        # the unit's use ended: the eviction policy may release it
    FLUSH = "flush"      # drop every unit (iteration end)
    JOIN = "join"        # nothing: a point others wait for
    CHOOSE = "choose"    # a run-time choice among programs (its policy picks one, which runs)


class Activity(StrEnum):
    """What a span of work is, for attribution; values are the span kinds offsim reports."""

    FORWARD = "forward"
    BACKWARD = "backward"
    RECOMPUTE = "recompute"
    PARAM_FETCH = "param_fetch"
    PARAM_GATHER = "param_allgather"
    PARAM_UPDATE = "param_update"
    GRAD_REDUCE = "grad_reduce"
    GRAD_COMPRESS = "grad_compress"
    GRAD_OFFLOAD = "grad_offload"
    GRAD_ACCUMULATE = "grad_accumulate"
    GRAD_CAST = "grad_cast"
    ACT_OFFLOAD = "act_offload"
    ACT_FETCH = "act_fetch"
    OPT_SWAP_IN = "optimizer_swap_in"
    OPT_SWAP_OUT = "optimizer_swap_out"
    OPT_H2D = "optimizer_h2d"
    OPT_D2H = "optimizer_d2h"
    OPTIMIZER = "optimizer"
    TP_ALLREDUCE = "tp_allreduce"
    HOST_SETUP = "host_setup"
    STALL = "stall"


class TensorKind(StrEnum):
    """A kind of training state."""

    PARAM16 = "param16"
    GRAD16 = "grad16"
    GRAD_OPT = "grad_opt"          # the optimizer's gradient (fp32, or 16-bit when delayed)
    OPT_STATE = "optimizer_state"  # fp32 master parameters and moments
    ACTIVATION = "activation"
    WORKSPACE = "workspace"        # transient working memory (backward, overflow check)
    BUFFER = "buffer"              # staging, swap and gradient buffers
    RESERVED = "reserved"          # CUDA context and allocator reserve


class Phase(StrEnum):
    """Where in an iteration an op belongs (span ``phase`` column)."""

    INIT = "init"
    FORWARD = "forward"
    BACKWARD = "backward"
    OPTIMIZER = "optimizer"


class CacheId(StrEnum):
    """A policy-managed cache."""

    GPU_PARAMS = "gpu_params"
    DRAM_OPTIMIZER = "dram_optimizer"
    GPU_ACTIVATIONS = "gpu_activations"


class ChoiceId(StrEnum):
    """A decision a schedule leaves to run time (a policy picks which program runs)."""

    OPTIMIZER_SPLIT = "optimizer_split"  # which sub-groups the step updates on the GPU


class StreamKind(StrEnum):
    """What runs ops in order: a GPU compute stream, a copy queue, an aio queue, a CPU thread."""

    GPU_COMPUTE = "gpu_compute"
    COPY = "copy"
    AIO = "aio"
    CPU = "cpu"


class MechanismId(StrEnum):
    """One per mechanism file in :mod:`offsim.mechanisms`."""

    COMPUTE = "compute"
    PARAM_FETCH = "param_fetch"
    ACTIVATIONS = "activations"
    GRADS = "grads"
    CPU_OPTIMIZER = "cpu_optimizer"
    GPU_OPTIMIZER = "gpu_optimizer"
    STATIC_STATE = "static_state"
    HOST_BUFFERS = "host_buffers"
    TENSOR_PARALLEL = "tensor_parallel"
