"""Automatic configuration searches that use offsim itself as the cost model.

:mod:`offsim.search.protrain` searches ProTrain's few knobs (Yang et al., arXiv 2406.08334):
persistent chunks, prefetch depth, blocks that swap or recompute their activations.
"""

from offsim.search.protrain import Candidate, Grid, Knobs, SearchResult, apply_knobs, search

__all__ = ["Candidate", "Grid", "Knobs", "SearchResult", "apply_knobs", "search"]
