"""The CLI: every core command runs; errors are one line without a traceback."""

from __future__ import annotations

import importlib
import json
import os
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from offsim.cli import COMMAND_MODULES, app, commands

runner = CliRunner()
JSON_KEYS = {"feasible", "infeasible_reason", "iteration_time_s", "tokens_per_s", "tflops_per_gpu", "phases_s",
             "gpu_busy_fraction", "peak_bytes", "traffic_bytes"}


def test_help_of_every_command() -> None:
    listing = runner.invoke(app, ["--help"], terminal_width=200)
    assert listing.exit_code == 0
    for name in commands():
        assert re.search(rf"│ {name} ", listing.output), f"offsim --help does not list {name}"
        result = runner.invoke(app, [name, "--help"])
        assert result.exit_code == 0, name


def test_command_modules_name_what_each_module_registers() -> None:
    """:data:`offsim.cli.COMMAND_MODULES` (what start-up knows without importing) agrees with the
    modules of offsim.commands (what their ``register`` adds)."""
    import offsim.commands as package

    registered: dict[str, str] = {}
    for info in pkgutil.iter_modules(package.__path__):
        if info.name.startswith("_"):
            continue
        sub = typer.Typer()
        importlib.import_module(f"offsim.commands.{info.name}").register(sub)
        registered |= {name: info.name for name in typer.main.get_group(sub).commands}
    assert registered == COMMAND_MODULES


def _modules_after(code: str) -> set[str]:
    """The top-level packages and offsim modules a fresh interpreter holds after ``code``."""
    probe = f"{code}\nimport sys\nprint(' '.join(sys.modules))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120)
    return set(done.stdout.split())


HEAVY = ("pandas", "plotly", "dask", "distributed", "torch", "scipy", "pyarrow")


def test_importing_the_cli_imports_no_heavy_package_and_no_command_module() -> None:
    """Start-up pays for what ``offsim run`` uses only (issue 16): no pandas, plotly, Dask, PyTorch
    or SciPy, and no module of offsim.commands beyond the shared helpers."""
    loaded = _modules_after("import offsim.cli")
    assert not loaded & set(HEAVY)
    assert {m for m in loaded if m.startswith("offsim.commands.")} <= {"offsim.commands._common",
                                                                       "offsim.commands._options"}
    assert "offsim.search.protrain" not in loaded


def test_importing_the_cli_imports_neither_the_engine_nor_the_api() -> None:
    """``offsim --help`` and a command's help need no simulator (issue 16): the package's names
    are imported on first use, and ``from offsim import simulate, make_run_config`` still works."""
    loaded = _modules_after("import offsim.cli")
    assert not {"offsim.api", "offsim.engine", "offsim.simulation", "offsim.results",
                "offsim.config.accelerate", "offsim.config.ds_config", "offsim.config.megatron",
                "rich.progress"} & loaded
    used = _modules_after("from offsim import simulate, make_run_config, RunResult, load_profile\n"
                          "assert simulate.__module__ == 'offsim.api' and callable(make_run_config)")
    assert "offsim.api" in used


@pytest.mark.parametrize("first", ["offsim.policies", "offsim.engine.execute", "offsim.config.base",
                                   "offsim.schedule.ops", "offsim.mechanisms.base"])
def test_any_module_imported_first_imports(first: str) -> None:
    """Any module imports when it is the first of offsim's (``offsim.config`` once imported the
    loader eagerly, tying it and ``offsim.policies`` in a cycle that held only when
    ``offsim.config`` came first; issue 16)."""
    assert first in _modules_after(f"import {first}")


def test_importing_offsim_or_config_imports_no_input_model() -> None:
    """``import offsim`` and ``import offsim.config`` import neither the input models nor pydantic
    (issue 16: the forced ``import offsim.config`` cost every start ~110 ms of schema building);
    their public names still import on first use."""
    loaded = _modules_after("import offsim, offsim.config, offsim.core.enums")
    assert not {"pydantic", "offsim.config.loading", "offsim.config.strategy", "offsim.policies"} & loaded
    used = _modules_after("from offsim.config import HardwareProfile, Strategy, Workload, load_profile\n"
                          "assert load_profile.__module__ == 'offsim.config.loading'\n"
                          "assert Strategy.__module__ == 'offsim.config.strategy'")
    assert "offsim.config.loading" in used



def test_the_help_lists_every_command_without_importing_its_module() -> None:
    """``offsim --help`` lists the lazily registered commands from ``COMMAND_SUMMARIES`` (issue 16):
    the same text as with every command module imported, and none of them imported."""
    from offsim.cli import COMMAND_MODULES, COMMAND_SUMMARIES, commands

    loaded = commands()
    assert {name: (loaded[name].help or "").split("\n\n")[0] for name in COMMAND_MODULES} == COMMAND_SUMMARIES
    code = "from offsim.cli import app{}\ntry:\n    app(['--help'])\nexcept SystemExit:\n    pass"
    env = {**os.environ, "COLUMNS": "100"}
    lazy, full = (subprocess.run([sys.executable, "-c", code.format(extra)], capture_output=True, text=True,
                                 check=True, timeout=120, env=env).stdout
                  for extra in ("", ", commands\ncommands()"))
    assert lazy == full and "calibrate" in lazy
    assert not {m for m in _modules_after(code.format("")) if m.startswith("offsim.commands.")
                and not m.startswith("offsim.commands._")}

def test_a_run_imports_only_its_own_command() -> None:
    loaded = _modules_after("from offsim.cli import app\n"
                            "try:\n    app(['run', '-H', 'tiny', '-w', 'tiny', '-s', 'zero-offload', '-q'])\n"
                            "except SystemExit as exc:\n    assert exc.code == 0, exc.code")
    assert not loaded & {"pandas", "plotly", "dask", "torch", "scipy"}
    assert not {m for m in loaded if m.startswith("offsim.commands.") and not m.startswith("offsim.commands._")}
    assert "offsim.search.swap_amount" not in loaded  # nothing to search: zero-offload keeps its activations
    tune = _modules_after("from offsim.cli import app\ntry:\n    app(['tune', '--help'])\nexcept SystemExit:\n    pass")
    assert "offsim.commands.tune" in tune and "offsim.commands.compare" not in tune


def test_run_json_has_the_documented_keys() -> None:
    result = runner.invoke(app, ["run", "-H", "tiny", "-w", "tiny", "-s", "zero-infinity-nvme", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert set(data) >= JSON_KEYS
    assert set(data["phases_s"]) == {"forward", "backward", "optimizer"}
    assert set(data["peak_bytes"]) == {"gpu", "host_pinned", "host", "nvme", "pfs"}
    assert {"h2d", "d2h", "nvme_read", "nvme_write"} <= set(data["traffic_bytes"])
    assert data["feasible"] is True and data["iteration_time_s"] > 0


def test_run_table_and_trace(tmp_path: Path) -> None:
    trace = tmp_path / "run.json"
    result = runner.invoke(app, ["run", "-H", "tiny", "-w", "tiny", "-s", "zero-offload", "--trace", str(trace)])
    assert result.exit_code == 0, result.output
    assert "iteration time" in result.output
    events = json.loads(trace.read_text())["traceEvents"]
    assert any(e["ph"] == "X" for e in events) and any(e["ph"] == "C" for e in events)


def test_run_accepts_paths(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parent.parent
    result = runner.invoke(app, ["run", "-H", str(root / "hardware_profiles/tiny.yaml"), "-w",
                                 str(root / "workloads/tiny.yaml"), "-s", str(root / "strategies/gpu-only.yaml"),
                                 "--json"])
    assert result.exit_code == 0, result.output


def test_bad_input_is_one_message(tmp_path: Path) -> None:
    result = runner.invoke(app, ["run", "-H", "nonexistent-box", "-w", "tiny", "-s", "gpu-only"])
    assert result.exit_code == 2
    assert "unknown hardware 'nonexistent-box'" in result.output
    assert "Traceback" not in result.output


def test_infeasible_run_says_why_and_exits_1(tmp_path: Path) -> None:
    big = tmp_path / "big.yaml"
    root = Path(__file__).resolve().parent.parent
    big.write_text((root / "workloads/tiny.yaml").read_text().replace("layers: 4", "layers: 400").replace(
        "name: tiny", "name: big"))
    result = runner.invoke(app, ["run", "-H", "tiny", "-w", str(big), "-s", "gpu-only", "--json"])
    assert result.exit_code == 1
    data = json.loads(result.stdout)
    assert data["feasible"] is False and data["infeasible_reason"].startswith("gpu memory: needs")


def test_listings() -> None:
    for cmd, expect in (("profiles", "tiny"), ("workloads", "llama2-7b"), ("strategies", "zero-infinity-nvme")):
        result = runner.invoke(app, [cmd])
        assert result.exit_code == 0 and expect in result.output, cmd


def test_schema() -> None:
    result = runner.invoke(app, ["schema", "hardware"])
    assert result.exit_code == 0 and "host_link" in json.loads(result.stdout)["properties"]


def test_run_table_shows_cache_stats_for_streamed_params() -> None:
    """A strategy that streams parameters shows the GPU parameter cache's hit rate and its bytes
    beside the lower bound any policy must move (never a heuristic labelled OPT) in the human table."""
    result = runner.invoke(app, ["run", "-H", "tiny", "-w", "tiny", "-s", "zero-infinity-cpu", "--quiet"])
    assert result.exit_code == 0, result.output
    assert "cache gpu_params" in result.output
    assert "lower" in result.output and "bound" in result.output  # the cell may wrap between them
    assert "OPT" not in result.output
    assert "hardware TFLOP/s" in result.output


def test_run_table_names_the_plan_a_heuristic_without_a_bound() -> None:
    """Without cache events (no bound can be computed) the run's offline plan is shown, named
    a heuristic."""
    from offsim import make_run_config, simulate
    from offsim.commands._common import console, print_metrics_table
    from offsim.results import RunResult
    from offsim.trace import Recorder

    r = simulate(make_run_config("tiny", "tiny", "zero-infinity-cpu"))
    bare = RunResult(r.config, r.metrics, Recorder())
    with console.capture() as captured:
        print_metrics_table(bare)
    text = captured.get()
    assert "belady" in text and "(heuristic)" in text
    assert "OPT" not in text and "lower bound" not in text
