"""``offsim run``'s fast path (issue 16): a plain ``run`` command line is run without Typer's
parsing (:func:`offsim.cli.fast_run_args`); every other one goes to Typer. Where the fast path
takes a command line, it must give ``run`` what Typer gives it, and the process must print and
exit as it does through Typer."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import typer

from offsim.cli import app, fast_run_args

ACCEPTED = [
    ["run"],
    ["run", "-q"],
    ["run", "-H", "tiny", "-w", "tiny", "-s", "zero-offload", "--json"],
    ["run", "--hardware", "a.yaml", "--workload", "b", "--strategy", "c", "--iterations", "5", "--warmup", "0",
     "--quiet"],
    ["run", "--iterations", "1", "--warmup", "10"],
]
REFUSED = [
    [], ["fit"], ["--version"], ["run", "--help"], ["run", "--hardware=tiny"], ["run", "-Htiny"],
    ["run", "-qH", "tiny"],
    ["run", "-q", "-q"], ["run", "-H", "a", "--hardware", "b"], ["run", "-H"], ["run", "-H", ""], ["run", "-H", "-q"],
    ["run", "--iterations", "0"], ["run", "--iterations", "03"], ["run", "--iterations", "+3"],
    ["run", "--iterations", "3.0"], ["run", "--iterations", "٣"], ["run", "--warmup", "-1"], ["run", "--seed", "1"],
    ["run", "--trace", "t.json"], ["run", "--samples", "2"], ["run", "extra"],
]


def typer_params(argv: list[str]) -> dict[str, object]:
    """The parameters Typer's own parsing gives ``run`` for ``argv`` (``["run", ...]``)."""
    group = typer.main.get_command(app)
    command = group.get_command(None, "run")  # type: ignore[attr-defined]
    assert command is not None
    with command.make_context("run", list(argv[1:])) as ctx:
        return dict(ctx.params)


@pytest.mark.parametrize("argv", ACCEPTED, ids=" ".join)
def test_fast_arguments_are_typers(argv: list[str]) -> None:
    fast = fast_run_args(argv)
    assert fast is not None
    expected = typer_params(argv)
    defaults = {k: v for k, v in expected.items() if k not in fast}
    assert {**defaults, **fast} == expected


@pytest.mark.parametrize("argv", REFUSED, ids=lambda a: " ".join(a) or "(none)")
def test_other_command_lines_go_to_typer(argv: list[str]) -> None:
    assert fast_run_args(argv) is None


def _offsim(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.endswith("_COMPLETE")}
    env["COLUMNS"] = "100"
    return subprocess.run([sys.executable, "-c", "import sys; from offsim.cli import app; sys.exit(app())", *args],
                          capture_output=True, text=True, env=env, cwd=Path(__file__).parent, check=False)


@pytest.mark.parametrize("args", [
    ("run", "-H", "tiny", "-w", "tiny", "-s", "zero-offload", "-q"),  # a table
    ("run", "-H", "tiny", "-w", "tiny", "-s", "no-such-strategy"),  # bad input: exit 2, one message
])
def test_the_fast_process_prints_and_exits_as_typers(args: tuple[str, ...]) -> None:
    assert fast_run_args(list(args)) is not None
    fast = _offsim(*args)
    slow = _offsim(*args, "--seed", "0")  # --seed (no --samples: unused) sends it through Typer
    assert fast_run_args([*args, "--seed", "0"]) is None
    assert (fast.returncode, fast.stdout, fast.stderr) == (slow.returncode, slow.stdout, slow.stderr)
    assert fast.returncode in (0, 2) and (fast.stdout or fast.stderr)
