"""Every bad input of issue 20 ends in one message naming the file and field (or the option), with
the documented exit status, and never a traceback: one table, one row per case."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from offsim.cli import app

ROOT = Path(__file__).resolve().parent.parent
TINY_HW = (ROOT / "hardware_profiles" / "tiny.yaml").read_text()
TINY_WL = (ROOT / "workloads" / "tiny.yaml").read_text()
TINY_ST = (ROOT / "strategies" / "zero-infinity-nvme.yaml").read_text()
runner = CliRunner()

BOMB = "\n".join(
    [f"l0: &l0 [{', '.join(['lol'] * 9)}]"]
    + [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]" for i in range(1, 9)]
) + "\n"


def _write(tmp: Path, name: str, text: str | bytes) -> Path:
    path = tmp / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return path


def _hw(edit: Callable[[str], str]) -> Callable[[Path], list[str]]:
    """``run`` on the tiny profile with ``edit`` applied to its text."""
    return lambda tmp: ["run", "-H", str(_write(tmp, "hw.yaml", edit(TINY_HW))), "-w", "tiny", "-s", "gpu-only"]


def _st(edit: Callable[[str], str]) -> Callable[[Path], list[str]]:
    return lambda tmp: ["run", "-H", "tiny", "-w", "tiny", "-s", str(_write(tmp, "st.yaml", edit(TINY_ST)))]


def _under_file(tmp: Path) -> Path:
    _write(tmp, "plain", "x")
    return tmp / "plain" / "report.html"


# (case, arguments given a temporary folder, exit status, fragment of the message)
CASES: list[tuple[str, Callable[[Path], list[str]], int, str]] = [
    ("nan efficiency", _hw(lambda t: t.replace("[[1.0e-9, 1.0], [1.0e9, 1.0]]", "[[1.0e-9, .nan], [1.0e9, 1.0]]")),
     2, "hw.yaml: gpu.gemm_efficiency.0.1: Input should be a finite number"),
    ("inf DRAM capacity", _hw(lambda t: t.replace("capacity_gib: 64.0", "capacity_gib: .inf")),
     2, "hw.yaml: dram.capacity_gib: Input should be a finite number"),
    ("inf bandwidth", _hw(lambda t: t.replace("read_gb_per_s: 1.0", "read_gb_per_s: .inf")),
     2, "hw.yaml: nvme.read_gb_per_s: Input should be a finite number"),
    ("-inf latency", _hw(lambda t: t.replace("latency_us: 0.0\n  capacity_tb", "latency_us: -.inf\n  capacity_tb")),
     2, "hw.yaml: nvme.latency_us: Input should be a finite number"),
    ("binary file", lambda tmp: ["run", "-H", str(_write(tmp, "hw.yaml", bytes(range(256)) * 8))],
     2, "hw.yaml: a binary file, not YAML/JSON text"),
    ("not UTF-8", lambda tmp: ["run", "-H", str(_write(tmp, "hw.yaml", "name: caf\xe9\n".encode("latin-1")))],
     2, "hw.yaml: not UTF-8 text"),
    ("alias bomb", lambda tmp: ["run", "-H", str(_write(tmp, "hw.yaml", BOMB))],
     2, "hw.yaml: refused: its aliases (*name) expand to more than 200,000 values"),
    ("duplicate key", _hw(lambda t: t + "name: tiny-again\n"),
     2, "hw.yaml: not valid YAML: line 47, column 1: duplicate key 'name' (first on line 4)"),
    ("duplicate JSON key", lambda tmp: ["run", "-w", str(_write(tmp, "c.json", '{"a": 1, "a": 2}'))],
     2, "c.json: not valid YAML/JSON: duplicate key 'a'"),
    ("a folder as a file", lambda tmp: ["run", "-H", str(tmp)], 2, "is a folder, not a YAML/JSON file"),
    ("a folder named .yaml", lambda tmp: ["run", "-H", str(_mkdir(tmp / "d.yaml"))],
     2, "d.yaml: is a folder, not a YAML/JSON file"),
    ("bare-word policies", _st(lambda t: t + "policies: lru\n"),
     2, "'policies: {eviction: {kind: lru}}'"),
    ("bare-word eviction", _st(lambda t: t + "policies:\n  eviction: lru\n"),
     2, "st.yaml: policies.eviction: Input should be a valid dictionary"),
    ("markup in a name", lambda tmp: ["run", "-H", "box[calibrate]"], 2, "unknown hardware 'box[calibrate]'"),
    ("--workers 0", lambda tmp: ["sweep", str(ROOT / "sweeps" / "tiny-grid.yaml"), "-o", str(tmp / "o"),
                                 "--workers", "0"], 2, "--workers"),
    ("--workers -3", lambda tmp: ["sweep", str(ROOT / "sweeps" / "tiny-grid.yaml"), "-o", str(tmp / "o"),
                                  "--workers", "-3"], 2, "--workers"),
    ("--iterations 0", lambda tmp: ["run", "--iterations", "0"], 2, "--iterations"),
    ("sweep --out a file", lambda tmp: ["sweep", str(ROOT / "sweeps" / "tiny-grid.yaml"), "-o",
                                        str(_write(tmp, "f", "x"))], 2, "f: is a file; give a folder"),
    ("report --out a folder", lambda tmp: ["report", "-H", "tiny", "-w", "tiny", "-o", str(tmp)],
     2, "is a folder; give a file name"),
    ("report --out under a file", lambda tmp: ["report", "-H", "tiny", "-w", "tiny", "-o", str(_under_file(tmp))],
     2, "plain is a file, not a folder"),
    ("run --trace a folder", lambda tmp: ["run", "-H", "tiny", "-w", "tiny", "--trace", str(tmp)],
     2, "--trace"),
    ("tune --out under a file", lambda tmp: ["tune", "-H", "tiny", "-w", "tiny", "-o", str(_under_file(tmp))],
     2, "plain is a file, not a folder"),
    ("validate --out a folder", lambda tmp: ["validate", "-o", str(tmp)], 2, "is a folder; give a file name"),
    ("calibrate --out a file", lambda tmp: ["calibrate", "-o", str(_write(tmp, "f", "x"))],
     2, "is a file; give a folder"),
    ("schema of an unknown kind", lambda tmp: ["schema", "gpu"], 2, "'gpu' is not one of 'hardware'"),
]


def _mkdir(path: Path) -> Path:
    path.mkdir()
    return path


@pytest.mark.parametrize(("case", "args", "code", "fragment"), CASES, ids=[c[0] for c in CASES])
def test_bad_input(case: str, args: Callable[[Path], list[str]], code: int, fragment: str, tmp_path: Path) -> None:
    result = runner.invoke(app, args(tmp_path))
    assert result.exit_code == code, result.output
    assert fragment in " ".join(result.output.split()), result.output
    assert "Traceback" not in result.output
    assert not isinstance(result.exception, Exception) or isinstance(result.exception, SystemExit)


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write anywhere: the permission check cannot be seen")
def test_an_unwritable_folder_is_refused_before_work(tmp_path: Path) -> None:
    locked = _mkdir(tmp_path / "locked")
    locked.chmod(0o500)
    try:
        result = runner.invoke(app, ["report", "-H", "tiny", "-w", "tiny", "-o", str(locked / "r.html")])
    finally:
        locked.chmod(0o700)
    assert result.exit_code == 2
    assert "no permission to write in" in result.output


def test_json_output_is_strict(tmp_path: Path) -> None:
    """``--json`` never prints NaN or Infinity (Python's json would accept them; RFC 8259 does not)."""

    def refuse(token: str) -> None:
        raise AssertionError(f"non-standard JSON token {token}")

    for args in (["run", "-H", "tiny", "-w", "tiny", "-s", "zero-infinity-nvme", "--json"],
                 ["run", "-H", "tiny", "-w", "tiny", "-s", "gpu-only", "--json"],
                 ["profiles", "--json"]):
        result = runner.invoke(app, args)
        assert result.exit_code in (0, 1), result.output
        json.loads(result.stdout, parse_constant=refuse)
