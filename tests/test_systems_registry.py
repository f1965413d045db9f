"""A strategy's ``system:`` names its composition: one file per system in ``offsim/systems/``."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from offsim import load_strategy, make_run_config
from offsim.api import resolve
from offsim.config.loading import shipped_files
from offsim.config.strategy import known_systems
from offsim.errors import ConfigError
from offsim.systems._registry import compose, system_module

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = sorted(shipped_files("strategy"))


def test_every_shipped_strategy_names_a_system_with_a_file() -> None:
    named = {load_strategy(name).system for name in SHIPPED}
    assert "custom" not in named  # shipped strategies name their system
    files = {p.stem.replace("_", "-") for p in (ROOT / "offsim/systems").glob("*.py") if not p.stem.startswith("_")}
    assert set(known_systems()) == files
    assert files - named == {"custom"}  # every system file but custom runs a shipped strategy


@pytest.mark.parametrize("name", SHIPPED)
def test_the_system_file_composes_the_strategy(name: str) -> None:
    cfg = resolve(make_run_config("tiny", "tiny", name))
    module = system_module(cfg.strategy.system)
    assert Path(module.__file__ or "").stem == cfg.strategy.system.replace("-", "_")
    assert compose(cfg).n_layers == len(compose(cfg).unit_names) > 0


def test_a_strategy_without_a_system_is_custom(tmp_path: Path) -> None:
    data = yaml.safe_load((ROOT / "strategies/zero-offload.yaml").read_text())
    data.pop("system")
    data["name"] = "mine"
    path = tmp_path / "mine.yaml"
    path.write_text(yaml.safe_dump(data))
    assert load_strategy(str(path)).system == "custom"


def test_an_unknown_system_names_the_file_the_field_and_the_known_ones(tmp_path: Path) -> None:
    data = yaml.safe_load((ROOT / "strategies/zero-offload.yaml").read_text())
    data["system"] = "zero-offlaod"
    path = tmp_path / "typo.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError) as exc:
        load_strategy(str(path))
    text = str(exc.value)
    assert str(path) in text and "system" in text and "zero-offlaod" in text and "zero-offload" in text


def test_the_perf_model_split_belongs_to_deep_optimizer_states() -> None:
    dos = load_strategy("deep-optimizer-states")
    with pytest.raises(ValueError, match="deep-optimizer-states"):
        type(dos).model_validate({**dos.model_dump(), "system": "twin-flow"})
