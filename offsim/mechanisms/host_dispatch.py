"""Host dispatch: the GPU runs a unit's kernels only after the host thread has issued them.

In PyTorch's eager mode one Python thread issues every kernel; CUDA runs them asynchronously, so
the host runs ahead of the GPU and the GPU waits only where the host has not yet issued the next
unit (PyTorch: Paszke et al., NeurIPS 2019, Sec. 5.3 "separate control and data flow"). Under
DeepSpeed ZeRO-3 the host also runs, per submodule and per pass, the hooks that gather and release
its parameters: ``parameter_offload.py`` ``_register_hooks_recursively`` puts a forward-pre hook
(``pre_sub_module_forward_function`` -> ``partitioned_param_coordinator.py`` ``trace_prologue``,
``record_module`` while recording, ``fetch_sub_module``), a forward hook (``release_sub_module``)
and two autograd functions (pre/post backward) on every submodule; with one rank
``all_gather_coalesced`` returns a ``NoGatherCoalescedHandle`` whose ``wait`` synchronizes the
(idle) all-gather stream, so the fetch is host work only (DeepSpeed v0.13.3 and edaa722126).

A unit's host time is the strategy's ``zero3_submodule_host_s`` times its submodules (the hooks
and the submodule's own kernel launches). No public measurement of that per-submodule time was
found, so it is 0 unless set: PyTorch's own per-module cost without DeepSpeed's hooks is about
3-10 us (pytorch/pytorch PR #50431, Feb 2021: 9.7 us per ``nn.Linear`` call, 3.1 us per empty
module, 0.9 us per bare op), a lower bound only.

The chain, per pass, with host times ``h_k`` and GPU times ``g_k`` of its units in order, the host
starting when the GPU has drained (DeepSpeed's forward starts after a device synchronize,
``engine.py`` ``forward`` -> ``tput_timer.start()``)::

    host_end_k = host_end_(k-1) + h_k
    gpu_end_k  = max(gpu_end_(k-1), host_end_k) + g_k

:func:`dispatch_chain` computes it in closed form (the plan side); :class:`HostDispatched` adds
it to a compute mechanism's ops (a host-thread stream whose ops the compute stream waits for).
One limit of the engine as it is: its program counter is the compute stream, so the host runs
one layer ahead, not freely (:meth:`HostDispatched._issue`). The host's issue is recorded as a
``host`` span (``engine/execute.py`` ``HOST``), not as GPU work.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from offsim.core.enums import Activity, MechanismId, Phase, StreamKind, TensorKind
from offsim.mechanisms.base import BlockBuilder, Need, Setup, Site, SiteKind, Stage, tag
from offsim.mechanisms.compute import COMPUTE, Compute
from offsim.schedule.ops import CUR_MB, Delay, Join, StreamSpec, Tag, TensorRef, Wait

#: the host thread that issues the compute stream's kernels (and runs ZeRO-3's hooks)
HOST_DISPATCH = "host_dispatch"


@dataclass(frozen=True)
class DispatchUnit:
    """One unit of a pass: host seconds to issue it, then GPU seconds of its kernels."""

    host_s: float
    gpu_s: float


@dataclass(frozen=True)
class DispatchChain:
    """A pass's dispatch chain.

    Attributes:
        time_s: from the host's start to the end of the last unit's kernels, seconds.
        host_s: the host's issue time summed, seconds.
        gpu_s: the GPU's kernel time summed, seconds.
    """

    time_s: float
    host_s: float
    gpu_s: float

    @property
    def gpu_wait_s(self) -> float:
        """Seconds the GPU waits for the host (the pass's time beyond its kernels)."""
        return self.time_s - self.gpu_s

    @property
    def launch_bound_share(self) -> float:
        """Share of the pass the GPU spends waiting for the host (0: compute-bound)."""
        return self.gpu_wait_s / self.time_s if self.time_s > 0 else 0.0


def dispatch_chain(units: Sequence[DispatchUnit]) -> DispatchChain:
    """The chain of ``units`` in order (module docstring): the last unit's GPU end."""
    host_end = gpu_end = 0.0
    for u in units:
        host_end += u.host_s
        gpu_end = max(gpu_end, host_end) + u.gpu_s
    return DispatchChain(gpu_end, host_end, sum(u.gpu_s for u in units))


def units(gpu_s: Sequence[float], submodules: Sequence[int], submodule_host_s: float) -> tuple[DispatchUnit, ...]:
    """Units of GPU seconds ``gpu_s`` with ``submodules`` each at ``submodule_host_s`` host
    seconds per submodule."""
    return tuple(DispatchUnit(n * submodule_host_s, g) for g, n in zip(gpu_s, submodules, strict=True))


def break_even_submodule_host_s(gpu_s: Sequence[float], submodules: Sequence[int], pass_s: float) -> float:
    """The per-submodule host seconds at which the chain of ``gpu_s`` and ``submodules`` takes
    ``pass_s`` (a diagnostic: how slow the host must be for a measured pass; bisection, the chain
    grows monotonically with the host time). 0 when the kernels alone take ``pass_s`` or more."""
    if dispatch_chain(units(gpu_s, submodules, 0.0)).time_s >= pass_s:
        return 0.0
    lo, hi = 0.0, pass_s / max(1, min(n for n in submodules if n > 0))
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if dispatch_chain(units(gpu_s, submodules, mid)).time_s < pass_s else (lo, mid)
    return (lo + hi) / 2


@dataclass(frozen=True)
class HostDispatched:
    """``inner``'s kernels, each layer's issued by the host thread first.

    Attributes:
        inner: the compute mechanism whose forward and backward kernels the host issues.
        forward_host_s / backward_host_s: host seconds per layer (in layer order) before the
            layer's forward, and before its backward (recompute included), can run on the GPU.
    """

    inner: Compute
    forward_host_s: tuple[float, ...]
    backward_host_s: tuple[float, ...]
    id: MechanismId = MechanismId.COMPUTE

    def footprint(self) -> tuple[Need, ...]:
        return self.inner.footprint()

    def setup(self) -> Setup:
        inner = self.inner.setup()
        return Setup((*inner.streams, StreamSpec(HOST_DISPATCH, StreamKind.CPU)), inner.pools, inner.caches,
                     inner.choices)

    def emit(self, b: BlockBuilder, site: Site, stage: Stage) -> None:
        if stage is Stage.RUN and site.what in (SiteKind.FORWARD, SiteKind.BACKWARD):
            self._issue(b, site)
        self.inner.emit(b, site, stage)

    def _issue(self, b: BlockBuilder, site: Site) -> None:
        """The compute stream's wait for the host's issue of ``site``'s layer, and the host's
        issue of the pass's next layer while the GPU runs this one.

        The engine's program counter is the compute stream (ops after one of its ops are issued
        when it finishes), so the host runs one layer ahead of the GPU, not freely ahead: exact
        when every layer's host time is at most the previous layer's GPU time (the GPU never
        waits, as in :func:`dispatch_chain`) or when the host is the slower everywhere (it never
        idles); in between the host starts a layer late by up to the GPU's lead. A pass starts
        when the compute stream reaches it (forward: DeepSpeed's device synchronize at the
        forward's start; backward: taken the same)."""
        forward = site.what is SiteKind.FORWARD
        host_s = self.forward_host_s if forward else self.backward_host_s
        t = tag(Activity.HOST_SETUP, self.id, Phase.FORWARD if forward else Phase.BACKWARD, site.layer,
                label="host issue (ZeRO-3 hooks, launches)")
        if site.position == 0:
            self._host(b, t, host_s, site.layer, after=[b.add(Join(), t, COMPUTE)])
        b.add(Join(), t, COMPUTE, reads=(issued(site.layer),), stall=Wait("host dispatch"))
        following = site.layer + 1 if forward else site.layer - 1
        if 0 <= following < len(host_s):
            self._host(b, t, host_s, following)

    @staticmethod
    def _host(b: BlockBuilder, t: Tag, host_s: tuple[float, ...], layer: int, after: Sequence[int] = ()) -> None:
        b.add(Delay(host_s[layer]), replace(t, layer=layer), HOST_DISPATCH, after=after, writes=(issued(layer),))


#: the ``group`` of :func:`issued` (no optimizer sub-group has it)
ISSUED_GROUP = -20


def issued(layer: int) -> TensorRef:
    """The host's issue of ``layer``'s kernels in the current micro-batch (what the compute
    stream waits for)."""
    return TensorRef(TensorKind.WORKSPACE, unit=layer, group=ISSUED_GROUP, mb=CUR_MB)
