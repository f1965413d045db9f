"""LSP-Offload (Chen et al., AAAI 2025, arXiv 2406.10181, Sec. 3-4): gradients projected on
the GPU to a fraction of their size before the copy to the host, and a layer-wise CPU update
of the projected parameters overlapped with backward.

Mechanisms: compute, activations, gradients with projection (``grad_compression_ratio``,
``grad_compression_flop_per_param``) and the layer-wise CPU update.

Shipped strategies: lsp-offload. The shared knobs (placement, ZeRO stage, buffers...) keep working
under it; of the system options (:data:`~offsim.config.strategy.SYSTEM_OPTIONS`) it accepts
``OPTIONS``.
"""

from offsim.config.run import RunConfig
from offsim.plan.footprint import StateSizes
from offsim.systems._compile import System
from offsim.systems._parts import Variants, standard_system

OPTIONS: frozenset[str] = frozenset({"optimizer_schedule", "grad_compression_ratio", "grad_compression_flop_per_param"})


def compose(cfg: RunConfig, sz: StateSizes | None = None) -> System:
    """The standard mechanisms with projected gradients and the layer-wise CPU update."""
    st = cfg.strategy
    return standard_system(cfg, sz, Variants(layerwise_update=st.optimizer_schedule == "layerwise",
                                             grad_compression_ratio=st.grad_compression_ratio,
                                             grad_compression_flop_per_param=st.grad_compression_flop_per_param))
