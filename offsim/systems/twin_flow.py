"""ZeRO-Offload++ Twin-Flow (DeepSpeed blog, 2023): ZeRO-3 with a share of the optimizer state
(``optimizer_gpu_fraction``; DeepSpeed ``offload_optimizer.ratio`` is one minus it) on the
GPU, updated there while the CPU updates the rest.

Mechanisms: compute, activations, gradient offload of the CPU share, the CPU optimizer with
its GPU-resident share.

Shipped strategies: twin-flow. The behaviour is carried by the strategy's knobs, which the
shared builders of :mod:`offsim.systems._parts` read, so a knob a user or a sweep sets keeps working.
"""

from offsim.systems._parts import standard_system as compose

__all__ = ["compose"]
