"""Cost and energy of a configuration, from the optional price and power fields of a profile.

Formulas (all per whole machine: ``topology.nodes`` nodes of ``gpus_per_node`` GPUs):

* **Purchase price** (capex, USD) = nodes x (gpus_per_node x ``gpu.price_usd``
  + sockets x ``cpu.price_usd`` + ``dram.capacity_gib`` x ``dram.price_usd_per_gib``
  + ``nvme.drives`` x ``nvme.price_usd``). ``cpu.price_usd`` is per socket (per CPU package) and
  ``nvme.price_usd`` per drive. Chassis, board, PSU and network are not counted. When any of the
  machine's components has no price, the capex is unknown (None), never a partial sum.
* **Power** (W) = nodes x (gpus_per_node x ``gpu.power_w`` + sockets x ``cpu.power_w`` +
  ``dram.power_w`` + drives x ``nvme.power_w``): ``gpu.power_w`` per GPU, ``cpu.power_w`` per
  socket, ``dram.power_w`` for all of a node's DRAM, ``nvme.power_w`` per drive. These are rated
  (TDP / board power) figures. Unknown when any is missing.
* **Hourly price** (USD/h): ``price_usd_per_hour`` when the profile states it (a rental price,
  assumed all-inclusive); otherwise capex / (lifetime_years x 8766 h x utilisation), plus power
  x ``usd_per_kwh`` when the power is known. The ``cost_basis`` column says which.
* **Cost per million tokens** (USD) = hourly price x iteration time / 3600 / tokens per
  iteration x 1e6.
* **Energy per iteration** (J) = power x iteration time: every component at its rated power for
  the whole iteration, i.e. a TDP-based upper estimate; idle and partial-load power are not
  modelled (no busy-time weighting), nor cooling (PUE 1).
"""

from __future__ import annotations

from typing import Any

from offsim.config.hardware import HardwareProfile
from offsim.sweep.spec import CostAssumptions

HOURS_PER_YEAR = 8766.0  # 365.25 days


def capex_usd(hw: HardwareProfile) -> float | None:
    """Purchase price of the machine (see the module docstring), or None when a price is missing."""
    t = hw.topology
    parts = [
        (hw.gpu.price_usd, t.gpus_per_node),
        (hw.cpu.price_usd, hw.cpu.sockets),
        (hw.dram.price_usd_per_gib, hw.dram.capacity_gib),
    ]
    if hw.nvme is not None:
        parts.append((hw.nvme.price_usd, hw.nvme.drives))
    if any(price is None for price, _ in parts):
        return None
    return t.nodes * sum(price * n for price, n in parts)  # type: ignore[operator,misc]


def power_w(hw: HardwareProfile) -> float | None:
    """Rated power of the machine, W, or None when a component's power is missing."""
    t = hw.topology
    parts = [
        (hw.gpu.power_w, t.gpus_per_node),
        (hw.cpu.power_w, hw.cpu.sockets),
        (hw.dram.power_w, 1),
    ]
    if hw.nvme is not None:
        parts.append((hw.nvme.power_w, hw.nvme.drives))
    if any(p is None for p, _ in parts):
        return None
    return t.nodes * sum(p * n for p, n in parts)  # type: ignore[operator,misc]


def usd_per_hour(hw: HardwareProfile, assumptions: CostAssumptions) -> tuple[float | None, str]:
    """Hourly price of the machine and its basis: ``rental``, ``capex+energy``, ``capex`` or ``unknown``."""
    if hw.price_usd_per_hour is not None:
        return hw.price_usd_per_hour, "rental"
    capex = capex_usd(hw)
    if capex is None:
        return None, "unknown"
    hourly = capex / (assumptions.lifetime_years * HOURS_PER_YEAR * assumptions.utilisation)
    watts = power_w(hw)
    if watts is None:
        return hourly, "capex"
    return hourly + watts / 1000.0 * assumptions.usd_per_kwh, "capex+energy"


def cost_columns(
    hw: HardwareProfile,
    assumptions: CostAssumptions,
    tokens_per_iteration: float,
    iteration_time_s: float | None,
) -> dict[str, Any]:
    """The cost and energy columns of one result row (None where unknown)."""
    hourly, basis = usd_per_hour(hw, assumptions)
    watts = power_w(hw)
    row: dict[str, Any] = {
        "capex_usd": capex_usd(hw),
        "usd_per_hour": hourly,
        "cost_basis": basis,
        "power_w": watts,
        "cost_per_million_tokens_usd": None,
        "energy_per_iteration_j": None,
        "energy_kwh_per_million_tokens": None,
    }
    if iteration_time_s is None or iteration_time_s <= 0:
        return row
    if hourly is not None:
        row["cost_per_million_tokens_usd"] = hourly * iteration_time_s / 3600.0 / tokens_per_iteration * 1e6
    if watts is not None:
        joules = watts * iteration_time_s
        row["energy_per_iteration_j"] = joules
        row["energy_kwh_per_million_tokens"] = joules / 3.6e6 / tokens_per_iteration * 1e6
    return row
