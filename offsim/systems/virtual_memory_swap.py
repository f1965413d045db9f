"""Harmony's virtualised-memory baseline (Li et al., VLDB 2022, arXiv 2202.01306, Sec. 1-2):
data parallel, each GPU swapping its own full model replica through host memory over links
the GPUs share.

Mechanisms: parameter fetch of whole replicas (``replicated_param_swap``), compute,
activations, gradients, the CPU optimizer.

Shipped strategies: virtual-memory-swap. The behaviour is carried by the strategy's knobs, which the
shared builders of :mod:`offsim.systems._parts` read, so a knob a user or a sweep sets keeps working.
"""

from offsim.systems._parts import standard_system as compose

__all__ = ["compose"]
