"""Issue 23 part 3, honest intervals: a value a profile carries over from another machine without a
source is drawn over the range of the parts it could be (``assumed``), not only the shipped
achieved-vs-datasheet spread; each bound is the product its ``why`` states, recomputed here by hand."""

from __future__ import annotations

import pytest

from offsim.config.loading import load_profile
from offsim.config.run import make_run_config
from offsim.intervals import models_of, ranges_used
from offsim.validation_intervals import default_assumptions_path, load_assumptions, with_declared

JLSE = "jlse-h100-node"
#: the shipped achieved-to-datasheet spread of NVMe rates (validation/assumptions.yaml nvme-rates)
NVME_LOW, NVME_HIGH = 0.60, 1.05


def _jlse_ranges() -> dict[str, tuple[float, float]]:
    cfg = make_run_config(load_profile(JLSE), "llama2-7b", "zero-infinity-nvme")
    used = ranges_used(models_of(cfg), with_declared(models_of(cfg), load_assumptions(default_assumptions_path())))
    return {r.id: r.scale for r in used}


@pytest.mark.parametrize(("path", "low", "high"), [
    # per-drive datasheet read, Gen4 6.5 GB/s (PM9A3, D7-P5510) to Gen5 14 (Kioxia CM7), hardware_facts.md 4.1
    ("nvme.read_gb_per_s", 6.5 * NVME_LOW, 14.0 * NVME_HIGH),    # 3.9 .. 14.7 GB/s
    # per-drive datasheet write, Gen4 3.2 (PM9A3 E1.S) to Gen5 7.0 (CM7, Micron 7600 MAX)
    ("nvme.write_gb_per_s", 3.2 * NVME_LOW, 7.0 * NVME_HIGH),    # 1.92 .. 7.35 GB/s
    # one NFS connection ~2 GB/s to one 100 Gb/s port = 100 / 8 = 12.5 GB/s
    ("pfs.read_gb_per_s", 2.0, 100 / 8),
    ("pfs.write_gb_per_s", 2.0, 100 / 8),
    # hardware_facts.md 2.4: 44% (8x A100 Gen4 H2D) kept per direction; 1.0 the profile's value
    ("host_link.duplex_efficiency", 0.44, 1.0),
    # NVLink4 per peer 6 x 25 = 150 to all 18 links 450 GB/s (datasheet), each at the achieved
    # unidirectional share 380 / 450 of an 8-GPU HGX H100 (hardware_facts.md 1.3): 126.7 .. 380
    ("topology.gpu_link.bandwidth_gb_per_s", round(6 * 25 * 380 / 450, 1), 18 * 25 * 380 / 450),
])
def test_jlse_carried_over_values_are_declared_with_their_bounds(path: str, low: float, high: float) -> None:
    """The NVMe, VAST and duplex figures jlse-h100-node carries over (polaris-a100-grand's drives and
    Grand's per-node rate, h100-sxm5-gen5's duplex), and its datasheet NVLink rate, are ``assumed``
    with the bounds their why states."""
    hw = load_profile(JLSE)
    r = hw.assumed[path].range
    assert r is not None
    assert r[0] == pytest.approx(low, rel=1e-9)
    assert r[1] == pytest.approx(high, rel=1e-9)
    assert hw.assumed[path].why


def test_jlse_declared_ranges_replace_the_shipped_ones_on_their_fields() -> None:
    """Drawn in place of the shipped nvme-rates, pfs-rates and duplex-efficiency ranges (those
    ranges leave this profile), as factors of the values it gives: read 6.9 GB/s -> x(3.9 / 6.9 =
    0.5652) to x(14.7 / 6.9 = 2.1304); VAST 4.06 GB/s -> x(2.0 / 4.06 = 0.4926) to x(12.5 / 4.06 =
    3.0788); duplex 1.0 -> x0.44 to x1."""
    used = _jlse_ranges()
    assert "nvme-rates" not in used and "pfs-rates" not in used and "duplex-efficiency" not in used
    assert used["hardware:nvme.read_gb_per_s"] == pytest.approx((0.5652, 2.1304), abs=1e-4)
    assert used["hardware:pfs.write_gb_per_s"] == pytest.approx((0.4926, 3.0788), abs=1e-4)
    assert used["hardware:host_link.duplex_efficiency"] == pytest.approx((0.44, 1.0))
    # the other shipped ranges still apply (host link rates, GEMM efficiency, CPU Adam, memcpy, reserve)
    assert {"host-link-rate", "gemm-efficiency", "cpu-adam-rate-derived", "cpu-memcpy", "gpu-reserved"} <= set(used)


def test_every_unmeasured_full_duplex_pcie_link_draws_the_platforms_spread() -> None:
    """No shipped PCIe profile keeps a duplex_efficiency of 1.0 (no bidirectional measurement of its
    own) without the measured platforms' spread, 0.44-0.90 per direction (hardware_facts.md 2.4),
    as its range: the shipped duplex-efficiency range (x0.80-x1.25, clipped at 1) is for the
    profiles that derived theirs from a measurement (0.72, 0.77). ``tiny`` is the tests' own."""

    from offsim.validation_intervals import default_assumptions_path

    folder = default_assumptions_path().parent.parent / "hardware_profiles"
    missing, checked = [], []
    for path in sorted(folder.glob("*.yaml")):
        hw = load_profile(path.stem)
        if path.stem == "tiny" or hw.host_link.kind != "pcie" or hw.host_link.duplex_efficiency < 1.0:
            continue
        checked.append(path.stem)
        r = hw.assumed.get("host_link.duplex_efficiency")
        if r is None or r.range != (0.44, 1.0):
            missing.append(path.stem)
    assert not missing
    # dgx2-v100, a6000-ws, h100-sxm5-gen5, h200-sxm-node, harmony, jlse, laptop, patrickstar,
    # titan-rtx-2x-hf (3eb1d47, with the range)
    assert len(checked) == 9
