"""The GPU verdict near the edge (gpu_memory.md §4 "Verdict rule"): A + F + O against T with the
margin's uncertainty Y; hand-computed from the reference's own worked example."""

from __future__ import annotations

import pytest

from offsim.core.errors import InfeasibleError
from offsim.core.units import GiB
from offsim.fit_check import raise_if_over
from offsim.plan.footprint import OUTSIDE_POOL_ITEM, TIERS, Footprint, GpuMargin, GpuVerdict, gpu_margin


def _fp(allocated_gib: float, outside_gib: float, total_gib: float) -> Footprint:
    need = {t: 0.0 for t in TIERS}
    cap = {t: 1e15 for t in TIERS}
    need["gpu"] = (allocated_gib + outside_gib) * GiB
    cap["gpu"] = total_gib * GiB
    bd = {t: {} for t in TIERS}
    bd["gpu"] = {"params (16-bit)": allocated_gib * GiB, OUTSIDE_POOL_ITEM: outside_gib * GiB}
    return Footprint(need, cap, bd)


def test_reference_example_marginal_then_fit() -> None:
    # gpu_memory.md §4: T = 79.2, A = 74, O = 1.45 -> F = 2.96, X = 0.79, Y = 2.13: MARGINAL
    m = gpu_margin(_fp(74.0, 1.45, 79.2))
    assert m.fragmentation_bytes / GiB == pytest.approx(2.96)
    assert m.spare_bytes / GiB == pytest.approx(0.79)
    assert m.uncertainty_bytes / GiB == pytest.approx(2.13)
    assert m.verdict is GpuVerdict.MARGINAL
    # A = 70 -> F = 2.80, X = 4.95, Y = 2.05: FIT
    m = gpu_margin(_fp(70.0, 1.45, 79.2))
    assert m.spare_bytes / GiB == pytest.approx(4.95)
    assert m.uncertainty_bytes / GiB == pytest.approx(2.05)
    assert m.verdict is GpuVerdict.FIT
    assert m.sentence() == ("fits with 4.95 ± 2.05 GiB to spare counting 4% allocator fragmentation and 1.45 GiB "
                            "outside PyTorch's pool: fits")


def test_needs_that_fit_can_still_be_out_of_memory_by_the_margin() -> None:
    # A = 76, O = 1.45, T = 79.2: A + O = 77.45 fits T, but F = 3.04 -> X = -1.29, Y = 2.17: MARGINAL;
    # A = 77.5 (A + O = 78.95 still fits): F = 3.10, X = -2.85, Y = 2.20 -> OOM
    assert gpu_margin(_fp(76.0, 1.45, 79.2)).verdict is GpuVerdict.MARGINAL
    assert _fp(76.0, 1.45, 79.2).first_overflow() is None
    fp = _fp(77.5, 1.45, 79.2)
    m = gpu_margin(fp)
    assert m.spare_bytes / GiB == pytest.approx(-2.85)
    assert m.verdict is GpuVerdict.OOM
    assert fp.first_overflow() == "gpu"
    with pytest.raises(InfeasibleError, match=r"per GPU; short by 2\.85 ± 2\.20 GiB counting 4% .*: out of memory; "):
        raise_if_over(fp)


def test_needs_over_capacity_are_rejected_whatever_the_margin() -> None:
    # A = 22, O = 1, T = 22.9: needs 23 > 22.9 (the engine would overflow); X = -0.98, Y = 1.09: MARGINAL
    fp = _fp(22.0, 1.0, 22.9)
    assert gpu_margin(fp).verdict is GpuVerdict.MARGINAL
    assert fp.first_overflow() == "gpu"


def test_verdict_bands_are_ordered() -> None:
    def v(x_gib: float) -> GpuVerdict:
        # A = 10 GiB, O = 0: Y = 0.85 GiB; pick T so that X = x_gib
        return GpuMargin(10 * GiB, 0.4 * GiB, 0.0, (10.4 + x_gib) * GiB).verdict
    assert [v(x) for x in (-2.0, -0.86, -0.84, 0.0, 0.84, 0.86, 3.0)] == [
        GpuVerdict.OOM, GpuVerdict.OOM, GpuVerdict.MARGINAL, GpuVerdict.MARGINAL, GpuVerdict.MARGINAL,
        GpuVerdict.FIT, GpuVerdict.FIT]
