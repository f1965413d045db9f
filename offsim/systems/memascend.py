"""MemAscend (Liaw and Chen, 2025, arXiv 2505.23254): ZeRO-Infinity's NVMe offload with its host
memory fixes: exact-size pinned buffers, an adaptive parameter pool, pinned allocation without
copies, a fused overflow check.

Mechanisms: those of ZeRO-Infinity, with the host-state knobs (``host_allocator``,
``param_swap_pool``, ``pin_by_copy``, ``overflow_check``) set to MemAscend's.

Shipped strategies: memascend. The behaviour is carried by the strategy's knobs, which the
shared builders of :mod:`offsim.systems._parts` read, so a knob a user or a sweep sets keeps working.
"""

from offsim.systems._parts import standard_system as compose

__all__ = ["compose"]
