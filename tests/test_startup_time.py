"""What ``offsim run`` pays before it simulates (issue 16), without changing what it reads.

* Data files are parsed by libyaml's parser where PyYAML has it, composed and constructed by
  PyYAML's Python code (:func:`offsim.config.loading._libyaml_loader`); a text that libyaml
  might read differently (a tab), nests past ``LIBYAML_MAX_DEPTH``, or that libyaml refuses, is
  read by the pure-Python loader as before, with its messages.
* Input models build their validators when they first validate (``defer_build``).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from offsim.config import loading
from offsim.config.loading import read_yaml
from offsim.errors import ConfigError

needs_libyaml = pytest.mark.skipif(loading._libyaml_loader() is None, reason="PyYAML without libyaml")

SHIPPED = sorted(p for kind in loading.KIND_DIRS for p in loading.shipped_files(kind).values())


def _load(loader_class: Any, text: str) -> Any:
    loader = loader_class(text)
    try:
        node = loader.get_single_node()
        return None if node is None else loader.construct_document(node)
    finally:
        loader.dispose()


@needs_libyaml
@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_libyaml_reads_each_shipped_file_as_pyyaml_does(path: Path) -> None:
    text = path.read_text()
    assert _load(loading._libyaml_loader(), text) == _load(loading._Loader, text)


@needs_libyaml
def test_a_shipped_file_is_read_without_the_python_parser(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fast path is taken (the Python loader, made to fail here, is not reached)."""

    def refuse(text: str) -> None:
        raise AssertionError("the pure-Python loader was used")

    monkeypatch.setattr(loading, "_Loader", refuse)
    data = read_yaml(loading.resolve_path("hardware", "rtx4090-pcie4-ws"))
    assert data["name"] == "rtx4090-pcie4-ws"


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "f.yaml"
    path.write_text(text)
    return path


def test_a_tab_separator_is_refused_as_pyyaml_refuses_it(tmp_path: Path) -> None:
    """libyaml reads ``a:<tab>1`` as ``{a: 1}``; PyYAML refuses it, and so does offsim, as before."""
    with pytest.raises(ConfigError, match=r"line 1, column 3: found character '\\t' that cannot start any token"):
        read_yaml(_write(tmp_path, "a:\t1\n"))


def test_a_deeply_nested_file_is_refused_not_crashed(tmp_path: Path) -> None:
    """100,000 nested lists: ``yaml.CSafeLoader``'s C composer overflows the C stack (the process
    dies); offsim composes in Python and reports it."""
    with pytest.raises(ConfigError, match="nested too deeply to be a data file"):
        read_yaml(_write(tmp_path, "[" * 100_000 + "]" * 100_000))


@needs_libyaml
def test_past_the_depth_limit_the_python_loader_reads_it(tmp_path: Path) -> None:
    depth = loading.LIBYAML_MAX_DEPTH + 1
    text = "[" * depth + "]" * depth
    with pytest.raises(loading._TooDeepError):
        _load(loading._libyaml_loader(), text)
    value = read_yaml(_write(tmp_path, text))
    for _ in range(depth - 1):
        value = value[0]
    assert value == []


def test_what_libyaml_refuses_is_read_by_pyyaml(tmp_path: Path) -> None:
    """libyaml refuses a ``%YAML 1.3`` directive ("found incompatible YAML document"); PyYAML
    reads the document, as offsim did before."""
    assert read_yaml(_write(tmp_path, "%YAML 1.3\n--- {a: 1}\n")) == {"a": 1}


def test_errors_keep_pyyaml_messages(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"line 4, column 1: duplicate key 'a' \(first on line 1\)"):
        read_yaml(_write(tmp_path, "a: 1\nb:\n  c: 2\na: 3\n"))
    with pytest.raises(ConfigError, match="line 1, column 5: mapping values are not allowed here"):
        read_yaml(_write(tmp_path, "a: b: c\n"))


def test_yaml_1_2_floats_and_aliases(tmp_path: Path) -> None:
    text = "a: 1e9\nb: &x [1, {c: .inf}]\nd: *x\n<<: {e: 2}\n"
    assert read_yaml(_write(tmp_path, text)) == {"a": 1e9, "b": [1, {"c": float("inf")}],
                                                 "d": [1, {"c": float("inf")}], "e": 2}


def test_input_models_are_built_on_first_validation() -> None:
    """Importing the loader builds no validator for a policy the default strategy does not name;
    validating one builds it."""
    code = ("from offsim.config.loading import load_strategy\n"
            "from offsim.policies.opt import OptConfig\n"
            "before = OptConfig.__pydantic_complete__\n"
            "OptConfig.model_validate({'kind': 'opt'})\n"
            "print(before, OptConfig.__pydantic_complete__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.split() == ["False", "True"]


def test_a_command_runs_with_few_young_collections(monkeypatch: pytest.MonkeyPatch) -> None:
    """During a command the youngest generation is collected every 100,000 allocations; the
    thresholds before it are restored after, also when it exits with a status."""
    import gc

    import typer
    from typer.testing import CliRunner

    from offsim import cli

    seen: list[tuple[int, ...]] = []
    monkeypatch.setattr(typer, "echo", lambda *a, **k: seen.append(gc.get_threshold()))
    before = gc.get_threshold()
    result = CliRunner().invoke(cli.app, ["version"])
    assert result.exit_code == 0
    assert seen == [(100_000, *before[1:])]
    assert gc.get_threshold() == before
    with cli.few_collections(), pytest.raises(SystemExit):
        raise SystemExit(2)
    assert gc.get_threshold() == before
