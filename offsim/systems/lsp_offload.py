"""LSP-Offload (Chen et al., AAAI 2025, arXiv 2406.10181, Sec. 3-4): gradients projected on
the GPU to a fraction of their size before the copy to the host, and a layer-wise CPU update
of the projected parameters overlapped with backward.

Mechanisms: compute, activations, gradients with projection (``grad_compression_ratio``,
``grad_compression_flop_per_param``) and the layer-wise CPU update.

Shipped strategies: lsp-offload. The behaviour is carried by the strategy's knobs, which the
shared builders of :mod:`offsim.systems._parts` read, so a knob a user or a sweep sets keeps working.
"""

from offsim.systems._parts import standard_system as compose

__all__ = ["compose"]
