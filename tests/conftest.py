"""Shared fixtures: the `tiny` profile and workload (round numbers) and small builders."""

from __future__ import annotations

import pytest

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
