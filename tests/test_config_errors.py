"""Bad input fails at load time with the file, the field and what was expected."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from offsim.config.loading import load_profile, load_strategy, load_workload, read_yaml
from offsim.config.run import make_run_config
from offsim.errors import ConfigError

ROOT = Path(__file__).resolve().parent.parent


def _variant(tmp_path: Path, src: Path, edit, name: str = "bad.yaml") -> Path:
    data = yaml.safe_load(src.read_text())
    edit(data)
    out = tmp_path / name
    out.write_text(yaml.safe_dump(data))
    return out


def test_missing_field_names_file_and_field(tmp_path: Path) -> None:
    bad = _variant(tmp_path, ROOT / "hardware_profiles/tiny.yaml", lambda d: d["gpu"].pop("memory_gib"))
    with pytest.raises(ConfigError) as exc:
        load_profile(str(bad))
    assert str(bad) in str(exc.value) and "gpu.memory_gib" in str(exc.value) and "missing" in str(exc.value)


def test_negative_bandwidth_is_refused(tmp_path: Path) -> None:
    bad = _variant(tmp_path, ROOT / "hardware_profiles/tiny.yaml",
                   lambda d: d["host_link"]["h2d"]["pinned"].update(bandwidth_gb_per_s=-1.0))
    message = r"host_link\.h2d\.pinned\.bandwidth_gb_per_s: Input should be greater than 0"
    with pytest.raises(ConfigError, match=message):
        load_profile(str(bad))


def test_string_where_number_expected_is_refused(tmp_path: Path) -> None:
    bad = _variant(tmp_path, ROOT / "hardware_profiles/tiny.yaml", lambda d: d["dram"].update(capacity_gib="lots"))
    with pytest.raises(ConfigError, match=r"dram\.capacity_gib"):
        load_profile(str(bad))


def test_unknown_field_is_refused(tmp_path: Path) -> None:
    bad = _variant(tmp_path, ROOT / "hardware_profiles/tiny.yaml", lambda d: d["gpu"].update(memroy_gib=3.0))
    with pytest.raises(ConfigError, match=r"gpu\.memroy_gib: unknown field"):
        load_profile(str(bad))


def test_shape_that_does_not_divide(tmp_path: Path) -> None:
    bad = _variant(tmp_path, ROOT / "workloads/tiny.yaml", lambda d: d["model"].update(heads=7))
    with pytest.raises(ConfigError, match=r"bad\.yaml: model: .*hidden \(1024\) must be divisible by heads \(7\)"):
        load_workload(str(bad))


def test_inconsistent_strategy(tmp_path: Path) -> None:
    bad = _variant(tmp_path, ROOT / "strategies/zero-offload.yaml", lambda d: d.update(zero_stage=1, placement={
        "params": "cpu", "grads": "cpu", "optimizer_states": "cpu", "activations": "gpu"}))
    with pytest.raises(ConfigError, match=r"placement.params 'cpu' \(parameter offload\) needs zero_stage 3"):
        load_strategy(str(bad))


def test_nvme_placement_without_nvme(tmp_path: Path) -> None:
    no_nvme = _variant(tmp_path, ROOT / "hardware_profiles/tiny.yaml", lambda d: d.pop("nvme"), "no-nvme.yaml")
    with pytest.raises(ConfigError, match=r"places placement.params, placement.grads, placement.optimizer_states "
                                          r"on nvme but hardware profile 'tiny' has no nvme block"):
        make_run_config(str(no_nvme), "tiny", "zero-infinity-nvme")


def test_unknown_name_lists_shipped(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"unknown strategy 'zero-offlaod'. Shipped: .*zero-offload"):
        load_strategy("zero-offlaod")


def test_syntax_error_names_file(tmp_path: Path) -> None:
    bad = tmp_path / "broken.yaml"
    bad.write_text("gpu: [unclosed\n")
    with pytest.raises(ConfigError, match=r"broken\.yaml: not valid YAML"):
        read_yaml(bad)


def test_scientific_notation_reads_as_float(tmp_path: Path) -> None:
    f = tmp_path / "x.yaml"
    f.write_text("a: 1e9\nb: 5e-3\nc: 12\n")
    assert read_yaml(f) == {"a": 1e9, "b": 5e-3, "c": 12}


def test_infeasible_config_reports_tier_need_and_capacity() -> None:
    from offsim import simulate

    tiny = load_profile("tiny")
    tiny_gpu = tiny.model_copy(update={"gpu": tiny.gpu.model_copy(update={"memory_gib": 0.5})})
    r = simulate(make_run_config(tiny_gpu, "tiny", "gpu-only"))
    assert not r.feasible
    assert r.metrics.infeasible_tier == "gpu"
    assert r.metrics.infeasible_reason.startswith("gpu memory: needs ")
    assert "but has 0.50 GiB" in r.metrics.infeasible_reason
