"""The fit check is the sum of what the mechanisms declare (issue 14, step 4): the sum's rules by
hand, and for every shipped strategy the engine never holds more than the sum in any tier."""

from __future__ import annotations

from pathlib import Path

import pytest

from offsim import make_run_config, simulate
from offsim.api import resolve
from offsim.core.enums import Tier
from offsim.fit_check import footprint
from offsim.mechanisms.activations import Activations, LayerActivations
from offsim.mechanisms.base import Moment, Need, sum_needs
from offsim.systems._registry import compose

STRATEGIES = sorted(p.stem for p in (Path(__file__).resolve().parent.parent / "strategies").glob("*.yaml"))
GiB = 2**30


def test_held_needs_add_up_and_only_the_largest_moment_counts() -> None:
    needs = [Need(Tier.GPU, "window", 3 * GiB), Need(Tier.GPU, "window", 1 * GiB),
             Need(Tier.HOST_PINNED, "buffers", 2 * GiB),
             Need(Tier.HOST_PAGEABLE, "set-up copies", 5 * GiB, Moment.START_UP),
             Need(Tier.HOST_PAGEABLE, "overflow check", 2 * GiB, Moment.STEP_START),
             Need(Tier.HOST_PINNED, "moments", 4 * GiB, Moment.FIRST_STEP),
             Need(Tier.HOST_PAGEABLE, "moments", 2 * GiB, Moment.FIRST_STEP)]
    bd = sum_needs(needs, 80 * GiB)
    assert bd["gpu"] == {"window": 4 * GiB}
    # first step: 4 + 2 = 6 GiB, more than the 5 GiB of start-up; the start-up's is not counted
    assert bd["host_pinned"] == {"buffers": 2 * GiB, "moments": 4 * GiB}
    assert bd["host"] == {"moments": 2 * GiB}


def test_an_elastic_need_takes_whole_units_of_what_is_free() -> None:
    held = Need(Tier.GPU, "state", 7 * GiB)
    streamed = Need(Tier.GPU, "streamed sub-groups", 3 * GiB, unit_bytes=1 * GiB)
    assert sum_needs([held, streamed], 9.5 * GiB)["gpu"]["streamed sub-groups"] == 2 * GiB  # 2.5 free
    assert sum_needs([held, streamed], 20 * GiB)["gpu"]["streamed sub-groups"] == 3 * GiB  # at most its own
    assert "streamed sub-groups" not in sum_needs([held, streamed], 7.5 * GiB)["gpu"]  # not one fits


def test_activations_in_flight_are_the_largest_window_of_consecutive_offloaded_layers() -> None:
    """Kept bytes 1, 5, 1, 1, 1 GiB offloaded to host (and one 2 GiB layer kept on the GPU), depth
    0: the forward throttle lets depth + 2 = 2 consecutive offloaded layers sit on the GPU, so the
    most in flight is max(1+5, 5+1, 1+1, 1+1) = 6 GiB, not 2 x 5 = 10 GiB; depth 2 (window 4):
    max(1+5+1+1, 5+1+1+1) = 8 GiB; depth 9 (window capped at the 5 layers): all 9 GiB."""
    def layer(kept_gib: int, tier: Tier) -> LayerActivations:
        return LayerActivations(kept_gib * GiB, 0, 0, tier)
    layers = (layer(1, Tier.HOST_PINNED), layer(2, Tier.GPU), *(layer(g, Tier.HOST_PINNED) for g in (5, 1, 1, 1)))

    def in_flight(depth: int) -> int:
        act = Activations(layers, depth, (0,) * len(layers))
        return next(int(n.nbytes) for n in act.footprint() if n.what == "activations in flight")
    assert (in_flight(0), in_flight(2), in_flight(9)) == (6 * GiB, 8 * GiB, 9 * GiB)


def test_every_mechanism_declares_a_footprint() -> None:
    for name in STRATEGIES:
        system = compose(resolve(make_run_config("tiny", "tiny", name)))
        for mech in system.mechanisms.values():
            assert all(isinstance(n, Need) and n.nbytes >= 0 for n in mech.footprint()), (name, mech)


def test_an_auto_parameter_budget_is_what_the_others_leave() -> None:
    """ProTrain's ``gpu_param_buffer_gib: auto``: the budget plus the other mechanisms' GPU needs
    is the GPU's memory less the 2% headroom, when the budget is the binding part."""
    from offsim.systems._parts import AUTO_HEADROOM

    cfg = make_run_config("rtx4090-pcie4-ws", "llama2-7b", "protrain")
    system = compose(cfg)
    fetch = system.mechanisms["params"]
    gpu = [n for name, m in system.mechanisms.items() if name != "params" for n in m.footprint()
           if n.tier is Tier.GPU and n.unit_bytes == 0]
    # held needs plus forward and backward's transients (the activations), the only GPU moment
    # here (ProTrain's layer-wise step has no step transients): the others' peak in backward
    assert {n.moment for n in gpu} <= {None, Moment.FORWARD_BACKWARD}
    others = sum(n.nbytes for n in gpu)
    assert fetch.budget_bytes == pytest.approx(cfg.hardware.gpu.memory_bytes * (1 - AUTO_HEADROOM) - others, abs=1)


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("hardware,workload", [("tiny", "tiny"), ("rtx4090-pcie4-ws", "llama2-7b")])
def test_the_engine_never_holds_more_than_the_mechanisms_declare(hardware: str, workload: str, strategy: str) -> None:
    cfg = make_run_config(hardware, workload, strategy, iterations=3)
    result = simulate(cfg)
    if not result.feasible:
        pytest.skip(f"{strategy} does not fit {workload} on {hardware}")
    need = footprint(result.config).need_bytes
    peak = result.metrics.peak_bytes
    for tier in ("gpu", "host_pinned", "host", "nvme", "pfs"):
        assert getattr(peak, tier) <= need[tier] * (1 + 1e-9) + 1, (tier, getattr(peak, tier), need[tier])
