"""How many optimizer sub-groups to update on the GPU: Deep Optimizer States' performance model.

Deep Optimizer States (Maurya et al., Middleware 2024, arXiv 2410.21316) keeps the fp32 optimizer
state on the host and, per iteration, streams some sub-groups to the GPU (master params, moments
and the fp32 gradient over H2D), updates them there and streams the state back (D2H), while the
CPU updates the other sub-groups concurrently. The split weighs data movement against the CPU's
and the GPU's update speed and the contention for the shared PCIe link: the CPU path also sends
each updated sub-group's 16-bit parameters H2D.

Pure planning, no SimPy: :class:`PerfModelSplit` is the run-time policy of the step's
:class:`~offsim.schedule.ops.Choose`; at each step it calls :func:`plan_split` with the rates
observed in the previous iteration (the profile's rates at the first one) and the GPU memory
left free after backward.

The step of ``n`` GPU sub-groups out of ``N`` of ``P`` parameters each is estimated as the busiest
of the concurrent resources plus the tail of the last GPU sub-group (its update and copy back):

* CPU: ``(N - n) P / cpu_rate``
* H2D: ``(n P h2d_gpu + (N - n) P h2d_cpu) / h2d_rate``
* D2H: ``n P d2h_gpu / d2h_rate``
* HBM: ``n P hbm_gpu / hbm_rate``

with both PCIe directions derated by the link's duplex efficiency when both are busy.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass, field, replace


@dataclass(frozen=True)
class SplitRates:
    """Rates the split is planned with (observed or from the hardware profile).

    Attributes:
        cpu_params_per_s: CPU Adam parameters per second (under the DRAM traffic of the step).
        h2d_bytes_per_s: host -> GPU copy rate.
        d2h_bytes_per_s: GPU -> host copy rate.
        hbm_bytes_per_s: GPU memory bandwidth (GPU Adam is memory-bound).
        duplex_efficiency: fraction of each direction's rate kept when both are busy.
    """

    cpu_params_per_s: float
    h2d_bytes_per_s: float
    d2h_bytes_per_s: float
    hbm_bytes_per_s: float
    duplex_efficiency: float = 1.0


@dataclass(frozen=True)
class SplitBytes:
    """Bytes per parameter moved or touched on each path.

    Attributes:
        h2d_gpu: host -> GPU per parameter updated on the GPU (fp32 master, moments, gradient).
        d2h_gpu: GPU -> host per parameter updated on the GPU (the updated state, plus the
            16-bit parameter when parameters live on the host).
        hbm_gpu: HBM bytes per parameter of GPU Adam.
        h2d_cpu: host -> GPU per parameter updated on the CPU (its 16-bit parameter when
            parameters live on the GPU, else 0).
        gpu_buffer: GPU bytes one sub-group's state occupies while it is on the GPU, per parameter.
    """

    h2d_gpu: float
    d2h_gpu: float
    hbm_gpu: float
    h2d_cpu: float
    gpu_buffer: float


@dataclass(frozen=True)
class SplitPlan:
    """The decision for one iteration.

    Attributes:
        gpu_groups: sub-groups updated on the GPU.
        buffers: GPU sub-group buffers in flight at once (0 when nothing goes to the GPU).
        predicted_step_s: the model's step estimate for that choice.
        cpu_only_step_s: the model's estimate with every sub-group on the CPU.
    """

    gpu_groups: int
    buffers: int
    predicted_step_s: float
    cpu_only_step_s: float


def estimate_step_s(n_gpu: int, n_groups: int, group_params: float, rates: SplitRates,
                    b: SplitBytes) -> float:
    """Estimated optimizer step, seconds, with ``n_gpu`` of ``n_groups`` sub-groups on the GPU."""
    n_cpu = n_groups - n_gpu
    h2d_bytes = group_params * (n_gpu * b.h2d_gpu + n_cpu * b.h2d_cpu)
    d2h_bytes = group_params * n_gpu * b.d2h_gpu
    duplex = rates.duplex_efficiency if h2d_bytes > 0 and d2h_bytes > 0 else 1.0
    busiest = max(
        n_cpu * group_params / rates.cpu_params_per_s,
        h2d_bytes / (rates.h2d_bytes_per_s * duplex),
        d2h_bytes / (rates.d2h_bytes_per_s * duplex),
        n_gpu * group_params * b.hbm_gpu / rates.hbm_bytes_per_s,
    )
    if n_gpu == 0:
        return busiest
    # the last GPU sub-group still updates and returns after the link has sent it
    tail = group_params * (b.hbm_gpu / rates.hbm_bytes_per_s + b.d2h_gpu / rates.d2h_bytes_per_s)
    return busiest + tail


def gpu_buffers(free_gpu_bytes: float, group_params: float, b: SplitBytes, max_buffers: int) -> int:
    """Sub-group buffers that fit in the GPU memory left free after backward (at most ``max_buffers``)."""
    per_group = group_params * b.gpu_buffer
    if per_group <= 0:
        return max_buffers
    return max(0, min(max_buffers, int(free_gpu_bytes // per_group)))


def plan_split(n_groups: int, group_params: float, rates: SplitRates, b: SplitBytes,
               free_gpu_bytes: float, max_buffers: int = 3) -> SplitPlan:
    """Pick how many sub-groups go to the GPU this iteration (the fastest estimate; ties go to
    fewer GPU sub-groups). None go when not one sub-group's state fits in free GPU memory."""
    cpu_only = estimate_step_s(0, n_groups, group_params, rates, b)
    buffers = gpu_buffers(free_gpu_bytes, group_params, b, max_buffers)
    if buffers == 0 or n_groups == 0:
        return SplitPlan(0, 0, cpu_only, cpu_only)
    best_n, best_s = 0, cpu_only
    for n in range(1, n_groups + 1):
        s = estimate_step_s(n, n_groups, group_params, rates, b)
        if s < best_s * (1 - 1e-9):
            best_n, best_s = n, s
    return SplitPlan(best_n, min(buffers, best_n), best_s, cpu_only)


def interleave(order: list[int], n_gpu: int) -> set[int]:
    """The sub-groups of ``order`` sent to the GPU: ``n_gpu`` of them spread evenly through the
    order, so GPU and CPU work on alternating stretches of the model (DOS's interleaving)."""
    n = len(order)
    if n_gpu <= 0:
        return set()
    return {order[min(n - 1, (k * n) // n_gpu)] for k in range(n_gpu)}


@dataclass
class PerfModelSplit:
    """Deep Optimizer States' decision, step by step: the option (sub-groups on the GPU, GPU
    buffers) of :func:`plan_split`, with the CPU's update rate carried over from the previous
    step as observed under that step's DRAM contention. Link rates stay the profile's: the
    simulation itself shares the link between the two paths, and a single copy's observed rate
    would count that sharing twice.

    Attributes:
        n_groups / group_params: the host sub-groups and their parameters each.
        rates: the rates the next decision uses (the profile's until a step is observed).
        split_bytes: bytes per parameter on each path.
        max_buffers: GPU buffers in flight at most.
        plans: every decision taken, in order.
    """

    n_groups: int
    group_params: float
    rates: SplitRates
    split_bytes: SplitBytes
    max_buffers: int
    plans: list[SplitPlan] = field(default_factory=list)

    def choose(self, iteration: int, gpu_free_bytes: float) -> Hashable:
        """(sub-groups on the GPU, buffers) for this step."""
        plan = plan_split(self.n_groups, self.group_params, self.rates, self.split_bytes, gpu_free_bytes,
                          self.max_buffers)
        self.plans.append(plan)
        return (plan.gpu_groups, plan.buffers)

    def observe(self, option: Hashable, stream_s: float) -> None:
        """The CPU updated the sub-groups not sent to the GPU in ``stream_s`` seconds."""
        n_gpu = option[0]  # type: ignore[index]
        params = (self.n_groups - n_gpu) * self.group_params
        if params > 0 and stream_s > 0:
            self.rates = replace(self.rates, cpu_params_per_s=params / stream_s)


def gap_on_gpu(n_groups: int, gap: int) -> list[bool]:
    """Per sub-group, whether the Deep Optimizer States artifact's fork updates it on the GPU with
    ``prefetch_optimizer_gap`` ``gap`` (DataStates/DeepSpeed deep-optimizer-states, 4570a955,
    stage3.py ``get_opt_update_device``: sub-group x is CPU-with-prefetch (``PF_OPT_CPU_PREF``)
    iff x % gap == 0, else GPU-only (``PF_OPT_GPU_ONLY``) iff (x + 1) % gap == 0, else CPU-only),
    for gap >= 2."""
    return [x % gap != 0 and (x + 1) % gap == 0 for x in range(n_groups)]


def gap_gpu_groups(n_groups: int, gap: int) -> int:
    """Sub-groups the fork updates on the GPU (:func:`gap_on_gpu`): the x < n_groups with
    (x + 1) % gap == 0, n_groups // gap of them."""
    return sum(gap_on_gpu(n_groups, gap))


def gap_gpu_share(groups: list[int], gap: int) -> float:
    """The share of the elements of ``groups`` (DeepSpeed's sub-groups, elements each, in order)
    that the fork updates on the GPU (:func:`gap_on_gpu`); unequal sub-groups make it differ from
    ``1 / gap`` (the artifact's 7B: 63 % at gap 2, its fused QKV and SwiGLU fc1 falling on odd
    sub-groups)."""
    total = sum(groups)
    on_gpu = gap_on_gpu(len(groups), gap)
    return sum(p for p, g in zip(groups, on_gpu, strict=True) if g) / total if total > 0 else 0.0


def interleave_layout(on_gpu: list[bool]) -> list[int]:
    """The positions at which to lay sub-groups out so that :func:`interleave` over the order
    0..n-1, choosing ``sum(on_gpu)`` of them, picks exactly those with ``on_gpu`` true, each side
    keeping its own order: ``layout[position]`` is the sub-group placed there."""
    n, n_gpu = len(on_gpu), sum(on_gpu)
    picked = interleave(list(range(n)), n_gpu)
    gpu = iter(x for x in range(n) if on_gpu[x])
    cpu = iter(x for x in range(n) if not on_gpu[x])
    return [next(gpu) if pos in picked else next(cpu) for pos in range(n)]


@dataclass
class GapSplit:
    """The artifact fork's fixed split (:func:`gap_gpu_groups`), the same every step, with one
    GPU sub-group in flight: the fork prefetches the next GPU-only sub-group's state into one set
    of GPU tensors (``prefetch_optimizer_gpu_fp32_params``, ``..._momentum``, ``..._variance``)
    while it updates a CPU-with-prefetch one, and waits for that copy before the GPU update."""

    n_groups: int
    gap: int

    def choose(self, iteration: int, gpu_free_bytes: float) -> Hashable:
        """(sub-groups on the GPU, buffers): fixed by the gap."""
        n = gap_gpu_groups(self.n_groups, self.gap)
        return (n, min(1, n))

    def observe(self, option: Hashable, stream_s: float) -> None:
        """Nothing: the fork's rule does not look at rates."""


@dataclass(frozen=True)
class ForkHostState:
    """The fork's optimizer state in host memory, bytes per rank (DataStates/DeepSpeed
    deep-optimizer-states 4570a955, stage3.py).

    Attributes:
        pinned_state_bytes: every sub-group's fp32 master, momentum and variance, each its own
            pinned tensor (``_create_fp32_partitions`` with ``prefetch_optimizer``:
            ``fp32_partitioned_groups_flat[i].pin_memory()``,
            ``prefetch_optimizer_fp32_momentums[i] = torch.empty(n).pin_memory()``, the same for
            the variances), each rounded up by PyTorch's caching host allocator.
        pinned_lp_bytes: ``gap - 1`` pinned 16-bit buffers of the largest sub-group
            (``prefetch_optimizer_cpu_fp16_pinned_params``, which ``downsample_fp32_fp16``
            casts the CPU-updated sub-groups into before their H2D).
        cpu_moments_bytes: DeepSpeedCPUAdam's own moments, made at the first step
            (ops/adam/cpu_adam.py ``step``: ``torch.zeros_like``, pageable) for the sub-groups
            it updates, those not on the GPU.
        gpu_resident_bytes: the last GPU-only sub-group's fp32 parameters, gradient, momentum and
            variance, left on the GPU after the step (``prefetch_optimizer_gpu_fp32_params``
            with its ``.grad``, ``..._momentum``, ``..._variance`` stay referenced until the next
            step's first GPU-only sub-group replaces them; the 7B log: 15.35 GiB allocated after
            the step against vanilla's 12.28, 3.07 GiB = 206.05M x 16 B).
    """

    pinned_state_bytes: float
    pinned_lp_bytes: float
    cpu_moments_bytes: float
    gpu_resident_bytes: float


def fork_host_state(groups: list[int], gap: int, master_bytes: float, moment_bytes: float, lp_bytes: float,
                    round_pinned: Callable[[float], float]) -> ForkHostState:
    """:class:`ForkHostState` of the fork's sub-groups ``groups`` (elements each, in order) with
    ``prefetch_optimizer_gap`` ``gap``: ``master_bytes``, ``moment_bytes`` (each moment),
    ``lp_bytes`` per element; ``round_pinned`` the pinned allocator's rounding of one request."""
    on_gpu = gap_on_gpu(len(groups), gap)
    pinned = sum(round_pinned(p * master_bytes) + 2 * round_pinned(p * moment_bytes) for p in groups)
    lp = (gap - 1) * round_pinned(max(groups, default=0) * lp_bytes)
    cpu = sum(p for p, g in zip(groups, on_gpu, strict=True) if not g) * 2 * moment_bytes
    last = max((k for k, g in enumerate(on_gpu) if g), default=None)
    resident = 0.0 if last is None else groups[last] * (2 * master_bytes + 2 * moment_bytes)
    return ForkHostState(pinned, lp, cpu, resident)
