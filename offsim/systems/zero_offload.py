"""ZeRO-Offload (Ren et al., USENIX ATC 2021, arXiv 2101.06840, Sec. 4): ZeRO-2 with the optimizer
state and its step on the CPU; 16-bit gradients go to the host during backward, updated 16-bit
parameters come back after the CPU step. ``delayed_param_update`` is its one-step delayed
parameter update (Sec. 4.3, ``zero-offload-dpu``).

Mechanisms: compute, activations, gradient offload, the CPU optimizer per sub-group (its
upload and, with DPU, its overlap with the next iteration).

Shipped strategies: zero-offload, zero-offload-dpu. The behaviour is carried by the strategy's knobs, which the
shared builders of :mod:`offsim.systems._parts` read, so a knob a user or a sweep sets keeps working.
"""

from offsim.systems._parts import standard_system as compose

__all__ = ["compose"]
