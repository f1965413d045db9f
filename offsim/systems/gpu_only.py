"""No offload: parameters, gradients, optimizer state and activations in GPU memory, Adam on
the GPU (mixed precision, Micikevicius et al., ICLR 2018; ZeRO stage 0, arXiv 1910.02054).

Mechanisms: compute, activations kept on the GPU, gradients reduced on the GPU, the GPU
optimizer step; no parameter fetch.

Shipped strategies: gpu-only. The behaviour is carried by the strategy's knobs, which the
shared builders of :mod:`offsim.systems._parts` read, so a knob a user or a sweep sets keeps working.
"""

from offsim.systems._parts import standard_system as compose

__all__ = ["compose"]
