"""SuperOffload (DeepSpeed blog; ``../shared/reference/offload_systems.md``): on a superchip, the
CPU optimizer overlapped with backward layer by layer over NVLink-C2C.

Mechanisms: compute, activations, gradients with the layer-wise CPU update.

Shipped strategies: superoffload. The behaviour is carried by the strategy's knobs, which the
shared builders of :mod:`offsim.systems._parts` read, so a knob a user or a sweep sets keeps working.
"""

from offsim.systems._parts import standard_system as compose

__all__ = ["compose"]
