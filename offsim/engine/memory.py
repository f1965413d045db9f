"""Memory held per tier over time, keyed by what holds it.

Holdings are integer bytes keyed by (tier, tensor): a free releases exactly what the allocation of
the same tensor on the same tier holds, so a double allocation or a free of what is not held is a
:class:`~offsim.core.errors.ScheduleError`, never a clamp. Levels are kept per rank (the simulated
GPU); host memory and NVMe are shared by the ranks of a node, which run the same schedule, so a
node level is the rank level times ``ranks_per_node`` (the PFS: times every rank of the job). A
level above capacity raises :class:`~offsim.core.errors.InfeasibleError` at the moment it happens.

Each holding also names its owner (the mechanism whose op allocated it, ``Tag.mechanism``), and
the ledger keeps every owner's peak per rank and tier (issue 14, architecture.md section 9: the
footprint stays declared but is checked per mechanism).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable

from offsim.core.enums import Tier
from offsim.core.errors import InfeasibleError, ScheduleError

#: the tiers as reported (levels, peaks, capacities): ``host`` is pinned + pageable
REPORTED_TIERS = ("gpu", "host_pinned", "host", "nvme", "pfs")


#: the reported tiers whose level a change of each tier moves (``host`` is pinned + pageable)
_REPORTED_BY: dict[Tier, tuple[str, ...]] = {
    Tier.GPU: ("gpu",), Tier.HOST_PINNED: ("host_pinned", "host"), Tier.HOST_PAGEABLE: ("host",),
    Tier.NVME: ("nvme",), Tier.PFS: ("pfs",),
}


class Memory:
    """Bytes held per tier, with peaks; every change of a reported level goes to ``on_level``.

    A change reports only the levels it moves (issue 16: a level is a step function, and
    repeating an unchanged level at every change of another tier was most of the samples); the
    first change reports every tier, so each has a sample from the first instant on.

    Args:
        now: the clock (seconds).
        capacity_bytes: per reported tier: GPU per rank, host and NVMe per node, PFS per job.
        ranks_per_node / nodes: multipliers from rank levels to node and job levels.
        on_level: called with (t_s, reported tier, level bytes) after every change of that level.
    """

    def __init__(self, now: Callable[[], float], capacity_bytes: dict[str, float], ranks_per_node: int,
                 nodes: int, on_level: Callable[[float, str, float], None]) -> None:
        self.now = now
        self.capacity_bytes = capacity_bytes
        self.ranks = ranks_per_node
        self.nodes = nodes
        self.on_level = on_level
        #: (tier, tensor) -> (bytes, owner)
        self.held: dict[tuple[Tier, Hashable], tuple[int, Hashable]] = {}
        self.rank_bytes = dict.fromkeys(Tier, 0)
        self.peak_bytes = dict.fromkeys(REPORTED_TIERS, 0.0)
        #: owner -> bytes it holds now per tier, per rank
        self.owner_bytes: dict[Hashable, dict[Tier, int]] = {}
        #: owner -> its peak per rank per reported tier (``host``: its pinned + pageable)
        self.owner_peak_bytes: dict[Hashable, dict[str, int]] = {}
        self._reported = False  # no level reported yet: the first change reports every tier

    def level(self, tier: str) -> float:
        """One reported level (bytes): GPU per rank, the PFS for the job, the others per node."""
        r = self.rank_bytes
        if tier == "gpu":
            return float(r[Tier.GPU])
        if tier == "host_pinned":
            return float(r[Tier.HOST_PINNED] * self.ranks)
        if tier == "host":
            return float((r[Tier.HOST_PINNED] + r[Tier.HOST_PAGEABLE]) * self.ranks)
        if tier == "nvme":
            return float(r[Tier.NVME] * self.ranks)
        return float(r[Tier.PFS] * self.ranks * self.nodes)

    def levels(self) -> dict[str, float]:
        """Levels as reported: GPU per rank, the PFS for the job, the others per node."""
        return {tier: self.level(tier) for tier in REPORTED_TIERS}

    def gpu_free_bytes(self) -> float:
        """GPU memory not held now."""
        return self.capacity_bytes["gpu"] - self.rank_bytes[Tier.GPU]

    def hold(self, tier: Tier, key: Hashable, nbytes: int, what: Callable[[], str], owner: Hashable = None) -> None:
        """``key`` takes ``nbytes`` of ``tier`` for ``owner``; raises InfeasibleError if a tier
        overflows (``what`` names the holder in messages)."""
        if (tier, key) in self.held:
            raise ScheduleError(f"{key} is allocated twice on {tier} ({what()})")
        self.held[(tier, key)] = (nbytes, owner)
        if nbytes > 0:
            self.rank_bytes[tier] += nbytes
            self._update(tier, what)
            self._own(owner, tier, nbytes)

    def free(self, tier: Tier, key: Hashable) -> None:
        """Release what ``key`` holds on ``tier``."""
        holding = self.held.pop((tier, key), None)
        if holding is None:
            raise ScheduleError(f"{key} is freed on {tier} but holds nothing there")
        nbytes, owner = holding
        if nbytes > 0:
            self.rank_bytes[tier] -= nbytes
            self.owner_bytes[owner][tier] -= nbytes
            self._update(tier, lambda: "")

    def _own(self, owner: Hashable, tier: Tier, nbytes: int) -> None:
        """Add ``nbytes`` of ``tier`` to ``owner``'s level and peak (per rank)."""
        levels = self.owner_bytes.get(owner)
        if levels is None:
            levels = self.owner_bytes[owner] = dict.fromkeys(Tier, 0)
            self.owner_peak_bytes[owner] = dict.fromkeys(REPORTED_TIERS, 0)
        levels[tier] += nbytes
        peaks = self.owner_peak_bytes[owner]
        for name in _REPORTED_BY[tier]:
            level = levels[Tier.HOST_PINNED] + levels[Tier.HOST_PAGEABLE] if name == "host" else levels[tier]
            if level > peaks[name]:
                peaks[name] = level

    def _update(self, changed: Tier, what: Callable[[], str]) -> None:
        """Check, peak and report the levels a change of ``changed`` moved (the others cannot
        have crossed a capacity or a peak)."""
        t = self.now()
        if self._reported:
            tiers = _REPORTED_BY[changed]
        else:
            tiers = REPORTED_TIERS
            self._reported = True
        peaks = self.peak_bytes
        for tier in tiers:
            level = self.level(tier)
            cap = self.capacity_bytes[tier]
            if level > cap * (1 + 1e-9):
                scope = {"gpu": "per GPU", "pfs": "for the job"}.get(tier, "per node")
                raise InfeasibleError(tier, level, cap, f"{scope}, at t={t:.4f} s while allocating {what()}")
            if level > peaks[tier]:
                peaks[tier] = level
            self.on_level(t, tier, level)
