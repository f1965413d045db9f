"""The mechanisms' arguments from a strategy's shared knobs, and the standard composition.

The system files of this package (one per published system) build their mechanisms here:
each builder reads the knobs every system shares (placement, ZeRO stage, buffers, bucket
sizes...) and returns a mechanism with its numbers computed once (bytes rounded to integers
here, at compile time). The variants one published system introduced are not knobs here: the
system file says which it composes (:class:`Variants`), and a system's own pieces live in its
file (GPUDirect activations in :mod:`~offsim.systems.tba_ssdtrain`, NVMe/PFS striping in
:mod:`~offsim.systems.mlp_offload`, the run-time split in
:mod:`~offsim.systems.deep_optimizer_states`). :func:`standard` composes them along the
standard order.
"""

from __future__ import annotations

from dataclasses import dataclass

from offsim.config.run import RunConfig
from offsim.mechanisms.base import SiteKind, Stage
from offsim.mechanisms.cpu_optimizer import CpuOptimizer, GpuSplit
from offsim.plan import footprint as fp
from offsim.systems._compile import System
from offsim.systems._ctx import Ctx, NvmeActivations, StorageBuilder, Variants, build_ctx, whole
from offsim.systems._part_fetch import (
    AUTO_HEADROOM,
    activations,
    auto_param_budget_bytes,
    compute,
    fixed_param_budget_bytes,
    param_fetch,
    within_budget,
)
from offsim.systems._part_grads import SWAP_UNIT_BYTES, grads
from offsim.systems._part_optimizer import _step_period, gpu_adam_bpp, optimizer, optimizer_dram_bpp, storage, subgroups
from offsim.systems._part_static import static_state

__all__ = ["AUTO_HEADROOM", "SWAP_UNIT_BYTES", "Ctx", "NvmeActivations", "StorageBuilder", "Variants", "activations",
           "auto_param_budget_bytes", "build_ctx", "compute", "fixed_param_budget_bytes", "gpu_adam_bpp", "grads",
           "optimizer", "optimizer_dram_bpp", "param_fetch", "standard", "standard_system", "static_state", "storage",
           "subgroups", "whole", "within_budget"]


FORWARD_ORDER = (("params", Stage.ISSUE), ("params", Stage.WAIT), ("activations", Stage.BEFORE),
                 ("compute", Stage.RUN), ("activations", Stage.AFTER), ("params", Stage.DONE))
BACKWARD_ORDER = (("params", Stage.ISSUE), ("activations", Stage.ISSUE), ("activations", Stage.WAIT),
                  ("params", Stage.WAIT), ("activations", Stage.BEFORE), ("compute", Stage.RUN),
                  ("activations", Stage.AFTER), ("grads", Stage.AFTER), ("params", Stage.DONE))


def standard(c: Ctx, split: GpuSplit | None = None, notes: tuple[str, ...] = ()) -> System:
    """The mechanisms ``c``'s knobs call for, in the standard order (``split``: the optimizer's
    run-time GPU split; ``notes``: what the system wants said about its schedule)."""
    opt = optimizer(c, split)
    fetch = param_fetch(c)
    mechs: dict[str, object] = {"static": static_state(c), "compute": compute(c), "activations": activations(c),
                                "grads": grads(c), "optimizer": opt,
                                "params": _Nothing() if fetch is None else fetch}
    if fetch is not None and c.st.policies.gpu_param_buffer_gib == "auto":
        others = [m for name, m in mechs.items() if name != "params"]
        mechs["params"] = within_budget(c, fetch, auto_param_budget_bytes(c, others))
    period = _step_period(opt.orders) if isinstance(opt, CpuOptimizer) else 1
    sites = {SiteKind.INIT: (("static", Stage.RUN),), SiteKind.FORWARD: FORWARD_ORDER,
             SiteKind.BACKWARD: BACKWARD_ORDER, SiteKind.ITERATION_END: (("params", Stage.DONE),),
             SiteKind.STEP: (("optimizer", Stage.RUN),)}
    return System(mechs, sites, len(c.layers), c.cfg.workload.training.grad_accumulation,  # type: ignore[arg-type]
                  c.cfg.iterations, period, notes, tuple(lay.name for lay in c.layers))


def standard_system(cfg: RunConfig, sz: fp.StateSizes | None = None, v: Variants = Variants()) -> System:
    """The standard composition with the variants ``v`` (``sz``: sizes other than the
    configuration's, for hand-built layers in tests)."""
    return standard(build_ctx(cfg, sz, v))


@dataclass(frozen=True)
class _Nothing:
    """A mechanism slot the strategy does not use (parameters resident on the GPU)."""

    def setup(self):
        from offsim.mechanisms.base import Setup
        return Setup()

    def emit(self, b, site, stage) -> None:
        return None

    def footprint(self) -> tuple:
        return ()
