"""ProTrain (Yang et al., arXiv 2406.08334): persistent and prefetched parameter chunks in
pinned DRAM, the persistent chunks' state updated on the GPU, the others' CPU Adam per chunk
overlapped with backward, block-wise activation recompute; its knobs come from a search
(:mod:`offsim.search.protrain`, ``offsim tune``).

Mechanisms: parameter fetch (persistent layers kept by a static eviction policy), compute,
activations, gradients with the layer-wise update (GPU Adam for the persistent share).

Shipped strategies: protrain. The behaviour is carried by the strategy's knobs, which the
shared builders of :mod:`offsim.systems._parts` read, so a knob a user or a sweep sets keeps working.
"""

from offsim.systems._parts import standard_system as compose

__all__ = ["compose"]
