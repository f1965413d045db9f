"""Does a run fit: the sum of what its system's mechanisms declare they hold.

Each mechanism declares its needs (:meth:`offsim.mechanisms.base.Mechanism.footprint`) from the
same numbers it emits its ops with, so the fit verdict, the sweep's pre-filter and the engine
cannot disagree about what a mechanism holds. The needs are per rank; host memory, NVMe and the
parallel file system are shared by the ranks of a node (the PFS by every node).
"""

from __future__ import annotations

from dataclasses import dataclass

from offsim.config.run import RunConfig
from offsim.core.units import GiB
from offsim.errors import InfeasibleError
from offsim.mechanisms.base import NEED_TIERS, sum_needs
from offsim.plan.footprint import (
    TIERS,
    Footprint,
    GpuVerdict,
    StateSizes,
    capacities,
    gpu_margin,
    state_sizes,
)
from offsim.systems._compile import System
from offsim.systems._registry import compose


def footprint_of(system: System, cfg: RunConfig, sz: StateSizes) -> Footprint:
    """The peak bytes per tier of ``system`` (``cfg``'s composition): GPU per rank; pinned, all
    host memory (pinned included) and NVMe per node; the PFS for the job."""
    needs = [n for m in system.mechanisms.values() for n in m.footprint()]
    bd = sum_needs(needs, cfg.hardware.gpu.memory_bytes)
    per_rank = {t: sum(bd[t].values()) for t in NEED_TIERS}
    ranks = sz.ranks_per_node
    need = {
        "gpu": per_rank["gpu"],
        "host_pinned": per_rank["host_pinned"] * ranks,
        "host": (per_rank["host_pinned"] + per_rank["host"]) * ranks,
        "nvme": per_rank["nvme"] * ranks,
        "pfs": per_rank["pfs"] * ranks * cfg.hardware.topology.nodes,
    }
    return Footprint(need, capacities(cfg), bd)


def footprint(cfg: RunConfig, sz: StateSizes | None = None) -> Footprint:
    """The peak bytes per tier of ``cfg`` (:func:`footprint_of` its composition)."""
    sz = sz or state_sizes(cfg)
    return footprint_of(compose(cfg, sz), cfg, sz)


def raise_if_over(fp: Footprint) -> Footprint:
    """Raise :class:`~offsim.errors.InfeasibleError` naming the first tier that does not fit
    (:meth:`Footprint.first_overflow`) and its three largest items (the GPU with its margin); else return
    ``fp``."""
    tier = fp.first_overflow()
    if tier is None:
        return fp
    items = fp.breakdown[tier]
    if tier == "host":
        items = {**fp.breakdown["host"], **fp.breakdown["host_pinned"]}
    parts = sorted(items.items(), key=lambda kv: -kv[1])[:3]
    detail = ", ".join(f"{k} {v / 2**30:.2f} GiB" for k, v in parts)
    scope = f"per GPU; {gpu_margin(fp).sentence()}" if tier == "gpu" else "per node"
    raise InfeasibleError(tier, fp.need_bytes[tier], fp.capacity_bytes[tier], f"{scope}; largest: {detail}")


def check_fit(cfg: RunConfig, sz: StateSizes | None = None) -> Footprint:
    """Raise InfeasibleError if any tier's peak exceeds its capacity; else the footprint."""
    return raise_if_over(footprint(cfg, sz))


#: how each tier's need is counted, for the verdict's sentence
_SCOPE = {"gpu": "GPU (per rank)", "host_pinned": "pinned host memory per node", "host": "host memory per node",
          "nvme": "NVMe per node", "pfs": "parallel file system for the job"}


@dataclass(frozen=True)
class TierMargin:
    """One tier's verdict with its margin (bytes).

    Attributes:
        tier: ``gpu``, ``host_pinned``, ``host``, ``nvme`` or ``pfs`` (:data:`~offsim.plan.footprint.TIERS`).
        need_bytes: the tier's need (GPU per rank; the PFS for the job; the others per node).
        capacity_bytes: the tier's capacity, counted as the need is.
        spare_bytes: what is left: for the GPU X of :class:`~offsim.plan.footprint.GpuMargin`
            (fragmentation and the memory outside PyTorch's pool counted), else capacity - need;
            negative when short.
        uncertainty_bytes: the GPU's Y (:attr:`GpuMargin.uncertainty_bytes`); 0 for the other tiers,
            whose need against capacity is exact in the model.
        verdict: ``fits``, ``marginal`` (GPU only: within its uncertainty) or ``out of memory``.
        sentence: the verdict in words (:func:`verdict_sentences`).
    """

    tier: str
    need_bytes: float
    capacity_bytes: float
    spare_bytes: float
    uncertainty_bytes: float
    verdict: str
    sentence: str

    def to_dict(self) -> dict[str, float | str]:
        """JSON-ready form."""
        return {"tier": self.tier, "need_bytes": self.need_bytes, "capacity_bytes": self.capacity_bytes,
                "spare_bytes": self.spare_bytes, "uncertainty_bytes": self.uncertainty_bytes,
                "verdict": self.verdict, "sentence": self.sentence}


def tier_margins(fp: Footprint) -> list[TierMargin]:
    """The verdict of the GPU and of each other tier that holds something, with its margin: the
    GPU's by gpu_memory.md §4 "Verdict rule" (:class:`~offsim.plan.footprint.GpuMargin`: "fits with
    X ± Y GiB to spare", or "short by", and fits / marginal / out of memory); every other tier "fits
    with X GiB to spare" or "short by X GiB", need against capacity (GiB)."""
    m = gpu_margin(fp)
    out = [TierMargin("gpu", fp.need_bytes["gpu"], fp.capacity_bytes["gpu"], m.spare_bytes, m.uncertainty_bytes,
                      m.verdict.value, f"{_SCOPE['gpu']}: {m.sentence()}")]
    for tier in TIERS[1:]:
        need, cap = fp.need_bytes[tier], fp.capacity_bytes[tier]
        if need <= 0:
            continue
        spare = (cap - need) / GiB
        how = f"fits with {spare:.2f} GiB to spare" if spare >= 0 else f"short by {-spare:.2f} GiB"
        verdict = GpuVerdict.FIT.value if spare >= 0 else GpuVerdict.OOM.value
        out.append(TierMargin(tier, need, cap, cap - need, 0.0, verdict,
                              f"{_SCOPE[tier]}: {how} ({need / GiB:.2f} of {cap / GiB:.2f} GiB)"))
    return out


def verdict_sentences(fp: Footprint) -> list[str]:
    """The sentence of each of :func:`tier_margins`: the GPU's as
    :meth:`~offsim.plan.footprint.GpuMargin.sentence` states it ("fits with X ± Y GiB to spare"
    with the allocator's margin, or "short by"); every other tier that holds something "fits with
    X GiB to spare" or "short by X GiB" (need against capacity, GiB)."""
    return [m.sentence for m in tier_margins(fp)]
