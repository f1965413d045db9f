"""ZeRO-Infinity (Rajbhandari et al., SC 2021, arXiv 2104.07857, Sec. 5-6): ZeRO-3 with
parameters and optimizer state offloaded to CPU DRAM or NVMe; each layer's parameters are
gathered before use (prefetch bounded by the live-parameter and reuse-distance knobs), the
optimizer steps per sub-group with NVMe swap, DeepSpeed's host buffers set up at start.

Mechanisms: parameter fetch, compute, activations, gradient offload, the CPU optimizer with
its NVMe swap (and a DRAM cache when the strategy gives one), DeepSpeed's host state.

Shipped strategies: zero-infinity-cpu, zero-infinity-nvme. The behaviour is carried by the strategy's knobs, which the
shared builders of :mod:`offsim.systems._parts` read, so a knob a user or a sweep sets keeps working.
"""

from offsim.systems._parts import standard_system as compose

__all__ = ["compose"]
