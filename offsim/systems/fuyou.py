"""Fuyou / LoHan (Liao et al., arXiv 2403.06504): parameters and optimizer state on NVMe, the
CPU Adam of each layer overlapped with the rest of backward, activations swapped to NVMe for
an amount chosen by its search (:mod:`offsim.search.swap_amount`), the rest recomputed.

Mechanisms: parameter fetch, compute, activations (swap and recompute per block), gradients
with the layer-wise CPU update, no separate step.

Shipped strategies: fuyou. The behaviour is carried by the strategy's knobs, which the
shared builders of :mod:`offsim.systems._parts` read, so a knob a user or a sweep sets keeps working.
"""

from offsim.systems._parts import standard_system as compose

__all__ = ["compose"]
