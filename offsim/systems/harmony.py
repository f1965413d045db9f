"""Harmony (Li et al., VLDB 2022, arXiv 2202.01306): each byte swapped over the host links
once, GPU-to-GPU transfers instead of replicated swaps, the CPU optimizer per layer, and
layer packs that run all micro-batches per swap-in.

Mechanisms: parameter fetch without collectives (replicated swap off), compute, activations,
gradients with the layer-wise CPU update; the order of work is unit-major
(:class:`~offsim.systems._compile.WorkOrder`): a layer pack runs forward (then backward) for
every micro-batch of the minibatch before the next pack (msr-fiddle/harmony
``3_scheduler/task_graph_composor.py``: one FWD / BWD task per pack over the list of
micro-batch sizes ``ubatchszs_fwd`` / ``ubatchszs_bwd``), so a pack's parameters are swapped in
once per pass and its gradients accumulate on the GPU over the micro-batches before they leave
(the visit's mechanisms, :mod:`offsim.mechanisms.unit_visit`, shared with GreedySnake).

Shipped strategies: harmony. The shared knobs (placement, ZeRO stage, buffers...) keep working
under it; of the system options (:data:`~offsim.config.strategy.SYSTEM_OPTIONS`) it accepts
``OPTIONS``; its own (``system_options:``): :class:`Options`.
"""

from __future__ import annotations

from dataclasses import replace

from pydantic import Field

from offsim.config.base import Frozen
from offsim.config.run import RunConfig
from offsim.mechanisms.unit_visit import visit_mechanisms
from offsim.plan.footprint import StateSizes
from offsim.systems._compile import OrderKind, System, WorkOrder
from offsim.systems._options import read_options
from offsim.systems._part_grads import without_gradient_hooks
from offsim.systems._parts import Variants, build_ctx, standard, whole

OPTIONS: frozenset[str] = frozenset({"optimizer_schedule"})


class Options(Frozen):
    """Harmony's own knobs."""

    #: layers per pack (Harmony's ``P``, msr-fiddle/harmony README "layer-pack size"; its search
    #: packs by memory, here a constant size as its manual mode does)
    layer_pack: int = Field(1, ge=1)


def unit_major(system: System, unit_layers: int, snake: bool = False, acc_bytes: tuple[int, ...] = ()) -> System:
    """``system`` in unit-major order (``unit_layers`` per unit, the micro-batch order reversed
    every unit when ``snake``) with the visit's mechanisms (:func:`visit_mechanisms`: parameters
    fetched once per visit, and with ``acc_bytes`` per layer and several micro-batches the
    gradients accumulated on the GPU over the visit)."""
    if acc_bytes and system.micro_batches > 1:  # the visit's sum leaves once, not from every micro-batch's hook
        system = without_gradient_hooks(system)
    mechs = visit_mechanisms(system.mechanisms, system.micro_batches, acc_bytes)
    order = WorkOrder(OrderKind.UNIT_MAJOR, unit_layers, snake)
    return replace(system, mechanisms=mechs, order=order)  # type: ignore[arg-type]


def compose(cfg: RunConfig, sz: StateSizes | None = None) -> System:
    """The standard mechanisms with the layer-wise CPU update, in layer-pack order."""
    opts = read_options(cfg.strategy, Options)
    c = build_ctx(cfg, sz, Variants(layerwise_update=cfg.strategy.optimizer_schedule == "layerwise"))
    acc = tuple(whole(lay.params * c.bpp_grad) for lay in c.layers)
    return unit_major(standard(c), opts.layer_pack, acc_bytes=acc)
