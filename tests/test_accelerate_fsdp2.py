"""Accelerate FSDP configs with ``fsdp_offload_params`` run on the ``fsdp2-cpu-offload`` system
(issue 17 item 2): FSDP2 and FSDP1's offload, resharding, activation checkpointing and what is
ignored or approximated."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from offsim import load_strategy, make_run_config, simulate
from offsim.config.accelerate import FSDP_OFFLOAD_SYSTEM, KEEP_GATHERED_PARAMS, reading_from_accelerate
from offsim.config.reading import Reading
from offsim.plan.footprint import state_sizes
from offsim.systems._options import read_options
from offsim.systems.fsdp2_cpu_offload import Options

DATA = Path(__file__).parent / "data" / "user_configs"
SHIPPED = load_strategy(FSDP_OFFLOAD_SYSTEM)
#: the fields the system reads (its module docstring): the same in a mapped file and the shipped strategy
SYSTEM_FIELDS = ("system", "zero_stage", "placement", "optimizer_device", "pin_memory", "prefetch_depth",
                 "reuse_distance_params")


def fsdp(**keys: Any) -> Reading:
    return reading_from_accelerate({"distributed_type": "FSDP", "mixed_precision": "bf16", "fsdp_config": keys},
                                   Path("acc.yaml"))


def test_fsdp2_offload_is_the_shipped_system() -> None:
    """The example file (FSDP2, offload, reshard, activation checkpointing) sets what the shipped
    strategy sets, the system's options at their defaults, and checkpointing on; it simulates as
    the shipped strategy with checkpointing does."""
    cfg = make_run_config("tiny", "tiny", str(DATA / "accelerate_fsdp2_offload.yaml"))
    st = cfg.strategy
    assert {f: getattr(st, f) for f in SYSTEM_FIELDS} == {f: getattr(SHIPPED, f) for f in SYSTEM_FIELDS}
    assert read_options(st, Options) == read_options(SHIPPED, Options)
    assert st.activation_checkpointing is True
    assert any("fsdp_cpu_ram_efficient_loading" in n and "ignored" in n for n in cfg.notes)
    shipped = make_run_config("tiny", cfg.workload, SHIPPED.model_copy(update={"activation_checkpointing": True}))
    a, b = simulate(cfg).metrics, simulate(shipped).metrics
    assert a.feasible and a.iteration_time_s == b.iteration_time_s
    assert a.traffic_bytes == b.traffic_bytes and a.peak_bytes == b.peak_bytes


def test_fsdp1_offload_maps_onto_the_same_system_and_says_how_it_differs() -> None:
    r = fsdp(fsdp_offload_params=True)  # fsdp_version 1, FULL_SHARD: accelerate launch's defaults
    assert r.strategy.system == FSDP_OFFLOAD_SYSTEM and r.strategy.reuse_distance_params == 0.0
    assert any(a.startswith("fsdp_version 1: FSDP1's CPUOffload") for a in r.approximations)
    assert not any(a.startswith("fsdp_version 1") for a in fsdp(fsdp_version=2, fsdp_offload_params=True)
                   .approximations)


@pytest.mark.parametrize("keys", [{"fsdp_version": 2, "fsdp_reshard_after_forward": False},
                                  {"fsdp_version": 1, "fsdp_sharding_strategy": "SHARD_GRAD_OP"}])
def test_kept_after_forward_copies_each_shard_up_once(keys: dict[str, Any]) -> None:
    """reshard_after_forward false / SHARD_GRAD_OP: the unit stays gathered until its backward, so
    each fp32 shard goes up once per step (4 B x P), not twice."""
    r = fsdp(fsdp_offload_params=True, **keys)
    assert r.strategy.zero_stage == 3 and r.strategy.reuse_distance_params == KEEP_GATHERED_PARAMS
    assert not any("simulated as full sharding" in a for a in r.approximations)
    cfg = make_run_config("tiny", "tiny", r.strategy)
    m = simulate(cfg).metrics
    assert m.traffic_bytes.h2d == 4 * state_sizes(cfg).params_total


def test_without_offload_the_mapping_is_unchanged() -> None:
    r = fsdp(fsdp_version=2)
    assert r.strategy.system == "custom" and r.strategy.optimizer_device == "gpu"
    assert not any("fsdp_offload_params" in a for a in r.approximations)


def test_hybrid_sharding_with_offload_keeps_its_approximation() -> None:
    r = fsdp(fsdp_offload_params=True, fsdp_sharding_strategy="HYBRID_SHARD")
    assert r.strategy.system == FSDP_OFFLOAD_SYSTEM
    assert any(a.startswith("fsdp_sharding_strategy HYBRID_SHARD") for a in r.approximations)
