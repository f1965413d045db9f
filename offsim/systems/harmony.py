"""Harmony (Li et al., VLDB 2022, arXiv 2202.01306): each byte swapped over the host links
once, GPU-to-GPU transfers instead of replicated swaps, the CPU optimizer per layer.

Mechanisms: parameter fetch without collectives (replicated swap off), compute, activations,
gradients with the layer-wise CPU update. Its layer-pack micro-batch grouping is not
expressed yet (a strict expected failure in ``tests/test_systems_harmony.py``).

Shipped strategies: harmony. The behaviour is carried by the strategy's knobs, which the
shared builders of :mod:`offsim.systems._parts` read, so a knob a user or a sweep sets keeps working.
"""

from offsim.systems._parts import standard_system as compose

__all__ = ["compose"]
