"""Every tier's verdict stated with its margin (fit_check.verdict_sentences), hand-computed."""

from __future__ import annotations

from offsim.core.units import GiB
from offsim.fit_check import verdict_sentences
from offsim.plan.footprint import OUTSIDE_POOL_ITEM, TIERS, Footprint


def test_each_tier_with_its_margin() -> None:
    need = {t: 0.0 for t in TIERS}
    cap = {t: 100.0 * GiB for t in TIERS}
    bd: dict[str, dict[str, float]] = {t: {} for t in TIERS}
    # GPU: A = 70, O = 1.45, T = 79.2 -> F = 2.80, X = 4.95, Y = 0.02 x 70 + 0.65 = 2.05 (gpu_memory.md §4)
    need["gpu"], cap["gpu"] = 71.45 * GiB, 79.2 * GiB
    bd["gpu"] = {"params (16-bit)": 70.0 * GiB, OUTSIDE_POOL_ITEM: 1.45 * GiB}
    # host: 120 of 100 GiB -> short by 20; NVMe: 30 of 100 -> 70 to spare; pinned and PFS hold nothing
    need["host"], need["nvme"] = 120.0 * GiB, 30.0 * GiB
    out = verdict_sentences(Footprint(need, cap, bd))
    assert out == [
        "GPU (per rank): fits with 4.95 ± 2.05 GiB to spare counting 4% allocator fragmentation and 1.45 GiB "
        "outside PyTorch's pool: fits",
        "host memory per node: short by 20.00 GiB (120.00 of 100.00 GiB)",
        "NVMe per node: fits with 70.00 GiB to spare (30.00 of 100.00 GiB)",
    ]
