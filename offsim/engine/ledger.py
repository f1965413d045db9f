"""Memory accounted per tier over time.

Levels are kept per rank (the simulated GPU); host and NVMe are shared by the ranks of a node,
which run the same schedule, so their node level is the rank level times ``ranks_per_node``.
A level above capacity raises :class:`~offsim.errors.InfeasibleError` at the moment it happens.
"""

from __future__ import annotations

import simpy

from offsim.errors import InfeasibleError
from offsim.trace import Recorder

RANK_TIERS = ("gpu", "host_pinned", "host_pageable", "nvme", "pfs")


class MemoryLedger:
    """Bytes resident per tier, with peaks and level samples.

    Args:
        capacity: capacities of ``gpu`` (per rank), ``host_pinned``, ``host`` and ``nvme`` (per node).
        ranks_per_node: multiplier from rank levels to node levels for host and nvme.
    """

    def __init__(self, env: simpy.Environment, recorder: Recorder, capacity: dict[str, float],
                 ranks_per_node: int, nodes: int = 1) -> None:
        self.env = env
        self.recorder = recorder
        self.capacity = capacity
        self.ranks = ranks_per_node
        self.nodes = nodes
        self.rank_bytes = dict.fromkeys(RANK_TIERS, 0.0)
        self.peak = dict.fromkeys(("gpu", "host_pinned", "host", "nvme", "pfs"), 0.0)

    def node_levels(self) -> dict[str, float]:
        """Levels as reported: gpu per rank, the PFS for the whole job, the others per node;
        ``host`` includes pinned."""
        r = self.rank_bytes
        return {
            "gpu": r["gpu"],
            "host_pinned": r["host_pinned"] * self.ranks,
            "host": (r["host_pinned"] + r["host_pageable"]) * self.ranks,
            "nvme": r["nvme"] * self.ranks,
            "pfs": r["pfs"] * self.ranks * self.nodes,
        }

    def alloc(self, tier: str, nbytes: float, what: str) -> None:
        """Add ``nbytes`` to a rank tier; raise InfeasibleError if a node tier overflows."""
        if nbytes <= 0:
            return
        self.rank_bytes[tier] += nbytes
        self._update(what)

    def free(self, tier: str, nbytes: float) -> None:
        """Remove ``nbytes`` from a rank tier."""
        if nbytes <= 0:
            return
        self.rank_bytes[tier] = max(0.0, self.rank_bytes[tier] - nbytes)
        self._update("")

    def _update(self, what: str) -> None:
        levels = self.node_levels()
        for tier, level in levels.items():
            if level > self.capacity[tier] * (1 + 1e-9):
                scope = {"gpu": "per GPU", "pfs": "for the job"}.get(tier, "per node")
                raise InfeasibleError(tier, level, self.capacity[tier],
                                      f"{scope}, at t={self.env.now:.4f} s while allocating {what}")
            if level > self.peak[tier]:
                self.peak[tier] = level
            self.recorder.level(self.env.now, tier, level)
