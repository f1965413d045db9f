"""Cost and energy columns, checked by hand on the tiny machine with round prices."""

from __future__ import annotations

import pytest

from offsim.config.loading import load_profile
from offsim.sweep.cost import HOURS_PER_YEAR, capex_usd, cost_columns, power_w, usd_per_hour
from offsim.sweep.spec import CostAssumptions

PRICED = {
    "gpu": {"price_usd": 1000.0, "power_w": 300.0},
    "cpu": {"price_usd": 500.0, "power_w": 100.0},
    "dram": {"price_usd_per_gib": 4.0, "power_w": 20.0},
    "nvme": {"price_usd": 100.0, "power_w": 8.0},
}


def tiny(**changes):
    data = load_profile("tiny").model_dump()
    for block, fields in PRICED.items():
        data[block].update(fields)
    for key, value in changes.items():
        block, _, field = key.partition(".")
        if field:
            data[block][field] = value
        else:
            data[block] = value
    return type(load_profile("tiny")).model_validate(data)


def test_capex_and_power_add_up_the_parts():
    hw = tiny(**{"nvme.drives": 2})
    # 1 GPU + 1 socket + 64 GiB x 4 USD + 2 drives x 100 USD
    assert capex_usd(hw) == 1000 + 500 + 64 * 4 + 2 * 100
    assert power_w(hw) == 300 + 100 + 20 + 2 * 8


def test_missing_price_or_power_is_unknown_not_partial():
    assert capex_usd(tiny(**{"gpu.price_usd": None})) is None
    assert power_w(tiny(**{"nvme.power_w": None})) is None
    assert capex_usd(tiny(nvme=None)) == 1000 + 500 + 64 * 4  # no NVMe: nothing to price


def test_hourly_price_from_capex_and_energy_or_rental():
    hw = tiny()
    a = CostAssumptions(lifetime_years=2.0, utilisation=0.5, usd_per_kwh=0.2)
    hourly, basis = usd_per_hour(hw, a)
    assert basis == "capex+energy"
    assert hourly == pytest.approx(1856 / (2 * HOURS_PER_YEAR * 0.5) + 0.428 * 0.2)
    assert usd_per_hour(tiny(**{"cpu.power_w": None}), a)[1] == "capex"
    rented = type(hw).model_validate({**hw.model_dump(), "price_usd_per_hour": 2.5})
    assert usd_per_hour(rented, a) == (2.5, "rental")
    assert usd_per_hour(tiny(**{"dram.price_usd_per_gib": None}), a) == (None, "unknown")


def test_cost_per_million_tokens_and_energy_per_iteration():
    hw = type(tiny()).model_validate({**tiny().model_dump(), "price_usd_per_hour": 3.6})
    row = cost_columns(hw, CostAssumptions(), tokens_per_iteration=1000, iteration_time_s=2.0)
    # 3.6 USD/h = 0.001 USD/s; 2 s per 1000 tokens -> 0.002 USD per 1000 tokens -> 2 USD per million
    assert row["cost_per_million_tokens_usd"] == pytest.approx(2.0)
    assert row["energy_per_iteration_j"] == pytest.approx(428 * 2.0)
    assert row["energy_kwh_per_million_tokens"] == pytest.approx(856 / 3.6e6 * 1000)
    empty = cost_columns(hw, CostAssumptions(), 1000, None)
    assert empty["cost_per_million_tokens_usd"] is None and empty["capex_usd"] == 1856
