"""DeepSpeed CPU Adam's rate, from its implementation (issue 23 part 1).

One rank's ``DeepSpeedCPUAdam.step`` (``deepspeed/ops/adam/cpu_adam.py``) calls
``ds_adam_step`` (``csrc/adam/cpu_adam_impl.cpp``), whose ``Step_8``/``Step_4``/``Step_1`` run
``Adam_Optimizer::Step_AVX`` (``csrc/includes/cpu_adam.h``): per fp32 element it loads g, m, v, p,
does 2 mul + 5 FMA + 1 sqrt + 1 div, and stores p, m, v (28 B of DRAM traffic). Each 128 Mi-element
``TILE`` is one ``#pragma omp parallel for`` over the process's OpenMP threads. The SIMD width is
fixed when the op is built (``op_builder/builder.py::simd_width``): ``-D__AVX512__`` if the CPU
reports avx512/avx512f, ``-D__AVX256__`` if avx2, otherwise (every non-x86 CPU: NEON, SVE)
``-D__SCALAR__``. Read at deepspeedai/DeepSpeed ``edaa722`` (2026-08-22); summary in
``../shared/reference/deepspeed_runtime.md`` sections 5 and 14.7.

The rate of one rank is the least of three bounds (deepspeed_runtime.md section 5, "Simulator rule"):

* **compute**: threads x clock x elements per cycle of the build (sqrt and div share one
  divider, so AVX-512 and AVX2 run at the same rate per core: measured below);
* **per-thread streaming**: threads x what one thread can stream from DRAM;
* **DRAM share**: the socket's bandwidth shared by the ranks on that socket (they step at the
  same time), times the fraction of STREAM-like bandwidth that Adam's seven streams reach.

Threads: ``deepspeed --bind_cores_to_rank`` sets ``OMP_NUM_THREADS`` = cores / local ranks
(``deepspeed/launcher/launch.py``, ``deepspeed/utils/numa.py::get_numactl_cmd``); without it every
rank's OpenMP team defaults to all visible cores, and the ranks time-share them, which leaves each
the same cores / ranks. A smaller explicit thread count (torchrun's ``OMP_NUM_THREADS=1``) is an input.

Besides Adam, a ZeRO offload step runs host passes over each sub-group (deepspeed_runtime.md
sections 4, 5, 13): ``unscale_and_clip_grads`` (``stage3.py`` and ``stage_1_and_2.py``: a CPU
``mul_`` over the fp32 gradient, 8 B/elem, always run) and the fp32 -> fp16/bf16 cast of the updated
master into the upload buffer (4 B read + 2 B written). DeepSpeed v0.3.0-v0.8.3 with fp16 ZeRO-1/2
instead fused the copy into the step (``ds_adam_step_plus_copy``: the GPU reads each tile's fp32
result over PCIe, 4 B/elem; removed by PR #5409, absent from v0.14.3); that is
:attr:`LpCopy.FUSED_ZERO_COPY`. The current release is :attr:`LpCopy.SEPARATE_CAST`.

Fit and checks, kept apart (issue 23's rule). The one fitted number, :data:`ADAM_DRAM_EFFICIENCY`,
comes from ZeRO-Offload's Table 4 alone (:func:`fit_dram_efficiency`). It is checked, never fitted,
on: LSP-Offload's Table 1 (Threadripper 3970X; a strict xfail in tests/test_cpu_adam.py, the
model predicts 1.57e9 params/s where 3.5e9 were measured), and the Deep Optimizer States sample
log's vanilla ZeRO-3 step (EPYC 7543P assumed; validation case dos-7b-vanilla-zero3-cpu-optimizer:
3.32 s predicted, 3.96 s logged, of which Adam at 3.21e9 params/s is 1.85 s, the rest the
sub-groups' blocking uploads and the unscale and cast passes).

Not modelled: the per-tile fork/join and per-call Python overhead (one fork per 128 Mi elements),
NUMA placement beyond the even split across sockets, the first step's page faults, and the host
synchronizations of the gradient norm (``stage3.py::complete_grad_norm_calculation_for_cpu_offload``:
one ``float()`` and one ``.cpu()`` per sub-group; ZeRO-1/2: one ``.item()`` per parameter of the
fp64 norms ``set_norm_for_param_grad_in_gpu`` computes on the GPU), for want of a measured
host-sync latency in the profiles.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum


class CpuSimd(StrEnum):
    """The widest vector extension a CPU reports (``/proc/cpuinfo`` flags or ``lscpu``)."""

    AVX512 = "avx512"
    AVX2 = "avx2"
    NEON = "neon"
    SVE = "sve"
    NONE = "none"


class SimdBuild(StrEnum):
    """What DeepSpeed compiles CPU Adam for (``op_builder/builder.py::simd_width``)."""

    AVX512 = "avx512"
    AVX256 = "avx256"
    SCALAR = "scalar"


class RateOrigin(StrEnum):
    """Where a profile's CPU Adam rate comes from."""

    MEASURED = "measured"  # the profile states a measured figure (an override)
    DERIVED = "derived"  # computed by this module from the CPU and DRAM description


class LpCopy(StrEnum):
    """How the updated fp32 master reaches the GPU's fp16/bf16 copy (deepspeed_runtime.md 14.1)."""

    SEPARATE_CAST = "separate_cast"  # v0.9.0+ and every bf16 or ZeRO-3 run: CPU cast pass, then H2D
    FUSED_ZERO_COPY = "fused_zero_copy"  # v0.3.0-v0.8.3 fp16 ZeRO-1/2: GPU reads fp32 tiles over PCIe


#: The current DeepSpeed release's behaviour (PR #5409 removed the fused step + copy).
DEFAULT_LP_COPY = LpCopy.SEPARATE_CAST

#: DRAM bytes per element of one Adam step with fp32 params, grads and states: read p, g, m, v
#: (16 B), write p, m, v (12 B) (deepspeed_runtime.md section 5, "Bytes").
ADAM_FP32_BYTES_PER_PARAM = 28.0

#: Elements per clock cycle of one thread running the vector kernel (AVX2 or AVX-512), in cache.
#: Measured in this session (2026) on an unnamed Intel Xeon VM (avx512f, 2.3 GHz nominal; turbo
#: unknown, so this is per nominal cycle): an own C rewrite of Step_AVX's arithmetic (not
#: DeepSpeed's code), gcc -O3 -march=native, 4,096 fp32 elements, one thread, best of 7 runs:
#: AVX2 2.15e9 and AVX-512 2.14e9 elements/s -> 2.15e9 / 2.3e9 = 0.93. The two widths are equal
#: because sqrt and div share the divider.
VECTOR_ELEMENTS_PER_CYCLE = 0.93

#: The same measurement for the ``__SCALAR__`` loop (gcc does not vectorize it: sqrtf sets errno):
#: 0.467e9 elements/s / 2.3e9 = 0.20.
SCALAR_ELEMENTS_PER_CYCLE = 0.20

#: DRAM bytes/s one thread's Adam streams reach. Same host and kernel with 64 Mi elements per
#: array (1 GiB of state, from DRAM), one thread: AVX2 0.878e9, AVX-512 0.906e9 elements/s ->
#: mean 0.892e9 x 28 B = 25.0e9 B/s. One host only: an assumption elsewhere.
THREAD_STREAM_BYTES_PER_S = 25.0e9

#: The five ZeRO-Offload Table 4 points (arXiv 2101.06840): CPU-Adam step time of 1, 2, 4, 8
#: and 10 B parameters on 2x Xeon Platinum 8168 (DGX-2), seconds. The fit source.
ZERO_OFFLOAD_TABLE4 = ((1e9, 0.22), (2e9, 0.51), (4e9, 1.03), (8e9, 2.41), (10e9, 2.57))

#: The DGX-2 host's achievable DRAM bandwidth, B/s: Intel's AVX-512 STREAM figure for 2S
#: Skylake-SP with 6 channels of DDR4-2666 (hardware_facts.md 3.1, AnandTech 11544), as in
#: ``hardware_profiles/dgx2-v100.yaml``.
DGX2_DRAM_BYTES_PER_S = 199e9


def fit_dram_efficiency() -> float:
    """The fraction of STREAM-like bandwidth Adam reaches, fitted on ZeRO-Offload Table 4.

    Every point is DRAM bound under this model (48 cores: compute 48 x 2.7 GHz x 0.93 = 1.2e11
    elements/s, streaming 48 x 25e9 / 28 = 4.3e10, both far above 3.9e9), so the efficiency is
    the geometric mean of the five rates x 28 B / 199 GB/s = 3.893e9 x 28 / 199e9 = 0.548.
    """
    logs = [math.log(n / t) for n, t in ZERO_OFFLOAD_TABLE4]
    rate = math.exp(sum(logs) / len(logs))
    return rate * ADAM_FP32_BYTES_PER_PARAM / DGX2_DRAM_BYTES_PER_S


#: :func:`fit_dram_efficiency`, rounded (a test checks the two agree).
ADAM_DRAM_EFFICIENCY = 0.548


def deepspeed_simd_build(simd: CpuSimd) -> SimdBuild:
    """The build DeepSpeed picks for a CPU (``op_builder/builder.py::simd_width``): AVX-512 for
    avx512/avx512f, AVX2 (``__AVX256__``) for avx2, scalar for everything else, Arm included."""
    if simd is CpuSimd.AVX512:
        return SimdBuild.AVX512
    if simd is CpuSimd.AVX2:
        return SimdBuild.AVX256
    return SimdBuild.SCALAR


def elements_per_cycle(build: SimdBuild) -> float:
    """Adam elements one thread updates per clock cycle, in cache (measured, see the constants)."""
    return SCALAR_ELEMENTS_PER_CYCLE if build is SimdBuild.SCALAR else VECTOR_ELEMENTS_PER_CYCLE


@dataclass(frozen=True)
class CpuHost:
    """The CPU side of one node, as CPU Adam sees it.

    Attributes:
        cores: physical cores of the node (all sockets).
        sockets: CPU sockets; cores and DRAM bandwidth split evenly across them.
        clock_hz: sustained all-core clock, Hz (None: not known; the compute bound is left out,
            which matters only with few threads per rank: with all cores it is 20x or more above
            the DRAM bound on every shipped profile).
        simd: the widest vector extension the CPU reports.
        dram_bytes_per_s: the node's achievable (STREAM-like) DRAM bandwidth, B/s.
    """

    cores: int
    sockets: int
    clock_hz: float | None
    simd: CpuSimd
    dram_bytes_per_s: float


def dram_share_bytes_per_s(host: CpuHost, ranks_per_node: int) -> float:
    """DRAM bandwidth one rank can draw while every rank steps at once, B/s.

    Ranks spread evenly over sockets; the busiest socket (``ceil(ranks / sockets)`` ranks) sets
    the pace of the barrier. A rank alone on several sockets spans ``sockets // ranks`` of them.
    """
    per_socket = host.dram_bytes_per_s / host.sockets
    if ranks_per_node >= host.sockets:
        return per_socket / math.ceil(ranks_per_node / host.sockets)
    return per_socket * (host.sockets // ranks_per_node)


def rank_threads(host: CpuHost, ranks_per_node: int, threads_per_rank: int | None = None) -> float:
    """Cores' worth of threads one rank's step gets: its OpenMP threads, at most its share of
    the node's cores (more threads than that only time-share them)."""
    share = host.cores / ranks_per_node
    return share if threads_per_rank is None else min(float(threads_per_rank), share)


def rank_adam_params_per_s(host: CpuHost, ranks_per_node: int, threads_per_rank: int | None = None,
                           bytes_per_param: float = ADAM_FP32_BYTES_PER_PARAM) -> float:
    """Parameters/s one rank's CPU Adam updates while all ranks of the node step together.

    ``min(compute, per-thread streaming, DRAM share)``, each in parameters/s; ``bytes_per_param``
    is the step's DRAM traffic per element (28 B for fp32; 14 B with bf16 master and states).
    """
    threads = rank_threads(host, ranks_per_node, threads_per_rank)
    compute = math.inf
    if host.clock_hz is not None:
        compute = threads * host.clock_hz * elements_per_cycle(deepspeed_simd_build(host.simd))
    stream = threads * THREAD_STREAM_BYTES_PER_S / bytes_per_param
    dram = dram_share_bytes_per_s(host, ranks_per_node) * ADAM_DRAM_EFFICIENCY / bytes_per_param
    return min(compute, stream, dram)


def node_adam_params_per_s(host: CpuHost) -> float:
    """The node's CPU Adam rate with one process on all cores (ZeRO-Offload Table 4's setting),
    fp32 state, parameters/s. Ranks sharing the node never exceed it together."""
    return rank_adam_params_per_s(host, 1)


@dataclass(frozen=True)
class HostPass:
    """One host pass of the optimizer step besides Adam.

    Attributes:
        name: what DeepSpeed runs (file and function in the module docstring).
        dram_bytes_per_param: DRAM bytes read plus written per parameter.
    """

    name: str
    dram_bytes_per_param: float


def step_passes(lp_copy: LpCopy = DEFAULT_LP_COPY, grad_bytes: float = 4.0, master_bytes: float = 4.0,
                lp_bytes: float = 2.0) -> tuple[HostPass, ...]:
    """The host passes of one ZeRO offload step besides Adam, in order.

    Unscale: ``unscale_and_clip_grads`` multiplies the fp32 gradient in place (read + write).
    Cast: the updated master is cast into the fp16/bf16 upload buffer (read fp32, write lp); with
    the fused step + copy of v0.3.0-v0.8.3 there is no CPU cast (the GPU reads fp32 over PCIe).
    """
    passes = [HostPass("unscale_and_clip_grads", 2.0 * grad_bytes)]
    if lp_copy is LpCopy.SEPARATE_CAST:
        passes.append(HostPass("cast_master_to_lp", master_bytes + lp_bytes))
    return tuple(passes)


def fused_upload_bytes_per_param(lp_copy: LpCopy, lp_bytes: float = 2.0, master_bytes: float = 4.0) -> float:
    """Host-to-GPU bytes per parameter of the updated-parameter upload: the lp copy (separate
    cast), or the fp32 tile the GPU reads itself (fused zero-copy, ``launch_param_update``)."""
    return master_bytes if lp_copy is LpCopy.FUSED_ZERO_COPY else lp_bytes


def overflow_scan_bytes_per_param(grad_bytes: float = 2.0, fused: bool = False) -> float:
    """DRAM bytes per element of DeepSpeed ZeRO-3's fp16 overflow check over the rank's host
    gradient accumulator, run at each step before the norms (``stage3.py::has_overflow``:
    ``torch.isinf(grad_partitions_flat_buffer).any()`` then ``torch.isnan(...).any()``, then
    ``.item()``; ``_overflow_check_and_loss_scale_update`` runs it for fp16 only).

    ``isinf`` is ``self.abs() == inf`` (aten/src/ATen/native/TensorCompare.cpp): ``abs`` reads and
    writes ``grad_bytes``, ``==`` reads them and writes a 1-byte mask, ``any`` reads the mask;
    ``isnan`` is ``self != self``: reads ``grad_bytes``, writes a mask, ``any`` reads it. So
    4 x grad_bytes + 4 (12 B for fp16). ``fused`` (MemAscend's single-pass check): the one read
    of each element any check needs, ``grad_bytes``.
    """
    if fused:
        return grad_bytes
    return (2.0 * grad_bytes) + (grad_bytes + 1.0) + 1.0 + (grad_bytes + 1.0) + 1.0
