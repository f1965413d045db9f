"""Pre-filter: memory fit, a lower bound on iteration time, and dominance.

Before a point is simulated, three cheap checks can settle it:

1. **Memory fit.** :func:`offsim.fit_check.check_fit`, the same check :func:`offsim.simulate`
   makes first, so a point marked infeasible here is infeasible in the simulator, with the same
   reason.
2. **A lower bound on the steady iteration time**: :func:`offsim.plan.time_bound.time_lower_bound`,
   the least work of the point's compiled schedule on each resource and stream (the GPU compute
   stream, each PCIe direction, the NVMe array, DRAM, the CPU optimizer...) over its capacity
   (:mod:`offsim.schedule.bound`). Only a point that fits is compiled for it
   (:mod:`offsim.sweep.evaluate`).
3. **Dominance.** A point is *clearly dominated* when an already simulated point of the same
   workload costs no more per hour and delivers at least the tokens/s that this point could at
   best reach (tokens per iteration / lower bound). Such a point can be neither faster nor
   cheaper, so it is not simulated; its row keeps the bound and names the dominating point.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from offsim.plan.time_bound import TimeBound, time_lower_bound

__all__ = ["Frontier", "TimeBound", "time_lower_bound"]


@dataclass
class Frontier:
    """Simulated points, per workload, as a cost-sorted staircase of the best tokens/s so far.

    Plain data, so it travels to worker processes with each chunk of points.
    """

    groups: dict[str, tuple[list[float], list[float], list[str]]] = field(default_factory=dict)

    @classmethod
    def from_rows(cls, rows: Iterable[Mapping[str, Any]]) -> Frontier:
        """Build from result rows: feasible simulated rows with a known hourly price."""
        by_group: dict[str, list[tuple[float, float, str]]] = {}
        for r in rows:
            if r.get("status") == "ok" and r.get("usd_per_hour") is not None and r.get("tokens_per_s"):
                by_group.setdefault(r["workload_id"], []).append(
                    (r["usd_per_hour"], r["tokens_per_s"], r["point_id"])
                )
        out = cls()
        for g, items in by_group.items():
            items.sort(key=lambda x: (x[0], -x[1], x[2]))
            costs: list[float] = []
            best: list[float] = []
            ids: list[str] = []
            for cost, tps, pid in items:  # keep the staircase corners: where the best tokens/s rises
                if not best or tps > best[-1]:
                    costs.append(cost)
                    best.append(tps)
                    ids.append(pid)
            out.groups[g] = (costs, best, ids)
        return out

    def dominated_by(self, group: str, usd_per_hour: float, tokens_per_s_upper: float) -> str | None:
        """The id of a simulated point no dearer and at least as fast as this point can be."""
        if group not in self.groups:
            return None
        costs, best, ids = self.groups[group]
        i = bisect.bisect_right(costs, usd_per_hour) - 1
        if i >= 0 and best[i] >= tokens_per_s_upper:
            return ids[i]
        return None

    def __len__(self) -> int:
        return sum(len(v[0]) for v in self.groups.values())
