"""TBA / SSDTrain (Wu et al., arXiv 2408.10013, DAC 2025, Sec. III-IV): activations offloaded to
NVMe (GPUDirect Storage where the profile has it) and prefetched back in reverse order for
backward; model state on the GPU.

Mechanisms: compute, activations offloaded to storage (``gpudirect_storage``), gradients and
the optimizer on the GPU.

Shipped strategies: tba-ssdtrain. The behaviour is carried by the strategy's knobs, which the
shared builders of :mod:`offsim.systems._parts` read, so a knob a user or a sweep sets keeps working.
"""

from offsim.systems._parts import standard_system as compose

__all__ = ["compose"]
