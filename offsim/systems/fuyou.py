"""Fuyou / LoHan (Liao et al., arXiv 2403.06504): parameters and optimizer state on NVMe, the
CPU Adam of each layer overlapped with the rest of backward, activations swapped to NVMe for
an amount chosen by its search (:mod:`offsim.search.swap_amount`), the rest recomputed.

Mechanisms: parameter fetch, compute, activations (swap and recompute per block), gradients
with the layer-wise CPU update, no separate step.

Shipped strategies: fuyou. The shared knobs (placement, ZeRO stage, buffers...) keep working
under it; of the system options (:data:`~offsim.config.strategy.SYSTEM_OPTIONS`) it accepts
``OPTIONS``.
"""

from offsim.config.run import RunConfig
from offsim.plan.footprint import StateSizes
from offsim.systems._compile import System
from offsim.systems._parts import Variants, standard_system

OPTIONS: frozenset[str] = frozenset({"optimizer_schedule", "layerwise_grad_buffers"})


def compose(cfg: RunConfig, sz: StateSizes | None = None) -> System:
    """The standard mechanisms with the layer-wise CPU update (and its host gradient buffers)."""
    return standard_system(cfg, sz, Variants(layerwise_update=cfg.strategy.optimizer_schedule == "layerwise"))
