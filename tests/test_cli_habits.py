"""One CLI, one set of habits (issue 20): the shared options in every subcommand's help, the same
defaults, ``--version``, and every command of the README's tour run as written."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from offsim import __version__
from offsim.cli import app
from offsim.commands._common import DEFAULT_HARDWARE, DEFAULT_STRATEGY, DEFAULT_WORKLOAD

ROOT = Path(__file__).resolve().parent.parent
runner = CliRunner()

#: The options each command must list in its help.
CONFIG = ["-H", "--hardware", "-w", "--workload"]
SHARED = ["--json", "-q", "--quiet"]
OUT = ["-o", "--out"]
EXPECTED = {
    "run": [*CONFIG, "-s", "--strategy", *SHARED],
    "report": [*CONFIG, "-s", "--strategy", *SHARED, *OUT],
    "size": [*CONFIG, "-s", "--strategy", *SHARED],
    "tune": [*CONFIG, "-s", "--strategy", *SHARED, *OUT],
    "validate": [*CONFIG, *SHARED, *OUT],
    "sweep": [*SHARED, *OUT],
    "calibrate": ["-H", *SHARED, *OUT],
    "profiles": ["--json"],
    "workloads": ["--json"],
    "strategies": ["--json"],
    "compare": [*CONFIG, "-s", "--strategy", *SHARED, *OUT],
    "rok": [*CONFIG, "-s", "--strategy", *SHARED, *OUT],
    "fit": [*CONFIG, "-s", "--strategy", *SHARED],
    "schedule": [*CONFIG, "-s", "--strategy", "--json"],
}
#: Commands that simulate a number of optimizer steps: the same option for it in each.
ITERATIONS = ["run", "report", "tune", "compare", "rok", "fit", "schedule"]


def _names() -> list[str]:
    return [c.name or c.callback.__name__ for c in app.registered_commands]


def _help(command: str) -> str:
    result = runner.invoke(app, [command, "--help"], terminal_width=200)
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
    text = " ".join(_help(command).replace("│", " ").split())  # rich's table wraps long help lines
    assert re.search(r"--iterations\b", text) and "optimizer steps to simulate" in text


@pytest.mark.parametrize("command", ["run", "report", "size", "tune", "validate", "compare", "rok", "fit"])
def test_defaults_are_the_readme_main_example(command: str) -> None:
    text = " ".join(_help(command).split())
    assert DEFAULT_HARDWARE in text and DEFAULT_WORKLOAD in text
    if command in ("run", "report", "size"):
        assert DEFAULT_STRATEGY in text
    readme = (ROOT / "README.md").read_text()
    assert f"--hardware {DEFAULT_HARDWARE} --workload {DEFAULT_WORKLOAD} --strategy {DEFAULT_STRATEGY}" in readme


def test_version_flag() -> None:
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0 and result.output.strip() == f"offsim {__version__}"


def test_help_documents_the_exit_codes() -> None:
    text = " ".join(runner.invoke(app, ["--help"], terminal_width=200).output.split())
    for fragment in ("0 done", "1 the answer is no", "2 bad input", "143 stopped by SIGTERM"):
        assert fragment in text


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
