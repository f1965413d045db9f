"""A strategy's ``system:`` names its composition: one file per system in ``offsim/systems/``."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from pydantic import Field

from offsim import load_strategy, make_run_config
from offsim.api import resolve
from offsim.config.base import Frozen
from offsim.config.loading import shipped_files
from offsim.config.strategy import known_systems
from offsim.errors import ConfigError
from offsim.systems._options import read_options
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
    foreign = type(dos).model_validate({**dos.model_dump(), "system": "twin-flow"})
    with pytest.raises(ConfigError, match=r"optimizer_split .* deep-optimizer-states"):
        compose(make_run_config("tiny", "tiny", foreign))


@pytest.mark.parametrize(("name", "field", "value", "owners"), [
    ("zero-infinity-nvme", "gpudirect_storage", True, "custom / tba-ssdtrain"),
    ("zero-infinity-nvme", "pfs_share", 0.3, "custom / mlp-offload"),
    ("zero-offload", "optimizer_schedule", "layerwise", "custom / fuyou / harmony / lsp-offload / protrain"),
    ("zero-infinity-cpu", "replicated_param_swap", True, "custom / virtual-memory-swap"),
])
def test_a_system_refuses_another_systems_mechanism(name: str, field: str, value: object, owners: str) -> None:
    """A system option set under a system that does not have the mechanism is refused, naming
    the field, the systems that have it and the way out; under ``custom`` it is accepted."""
    st = load_strategy(name)
    foreign = type(st).model_validate({**st.model_dump(), field: value})
    with pytest.raises(ConfigError, match=f"{field} = .* system {owners}.*not of system '{st.system}'"):
        compose(make_run_config("tiny", "tiny", foreign))
    mine = type(st).model_validate({**st.model_dump(), field: value, "system": "custom"})
    assert compose(make_run_config("tiny", "tiny", mine)).n_layers > 0


def test_every_system_declares_options_among_the_system_options() -> None:
    """``OPTIONS`` of each system is a subset of SYSTEM_OPTIONS; custom has them all; every
    system option is some published system's."""
    from offsim.config.strategy import SYSTEM_OPTIONS
    from offsim.systems._registry import options
    for name in known_systems():
        assert options(name) <= set(SYSTEM_OPTIONS), name
    assert options("custom") == set(SYSTEM_OPTIONS)
    assert set(SYSTEM_OPTIONS) == set().union(*(options(n) for n in known_systems() if n != "custom"))


class _TwoKnobs(Frozen):
    """A system's own options, as a new system file declares them."""

    topk_ratio: float = Field(default=0.1, gt=0, le=1)
    update_interval: int = Field(default=4, ge=1)


def test_system_options_are_read_by_the_systems_own_model() -> None:
    st = load_strategy("zero-offload").model_copy(update={"system_options": {"topk_ratio": 0.25}})
    own = read_options(st, _TwoKnobs)
    assert (own.topk_ratio, own.update_interval) == (0.25, 4)


@pytest.mark.parametrize(("options", "named"), [
    ({"topk_ratio": 1.5}, "topk_ratio"),  # out of range
    ({"topk_ratoi": 0.2}, "topk_ratoi"),  # misspelt: refused, not ignored
    ({"update_interval": "4"}, "update_interval"),  # a string where a number belongs
])
def test_wrong_system_options_name_the_strategy_system_and_field(options: dict[str, object], named: str) -> None:
    st = load_strategy("zero-offload").model_copy(update={"system_options": options})
    with pytest.raises(ConfigError, match=rf"'zero-offload': system_options of system 'zero-offload': {named}"):
        read_options(st, _TwoKnobs)


def test_a_system_without_options_refuses_system_options() -> None:
    # zero-offload has options of its own since 447c1e1 (the DeepSpeed release's z12_accum_mode and
    # ipg_buffer_factor); zero-infinity declares none
    cfg = resolve(make_run_config("tiny", "tiny", "zero-infinity-cpu"))
    cfg = cfg.model_copy(update={"strategy": cfg.strategy.model_copy(update={"system_options": {"k": 1}})})
    with pytest.raises(ConfigError, match=r"system 'zero-infinity' has no options of its own.*sets k"):
        compose(cfg)
