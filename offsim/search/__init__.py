"""Automatic configuration searches that use offsim itself as the cost model.

:mod:`offsim.search.protrain` searches ProTrain's few knobs (Yang et al., arXiv 2406.08334):
persistent chunks, prefetch depth, blocks that swap or recompute their activations.
:mod:`offsim.search.swap_amount` chooses Fuyou's activation swap amount.

The names below are imported from :mod:`offsim.search.protrain` when first used, so that a run,
which imports only the swap-amount search, does not import the ProTrain search (issue 16).
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from offsim.search.protrain import Candidate, Grid, Knobs, SearchResult, apply_knobs, search

__all__ = ["Candidate", "Grid", "Knobs", "SearchResult", "apply_knobs", "search"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(import_module("offsim.search.protrain"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
