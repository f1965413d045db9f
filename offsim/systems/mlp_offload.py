"""MLP-Offload (Maurya et al., SC 2025, arXiv 2509.02480): optimizer state striped over NVMe
and a parallel file system with one transfer per path, an alternating sub-group order over a
DRAM cache, 16-bit gradients kept in host memory and converted at update time.

Mechanisms: those of ZeRO-Infinity, the optimizer's storage striped (``pfs_share``,
``io_concurrency``), the DRAM cache's order policy.

Shipped strategies: mlp-offload. The behaviour is carried by the strategy's knobs, which the
shared builders of :mod:`offsim.systems._parts` read, so a knob a user or a sweep sets keeps working.
"""

from offsim.systems._parts import standard_system as compose

__all__ = ["compose"]
