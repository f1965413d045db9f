"""ZeRO-Offload (Ren et al., USENIX ATC 2021, arXiv 2101.06840, Sec. 4): ZeRO-2 with the optimizer
state and its step on the CPU; 16-bit gradients go to the host during backward, updated 16-bit
parameters come back after the CPU step. ``delayed_param_update`` is its one-step delayed
parameter update (Sec. 4.3, ``zero-offload-dpu``).

Mechanisms: compute, activations, gradient offload, the CPU optimizer per sub-group (its
upload and, with DPU, its overlap with the next iteration).

Shipped strategies: zero-offload, zero-offload-dpu. The shared knobs (placement, ZeRO stage, buffers...) keep working
under it; of the system options (:data:`~offsim.config.strategy.SYSTEM_OPTIONS`) it accepts
``OPTIONS``.
"""

from offsim.config.run import RunConfig
from offsim.plan.footprint import StateSizes
from offsim.systems._compile import System
from offsim.systems._parts import standard_system

OPTIONS: frozenset[str] = frozenset({"delayed_param_update", "lp_copy"})


def compose(cfg: RunConfig, sz: StateSizes | None = None) -> System:
    """The standard ZeRO-2 offload mechanisms; the CPU step delayed one iteration with DPU."""
    return standard_system(cfg, sz)
