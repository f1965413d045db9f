"""GreedySnake (Yue, Yin, Qian, arXiv 2512.17570; code ``npz7yyk/FlexTrain`` @ f855b6ef19):
SSD-offloaded training with gradient accumulation scheduled *vertically*: every micro-batch of a
unit (``checkpoint_interval`` layers) runs before the next unit, in snake order (the micro-batch
order reverses every unit; the last unit runs forward, loss and backward per micro-batch), so
each unit's parameters cross PCIe once in forward and once in backward per iteration whatever
the number of micro-batches M is, and its gradients accumulate on the GPU over the M
micro-batches in an fp32 unit buffer before one D2H (new_systems.md §3, "How it moves tensors").

Mechanisms: the standard ones (parameter fetch from CPU or NVMe, compute with recompute from the
unit checkpoint, per-micro-batch checkpoint offload, the layer-wise CPU optimizer with NVMe swap
of its state as each layer's gradient arrives) in unit-major snake order
(:class:`~offsim.systems._compile.WorkOrder`), with the fetch-once-per-visit and GPU gradient
accumulation it shares with Harmony (:mod:`offsim.mechanisms.unit_visit`, in fp32: 4 B per
parameter, FlexTrain's fp32 accumulation); its host buffers are its own (:func:`host_state`: no
whole-model host gradient buffer, no DeepSpeed swapper buffers) and its activation memory grows
with M (every micro-batch's checkpoints wait for backward).

Not modelled (say so in comparisons): the share ``alpha`` of the optimizer step deferred into the
next iteration's forward (here the whole step runs during backward, layer by layer, as gradients
arrive: GreedySnake's (1 - alpha) part, with alpha = 0); the per-micro-batch slicing of a unit's
parameter fetch across the previous unit's micro-batches (the layer-wise prefetch of the next
unit stands for it); the activation-gradient round trips between units (the inter-unit gradient
stays on the GPU); the three-tier fractions per data kind and the LP search (placement is the
strategy's, whole tiers).

Shipped strategies: greedysnake. Of the system options it accepts ``OPTIONS``; its own
(``system_options:``): :class:`Options`.
"""

from __future__ import annotations

from dataclasses import replace

from pydantic import Field

from offsim.config.base import Frozen
from offsim.config.run import RunConfig
from offsim.core.enums import Tier
from offsim.mechanisms.static_state import StaticItem, StaticState
from offsim.mechanisms.unit_visit import visit_mechanisms
from offsim.plan import footprint as fp
from offsim.plan.footprint import StateSizes
from offsim.systems._compile import OrderKind, System, WorkOrder
from offsim.systems._options import read_options
from offsim.systems._parts import Ctx, Variants, build_ctx, standard, static_state, whole

#: always the layer-wise CPU update (``Variants.layerwise_update``), so no shared option is its own
OPTIONS: frozenset[str] = frozenset(())

#: FlexTrain accumulates gradients in an fp32 unit buffer (``mixed_precision``: fp32 accumulation)
ACC_BYTES_PER_PARAM = 4.0


class Options(Frozen):
    """GreedySnake's own knobs (FlexTrain config names, new_systems.md §3 "Knobs")."""

    #: layers per unit (``checkpoint_interval``, default 1)
    checkpoint_interval: int = Field(1, ge=1)
    #: reverse the micro-batch order every unit (the "snake"); False: plain vertical order
    snake: bool = True


def host_state(c: Ctx, unit_layers: int) -> StaticState:
    """The start-up state with GreedySnake's host buffers in place of DeepSpeed's: no whole-model
    host gradient buffer and none of DeepSpeed ZeRO-3's swapper and flat gradient buffers
    (:func:`offsim.plan.footprint.deepspeed_host_init`); instead the pinned staging buffers the
    strategy names (parameter reads) and two fp32 unit gradient buffers (new_systems.md §3
    "Memory": staging of 2 gradient buffers per unit; the optimizer's per-layer swap buffers are
    the layer-wise update's own)."""
    base = static_state(c)
    dropped = {"grads (optimizer format)"} | {s.what for s in fp.deepspeed_host_init(c.cfg, c.sz)}
    items = [i for i in base.items if i.what not in dropped]
    st = c.st
    if fp.deepspeed_zero3_offload(c.cfg) and st.needs_staging_buffers():
        nbytes = st.pinned_buffer_count * fp.round_pinned(st.pinned_buffer_bytes, st.host_allocator)
        items.append(StaticItem(Tier.HOST_PINNED, whole(nbytes), "pinned staging buffers"))
    unit_params = max(sum(lay.params for lay in c.layers[lo:lo + unit_layers])
                      for lo in range(0, len(c.layers), unit_layers))
    grad_staging = 2 * unit_params / c.sz.grad_part * ACC_BYTES_PER_PARAM
    items.append(StaticItem(c.host, whole(grad_staging), "gradient staging (2 fp32 unit buffers)"))
    return replace(base, items=tuple(items))


def compose(cfg: RunConfig, sz: StateSizes | None = None) -> System:
    """The standard mechanisms with the layer-wise CPU update (GreedySnake steps each unit as its
    gradient arrives, two units behind backward: FlexTrain ``flextrain/optimizer.py``), in
    unit-major snake order."""
    opts = read_options(cfg.strategy, Options)
    c = build_ctx(cfg, sz, Variants(layerwise_update=True))
    acc = tuple(whole(lay.params / c.sz.param_part * ACC_BYTES_PER_PARAM) for lay in c.layers)
    base = standard(c)
    mechs = {**visit_mechanisms(base.mechanisms, base.micro_batches, acc),
             "static": host_state(c, opts.checkpoint_interval)}
    order = WorkOrder(OrderKind.UNIT_MAJOR, opts.checkpoint_interval, opts.snake)
    return replace(base, mechanisms=mechs, order=order)  # type: ignore[arg-type]
