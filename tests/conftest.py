"""Shared fixtures: the `tiny` profile and workload (round numbers) and small builders."""

from __future__ import annotations

import pytest
from hypothesis import strategies as hs

from offsim import load_profile, load_strategy, load_workload
from offsim.config.base import Provenance
from offsim.config.hardware import HardwareProfile
from offsim.config.strategy import Strategy
from offsim.config.workload import Workload

TEST_PROVENANCE = Provenance(kind="synthetic", source="offsim tests", date="2026-11-21")


@pytest.fixture
def tiny_profile() -> HardwareProfile:
    """1 GB/s PCIe each way, no latency, 1 TFLOP/s, 4 copy engines (hardware_profiles/tiny.yaml)."""
    return load_profile("tiny")


@pytest.fixture
def tiny_workload() -> Workload:
    """Four blocks of hidden 1024 (workloads/tiny.yaml)."""
    return load_workload("tiny")


def strategy(**fields: object) -> Strategy:
    """A Strategy for tests, from keyword fields over safe defaults."""
    base = {"name": "test", "provenance": TEST_PROVENANCE}
    return Strategy.model_validate({**base, **fields})


def preset(name: str) -> Strategy:
    """A shipped strategy preset."""
    return load_strategy(name)


@hs.composite
def small_tiny_workloads(draw: hs.DrawFn, max_accumulation: int) -> Workload:
    """``tiny`` with a random small model (1-6 layers, 4 or 8 heads) and batch (sequence 128-512,
    micro-batch 1-2, 1 to ``max_accumulation`` micro-batches, checkpointing on or off): the
    shapes the Hypothesis tests of the engine, the bound and the steady-state shortcut draw."""
    wl = load_workload("tiny")
    heads = draw(hs.sampled_from([4, 8]))
    model = wl.model.model_copy(update={
        "layers": draw(hs.integers(1, 6)), "hidden": heads * draw(hs.sampled_from([32, 64, 128])),
        "heads": heads, "ffn_hidden": draw(hs.sampled_from([512, 1024, 2048])),
    })
    training = wl.training.model_copy(update={
        "seq_len": draw(hs.sampled_from([128, 256, 512])), "micro_batch": draw(hs.integers(1, 2)),
        "grad_accumulation": draw(hs.integers(1, max_accumulation)),
        "activation_checkpointing": draw(hs.booleans()),
    })
    return wl.model_copy(update={"model": model, "training": training})
