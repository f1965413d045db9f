"""The whole ``offsim run`` process against the bare imports, measured in the same run (issue 16).

    python benchmarks/bench_process.py                  # 15 rounds
    python benchmarks/bench_process.py -n 31 --json
    python benchmarks/bench_process.py -n 9 --repeats 3  # and each ratio's range over 3 repeats
    python benchmarks/bench_process.py --rev 52a8555 --rev HEAD  # and those of committed revisions

Each round starts, one after the other, a fresh interpreter for each of:

* the baseline: ``python -c "import numpy, pydantic, simpy, yaml"``;
* ``offsim run`` with the README's main example (``-H rtx4090-pcie4-ws -w llama2-7b -s
  zero-offload``, ``-q``), started as the ``offsim`` console script starts it;
* ``offsim --help`` (start-up and the listing of every command, no simulation);
* ``import offsim`` (what every library use and every ``offsim.*`` import pays first);

and prints, per process, the median wall time and the median CPU time (user + system of the
child) over the rounds, and each as a ratio to the baseline's.

Bytecode: every process reads its modules' compiled bytecode from one cache folder made for the
run (``PYTHONPYCACHEPREFIX``; the warm-up round fills it), as an installed package does from its
``__pycache__``. A process started with ``PYTHONDONTWRITEBYTECODE=1`` (this project's sandbox
sets it) and no cache compiles every offsim module from source at each start (~0.14 s of the
0.55 s measured so before 2026-11-25) while the baseline's packages read the ``.pyc`` files pip
wrote: the row ``offsim run (source compiled at start)`` measures that condition in the same
rounds. ``--rev`` (repeatable) adds the two
offsim processes of a ``git archive`` of that revision (run in it, on ``PYTHONPATH``) to every round. Interleaving
the rounds lets all of them see the same load on a shared machine. Prints figures only; nothing
here asserts a timing (``tests/test_cli.py`` checks what start-up imports).
"""

# ruff: noqa: T201 - a benchmark prints its figures

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

MAIN_EXAMPLE = ["-H", "rtx4090-pcie4-ws", "-w", "llama2-7b", "-s", "zero-offload"]
ENTRY = "import sys; from offsim.cli import app; sys.exit(app())"  # what the console script runs
PROCESSES = {
    "bare imports": ["-c", "import numpy, pydantic, simpy, yaml"],
    "offsim run (main example)": ["-c", ENTRY, "run", *MAIN_EXAMPLE, "-q"],
    "offsim --help": ["-c", ENTRY, "--help"],
    "import offsim": ["-c", "import offsim"],
}
#: the process run without the bytecode cache (``-B``: offsim compiled from source at each start,
#: the other packages read from their own ``__pycache__``)
NO_CACHE = "offsim run (source compiled at start)"
#: the bytecode cache of every process of a run (set by :func:`main`)
PYCACHE: dict[str, str] = {}


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


Process = tuple[list[str], Path]  # argv after the interpreter; the tree it runs in (first on sys.path)


def timed(process: Process) -> tuple[float, float]:
    """(wall s, CPU s) of one fresh interpreter; fails if it exits non-zero."""
    argv, tree = process
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE", "PYTHONPYCACHEPREFIX")}
    env["PYTHONPATH"] = str(tree)
    if argv[0] == "-B":  # the installed packages' own .pyc files; offsim's tree has none and gets none
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        argv = argv[1:]
    else:
        env |= PYCACHE
    cpu0, wall0 = _children_cpu_s(), time.perf_counter()
    subprocess.run([sys.executable, *argv], check=True, capture_output=True, cwd=tree, env=env)
    return time.perf_counter() - wall0, _children_cpu_s() - cpu0


def processes(trees: dict[str, Path]) -> dict[str, Process]:
    """The processes of a round: :data:`PROCESSES` in this working tree, and the offsim ones in
    each revision's tree of ``trees``."""
    out: dict[str, Process] = {name: (argv, REPO) for name, argv in PROCESSES.items()}
    out[NO_CACHE] = (["-B", *PROCESSES["offsim run (main example)"]], REPO)
    for rev, tree in trees.items():
        out |= {f"{name} @ {rev}": (argv, tree) for name, argv in PROCESSES.items() if name != "bare imports"}
    return out


def measure(rounds: int, runs: dict[str, Process]) -> dict[str, dict[str, float]]:
    """Median wall and CPU seconds per process over ``rounds`` interleaved rounds (one warm-up)."""
    for process in runs.values():  # warm the file cache and the .pyc files
        timed(process)
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in runs}
    for _ in range(rounds):
        for name, process in runs.items():
            samples[name].append(timed(process))
    return {name: {"wall_s": statistics.median(w for w, _ in got), "cpu_s": statistics.median(c for _, c in got)}
            for name, got in samples.items()}


def archive(rev: str, folder: Path) -> Path:
    """The tree of ``rev`` (``git archive``), unpacked into ``folder``."""
    folder.mkdir()
    tar = subprocess.run(["git", "-C", str(REPO), "archive", rev], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(folder)], input=tar, check=True)
    return folder


def report(figures: list[dict[str, dict[str, float]]]) -> None:
    """Print each process's median wall and CPU time and its ratio to the bare imports'; with
    several repeats, the ratios' range over them (each repeat's ratio of its own medians)."""
    def ratios(key: str, name: str) -> list[float]:
        return [f[name][key] / f["bare imports"][key] for f in figures]

    last = figures[-1]
    print(f"{'process':<40} {'wall':>8} {'/ bare':>7} {'CPU':>8} {'/ bare':>7}"
          + ("   wall / bare, CPU / bare over the repeats" if len(figures) > 1 else ""))
    for name, f in last.items():
        wall, cpu = ratios("wall_s", name), ratios("cpu_s", name)
        spread = (f"   {min(wall):.2f}-{max(wall):.2f}x, {min(cpu):.2f}-{max(cpu):.2f}x"
                  if len(figures) > 1 else "")
        print(f"{name:<40} {f['wall_s']:>7.3f}s {wall[-1]:>6.2f}x {f['cpu_s']:>7.3f}s {cpu[-1]:>6.2f}x{spread}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", "--rounds", type=int, default=15, help="rounds (median over them; default 15)")
    ap.add_argument("--repeats", type=int, default=1,
                    help="measure this many times (each its own rounds and medians); the table is the "
                         "last one's, with each ratio's range over all of them (default 1)")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON (a list, one per repeat)")
    ap.add_argument("--rev", action="append", default=[],
                    help="also measure the offsim processes of this git revision (repeatable)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        PYCACHE["PYTHONPYCACHEPREFIX"] = str(Path(tmp) / "pycache")
        trees = {rev: archive(rev, Path(tmp) / str(i)) for i, rev in enumerate(args.rev)}
        figures = [measure(args.rounds, processes(trees)) for _ in range(args.repeats)]
    if args.json:
        print(json.dumps(figures if args.repeats > 1 else figures[0], indent=2))
        return
    print(f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, Python "
          f"{platform.python_version()}; median of {args.rounds} rounds, {args.repeats} repeat(s); load "
          f"average {os.getloadavg()[0]:.1f}")
    report(figures)


if __name__ == "__main__":
    main()
