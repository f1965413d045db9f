"""PyTorch's own CPU optimizer steps (not DeepSpeed's CPU Adam): their DRAM bytes per element and
the flow that streams them.

Three systems step fp32 tensors on the host with torch code: FSDP2's CPU offload
(``torch.optim.Adam``/``AdamW``, the per-tensor loop by default), Megatron-Core's
HybridDeviceOptimizer (``torch.optim.AdamW(fused=True)`` on the CPU share) and Colossal-AI's
HybridAdam for bf16 gradients (its fallback of torch ops). The same torch code is priced the same
way for all of them here: each ATen elementwise kernel is one pass that streams its operands
through DRAM once (:func:`adam_passes`), and the passes together run as one flow
(:func:`torch_pass_flow`).

Assumption (no torch CPU Adam rate is measured on offsim's profiles): the passes reach the same
fraction of the rank's DRAM share as DeepSpeed's CPU Adam does (:data:`offsim.plan.cpu_adam.
ADAM_DRAM_EFFICIENCY`, fitted on ZeRO-Offload Table 4), and each intra-op thread streams at most
:data:`offsim.plan.cpu_adam.THREAD_STREAM_BYTES_PER_S`. ZeRO-Offload's Table 4 measured PyTorch's
CPU Adam of 2020 at 14.76 s for 10B parameters, where this model gives 6.6 s for the loop
(``tests/test_systems_fsdp2.py`` keeps that gap visible as a strict xfail).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from offsim.config.hardware import HardwareProfile
from offsim.core.enums import Link, Res
from offsim.plan import cpu_adam
from offsim.schedule.ops import Flow


class AdamImpl(StrEnum):
    """Which ``torch.optim.Adam``/``AdamW`` code steps the CPU tensors.

    ``for-loop``: ``_single_tensor_adam``, torch's default for CPU tensors (foreach is chosen only
    for CUDA-like devices: ``torch/utils/_foreach_utils.py`` ``_get_foreach_kernels_supported_devices``;
    ``../shared/reference/config_formats.md`` section 4). ``fused``: ``fused=True``, one kernel
    (``_fused_adam_``, which has a CPU implementation: ``aten/src/ATen/native/cpu/FusedAdamKernel.cpp``),
    torchtitan's default and Megatron-Core's HybridDeviceOptimizer's.
    """

    FOR_LOOP = "for-loop"
    FUSED = "fused"


@dataclass(frozen=True)
class TorchPass:
    """One elementwise pass of a CPU step over every element of the tensors.

    Attributes:
        name: the torch call (``torch/optim/adam.py`` ``_single_tensor_adam``, or
            ``torch/nn/utils/clip_grad.py`` ``clip_grad_norm_``).
        dram_bytes_per_param: bytes it reads plus bytes it writes per element.
    """

    name: str
    dram_bytes_per_param: float


def adam_passes(impl: AdamImpl, param_bytes: float, moment_bytes: float, weight_decay: bool,
                decoupled: bool) -> tuple[TorchPass, ...]:
    """The passes of one torch Adam step per element (gradients in the parameters' dtype).

    ``_single_tensor_adam`` (``torch/optim/adam.py`` @ ``dc80ccded5``, the non-capturable,
    non-amsgrad branch) runs, per tensor: ``exp_avg.lerp_(grad, 1 - beta1)``;
    ``exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)``;
    ``denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)`` (two new tensors, then in
    place); ``param.addcdiv_(exp_avg, denom, value=-step_size)``. Each is one ATen elementwise
    kernel, multi-threaded over the tensor (``at::parallel_for``), so each streams its operands
    through DRAM once. fp32 throughout: 12 + 8 + 12 + 8 + 8 + 8 + 16 = 72 B. The fused kernel reads
    param, grad and both moments and writes param and both moments once: 28 B (weight decay inside
    it). A write is counted once (no read-for-ownership).
    """
    p = g = param_bytes
    m = moment_bytes
    if impl is AdamImpl.FUSED:
        return (TorchPass("_fused_adam_", 2 * p + g + 4 * m),)
    decay: tuple[TorchPass, ...] = ()
    if weight_decay:
        decay = ((TorchPass("param.mul_(1 - lr * weight_decay)", 2 * p),) if decoupled
                 else (TorchPass("grad.add(param, alpha=weight_decay)", 2 * g + p),))
    return (*decay, TorchPass("exp_avg.lerp_(grad)", 2 * m + g), TorchPass("exp_avg_sq.mul_(beta2)", 2 * m),
            TorchPass("exp_avg_sq.addcmul_(grad, grad)", 2 * m + g), TorchPass("exp_avg_sq.sqrt()", 2 * m),
            TorchPass("/ bias_correction2_sqrt", 2 * m), TorchPass(".add_(eps)", 2 * m),
            TorchPass("param.addcdiv_(exp_avg, denom)", 2 * p + 2 * m))


def clip_passes(grad_bytes: float) -> tuple[TorchPass, ...]:
    """``clip_grad_norm_`` (``torch/nn/utils/clip_grad.py``): each gradient's norm (read), then
    ``mul_`` by the clip coefficient (read and write): 3 x 4 B for fp32 gradients."""
    return (TorchPass("clip_grad_norm_: norms", grad_bytes), TorchPass("clip_grad_norm_: mul_", 2 * grad_bytes))


def torch_pass_flow(hw: HardwareProfile, ranks_per_node: int, threads_per_rank: int | None, params: float,
                    passes: Sequence[TorchPass]) -> Flow:
    """``passes`` over ``params`` elements as one flow of DRAM bytes, at the efficiency and thread
    cap of the module docstring's assumption (charged as ``1 / efficiency`` of DRAM per byte)."""
    host = cpu_adam.CpuHost(hw.cpu.cores, hw.cpu.sockets, None, cpu_adam.CpuSimd.NONE,
                            hw.dram.bandwidth_bytes_per_s)
    threads = cpu_adam.rank_threads(host, ranks_per_node, threads_per_rank)
    nbytes = round(params * sum(p.dram_bytes_per_param for p in passes))
    return Flow(nbytes, ((Res.DRAM, 1.0 / cpu_adam.ADAM_DRAM_EFFICIENCY),),
                threads * cpu_adam.THREAD_STREAM_BYTES_PER_S, (Link.CPU,))
