"""Harmony (Li et al., VLDB 2022, arXiv 2202.01306): each byte swapped over the host links
once, GPU-to-GPU transfers instead of replicated swaps, the CPU optimizer per layer.

Mechanisms: parameter fetch without collectives (replicated swap off), compute, activations,
gradients with the layer-wise CPU update. Its layer-pack micro-batch grouping is not
expressed yet (a strict expected failure in ``tests/test_systems_harmony.py``).

Shipped strategies: harmony. The shared knobs (placement, ZeRO stage, buffers...) keep working
under it; of the system options (:data:`~offsim.config.strategy.SYSTEM_OPTIONS`) it accepts
``OPTIONS``.
"""

from offsim.config.run import RunConfig
from offsim.plan.footprint import StateSizes
from offsim.systems._compile import System
from offsim.systems._parts import Variants, standard_system

OPTIONS: frozenset[str] = frozenset({"optimizer_schedule"})


def compose(cfg: RunConfig, sz: StateSizes | None = None) -> System:
    """The standard mechanisms with the layer-wise CPU update."""
    return standard_system(cfg, sz, Variants(layerwise_update=cfg.strategy.optimizer_schedule == "layerwise"))
