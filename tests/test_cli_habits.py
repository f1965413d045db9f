"""One CLI, one set of habits (issue 20): the shared options in every subcommand's help, the same
defaults, ``--version``, and every command of the README's tour run as written."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pandas as pd
import pytest
from typer.core import TyperOption
from typer.testing import CliRunner

from offsim import __version__
from offsim.cli import app, commands
from offsim.commands import _options as opt

ROOT = Path(__file__).resolve().parent.parent
runner = CliRunner()

#: The options each command must list in its help.
CONFIG = ["-H", "--hardware", "-w", "--workload"]
SHARED = ["--json", "-q", "--quiet"]
OUT = ["-o", "--out"]
EXPECTED = {
    "run": [*CONFIG, "-s", "--strategy", *SHARED],
    "report": [*CONFIG, "-s", "--strategy", *SHARED, *OUT, "--figures"],
    "size": [*CONFIG, "-s", "--strategy", *SHARED, *OUT],
    "tune": [*CONFIG, "-s", "--strategy", *SHARED, *OUT],
    "validate": [*CONFIG, *SHARED, *OUT],
    "sweep": [*SHARED, *OUT, "--figures"],
    "calibrate": ["-H", *SHARED, *OUT],
    "profiles": ["--json"],
    "workloads": ["--json"],
    "strategies": ["--json"],
    "compare": [*CONFIG, "-s", "--strategy", *SHARED, *OUT],
    "rok": [*CONFIG, "-s", "--strategy", *SHARED, *OUT],
    "fit": [*CONFIG, "-s", "--strategy", *SHARED, *OUT],
    "schedule": [*CONFIG, "-s", "--strategy", *SHARED, *OUT],
}
#: Commands that simulate a number of optimizer steps: the same option for it in each.
ITERATIONS = ["run", "report", "tune", "compare", "rok", "fit", "schedule", "size"]


def _names() -> list[str]:
    return list(commands())


def _help(command: str) -> str:
    result = runner.invoke(app, [command, "--help"], env={"COLUMNS": "250"})  # no wrapping in a column
    assert result.exit_code == 0, result.output
    return result.output


@pytest.mark.parametrize("command", list(EXPECTED))
def test_help_lists_the_shared_options(command: str) -> None:
    assert command in _names()
    text = _help(command)
    missing = [opt for opt in EXPECTED[command] if not re.search(rf"(?<![\w-]){re.escape(opt)}(?![\w-])", text)]
    assert not missing, f"offsim {command} --help lacks {missing}"


def test_every_command_is_checked() -> None:
    assert set(_names()) - set(EXPECTED) <= {"schema", "version"}


@pytest.mark.parametrize("command", ITERATIONS)
def test_iterations_option_is_the_same_everywhere(command: str) -> None:
    iterations = _options(command)["--iterations"]
    assert iterations.help == "optimizer steps to simulate" and iterations.default == 3
    assert "--iterations" in _help(command)


def _options(command: str) -> dict[str, TyperOption]:
    """The click options of ``command`` by their first long name."""
    params = commands()[command].params
    return {next(o for o in p.opts if o.startswith("--")): p for p in params if isinstance(p, TyperOption)}


def _declaration(option: TyperOption) -> tuple[object, ...]:
    """What must match between two commands for one shared option: names, help, default, type, bounds."""
    return (tuple(sorted(option.opts)), option.help, option.default, option.type_descriptor.annotation,
            option.is_flag, option.min)


#: Options declared once and taken as they are: (option, commands that have it).
SAME_EVERYWHERE = {
    "--json": [c for c in EXPECTED if "--json" in EXPECTED[c]],
    "--quiet": [c for c in EXPECTED if "--quiet" in EXPECTED[c]],
    "--iterations": ITERATIONS,
    "--warmup": ["run", "report", "tune", "compare", "rok", "fit"],
    "--hardware": ["run", "size", "tune", "validate", "compare", "rok", "fit", "schedule"],
    "--workload": ["run", "size", "tune", "validate", "compare", "rok", "fit", "schedule"],
    "--strategy": ["run", "size", "schedule"],
    "--figures": ["report", "sweep"],
    "--samples": ["run", "compare", "validate"],
    "--seed": ["run", "compare", "validate"],
    "--assumptions": ["run", "compare", "validate"],
}


@pytest.mark.parametrize("option", list(SAME_EVERYWHERE))
def test_shared_option_is_one_declaration(option: str) -> None:
    """Names, short form, help, default and type of a shared option agree in every command
    (``validate``'s ``--iterations`` counts timed real iterations: not this option)."""
    commands = [c for c in SAME_EVERYWHERE[option] if not (c == "validate" and option == "--iterations")]
    found = {c: _declaration(_options(c)[option]) for c in commands}
    assert len(set(found.values())) == 1, found


def test_out_is_dash_o_everywhere() -> None:
    """Every command with an output file or folder names it ``-o/--out``."""
    with_out = [c for c in EXPECTED if "--out" in EXPECTED[c]]
    for command in with_out:
        assert {"-o", "--out"} <= set(_options(command)["--out"].opts), command
    others = [name for name, cmd in commands().items()
              if any("-o" in p.opts for p in cmd.params if isinstance(p, TyperOption)) and name not in with_out]
    assert others == ["strategies"]  # its -o goes with --ds-config


@pytest.mark.parametrize("command", ["run", "report", "size", "tune", "validate", "compare", "rok", "fit", "schedule"])
def test_defaults_are_the_readme_main_example(command: str) -> None:
    """``-H`` and ``-w`` default to the README's main example everywhere; ``-s`` too where the
    command takes one strategy to run as it is (``compare``, ``rok`` and ``tune`` need one with
    something to vary; ``fit`` checks every shipped one)."""
    options = _options(command)
    defaults = {"--hardware": opt.HARDWARE, "--workload": opt.WORKLOAD}
    if command in ("run", "report", "size", "schedule"):
        defaults["--strategy"] = opt.STRATEGY
    for option, default in defaults.items():
        assert options[option].default in (default, [default]), (command, option)
        assert default in _help(command), (command, option)
    readme = (ROOT / "README.md").read_text()
    assert f"--hardware {opt.HARDWARE} --workload {opt.WORKLOAD} --strategy {opt.STRATEGY}" in readme


def test_version_flag() -> None:
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0 and result.output.strip() == f"offsim {__version__}"


def test_help_documents_the_exit_codes() -> None:
    text = " ".join(runner.invoke(app, ["--help"], terminal_width=200).output.split())
    for fragment in ("0 done", "1 the answer is no", "2 bad input", "143 stopped by SIGTERM"):
        assert fragment in text


# ----------------------------------------------------------------------------- files only where asked
TINY = ["-H", "tiny", "-w", "tiny"]
SIZE = ["size", *TINY, "-s", "zero-infinity-nvme", "--target-iteration-s", "3", "--vary", "nvme_drives"]
#: Commands that can write a file, run without the option that names it.
UNASKED = {
    "run": ["run", *TINY, "-q"],
    "fit": ["fit", *TINY, "-s", "zero-offload", "-q"],
    "schedule": ["schedule", *TINY],
    "size": [*SIZE, "-q"],
    "tune": ["tune", *TINY, "--grid", "small", "-q"],
    "strategies": ["strategies", "--ds-config", "zero-offload"],
    "report": ["report", *TINY],
    "compare": ["compare", *TINY, "-q"],
    "rok": ["rok", *TINY, "-q"],
    "sweep": ["sweep", str(ROOT / "sweeps" / "tiny-grid.yaml"), "--workers", "1", "-q"],
}


@pytest.mark.parametrize("command", list(UNASKED))
def test_nothing_is_written_unasked(command: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, UNASKED[command])
    assert result.exit_code == 0, result.output
    assert list(tmp_path.iterdir()) == []


def test_fit_out_writes_the_strategies_as_csv(tmp_path: Path) -> None:
    out = tmp_path / "fit.csv"
    result = runner.invoke(app, ["fit", *TINY, "-s", "zero-offload,gpu-only", "-o", str(out), "--json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)["strategies"]
    table = pd.read_csv(out)
    assert list(tmp_path.iterdir()) == [out]
    assert list(table["strategy"]) == [r["strategy"] for r in rows]
    assert list(table["gpu_peak_bytes"]) == [r["tiers"]["gpu"]["peak_bytes"] for r in rows]
    assert list(table["iteration_time_s"]) == pytest.approx([r["iteration_time_s"] for r in rows], rel=1e-12)


def test_schedule_out_is_the_json_and_quiet_prints_nothing(tmp_path: Path) -> None:
    out = tmp_path / "schedule.json"
    args = ["schedule", *TINY, "-s", "zero-infinity-nvme"]
    quiet = runner.invoke(app, [*args, "-q", "-o", str(out)])
    assert quiet.exit_code == 0, quiet.output
    assert quiet.stdout == ""
    printed = runner.invoke(app, [*args, "--json"])
    assert json.loads(out.read_text()) == json.loads(printed.stdout)


def test_size_out_writes_every_evaluated_point(tmp_path: Path) -> None:
    out = tmp_path / "size.csv"
    result = runner.invoke(app, [*SIZE, "--iterations", "2", "-o", str(out), "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    table = pd.read_csv(out)
    assert len(table) == doc["evaluated"] and table["meets_target"].any()
    assert set(table["iterations"].dropna()) == {2}  # points the bound settled were not simulated


# ----------------------------------------------------------------------------- the README's tour
def _tour_lines() -> list[str]:
    """Every ``offsim ...`` line of the README's ``text`` blocks, comments removed."""
    readme = (ROOT / "README.md").read_text()
    lines = []
    for block in re.findall(r"```text\n(.*?)```", readme, flags=re.S):
        for line in block.splitlines():
            command = re.split(r"\s{2,}#", line)[0].strip()
            if command.startswith("offsim "):
                lines.append(command)
    return lines


#: Exit statuses the README documents for a command that ran as written (0 done, 1 the answer is no).
DOCUMENTED = {0, 1}
#: What a command that needs a GPU may answer on a machine without one (exit 2, and this message).
NEEDS_GPU = ("--real needs PyTorch", "no CUDA device")


@pytest.fixture(scope="module")
def tour_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh folder with the repository's data folders, where the tour's files are written."""
    folder = tmp_path_factory.mktemp("tour")
    for name in ("hardware_profiles", "workloads", "strategies", "sweeps", "tests"):
        (folder / name).symlink_to(ROOT / name)
    return folder


def test_the_tour_is_found() -> None:
    lines = _tour_lines()
    assert len(lines) >= 15
    assert any(line.startswith("offsim sweep") for line in lines)


@pytest.mark.slow
@pytest.mark.parametrize("line", _tour_lines())
def test_readme_tour_runs_as_written(line: str, tour_dir: Path) -> None:
    if shutil.which("offsim") is None:
        pytest.skip("the offsim command is not installed")
    done = subprocess.run(["bash", "-c", line], cwd=tour_dir, capture_output=True, text=True, timeout=300)
    output = done.stdout + done.stderr
    assert "Traceback" not in output, output
    if done.returncode == 2 and any(m in done.stderr for m in NEEDS_GPU):
        pytest.skip(f"needs a GPU machine: {shlex.split(line)[:3]}")
    assert done.returncode in DOCUMENTED, f"{line}\nexit {done.returncode}\n{output[-2000:]}"
