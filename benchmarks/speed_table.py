"""The simulation-speed table of issue 16, each figure a ratio to a baseline measured in the same run.

    python benchmarks/speed_table.py                    # every row (a few minutes on 2 cores)
    python benchmarks/speed_table.py --quick            # fewer repeats, a smaller sweep, no Dask
    python benchmarks/speed_table.py --old-rev 942cf07  # and a column for the old SimPy engine
    python benchmarks/speed_table.py --old-tree DIR     # and a column for the tree in DIR (its offsim/)

Rows, with their baselines:

* the whole ``offsim run`` process (Llama-2 7B, zero-offload, the CLI's defaults) against
  ``python -c "import numpy, pydantic, simpy, yaml"``;
* one GPT-3 175B zero-infinity-nvme iteration on dgx2-v100 (in-process, the mean of a 3-iteration
  run) against a raw SimPy loop of 100,000 timeouts, and the engine's events/s against the loop's;
  with its parts against the same loop: the executor's run, composing and compiling the schedule,
  and summarising the records (each the least time of one call over the runs);
* 50 iterations against 3 of the same 175B case;
* gradient accumulation of Llama-2 7B (zero-offload, rtx4090-pcie4-ws, 2 iterations, 1 warm-up)
  at ``--accumulation`` micro-batches (default the issue's 10,000), its time against the SimPy loop
  and its peak resident memory;
* the same two rows with the steady-state shortcut off (``run_schedule(steady_shortcut=False)``,
  every repetition simulated) and the layer shortcut off (every layer simulated), the
  accumulation at ``--full-accumulation`` micro-batches (default 1,000: all 10,000 take about
  four minutes), and that accumulation with the layer shortcut on (its default) against off;
* sweep points/s of a 7B grid (``sweep_throughput.py``'s 10,000 points, every ``10,000 /
  --sweep-points``-th, so all four strategies) on 2 local workers, and Dask's rate on a 2-worker
  LocalCluster against the process pool's.

Every in-process figure is taken in a fresh interpreter (so resident memory is the case's own),
which also measures its own SimPy loop. Times are CPU seconds (user + system for a whole process)
of the best of several runs, the working tree and the old revision measured in turn: on a shared
machine wall time swings with other work, CPU time much less. The sweep's rates are wall time.
``--old-rev`` runs the same probes on a ``git archive`` of that revision with
``OFFSIM_ENGINE=simpy`` (the engine that preceded the schedule executor; it was deleted after
that revision); ``--old-tree`` on a directory holding a tree already (for instance this revision
with some files as they were before a change, to measure that change alone). Prints figures only;
nothing here asserts a timing.
"""

# ruff: noqa: T201 - a benchmark prints its figures

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if "PYTHONPATH" not in os.environ:  # this checkout, not a copy installed in site-packages
    sys.path.insert(1, str(REPO))
BIG = ("dgx2-v100", "gpt3-175b", "zero-infinity-nvme")
SMALL = ("rtx4090-pcie4-ws", "llama2-7b", "zero-offload")
LOOP_EVENTS = 100_000
#: what every in-process figure and its baseline are timed with: CPU seconds of this process. On a
#: shared machine wall time swings with the other load; CPU time tracks the uncontended wall time.
clock = time.process_time


def simpy_loop_s(events: int = LOOP_EVENTS, repeats: int = 5) -> float:
    """Best wall time (s) of a bare SimPy process yielding ``events`` timeouts."""
    import simpy

    best = float("inf")
    for _ in range(repeats):
        env = simpy.Environment()

        def ticker(env: simpy.Environment = env) -> Any:
            for _ in range(events):
                yield env.timeout(1.0)

        env.process(ticker())
        t0 = clock()
        env.run()
        best = min(best, clock() - t0)
    return best


def full_simulation(layers_too: bool = True) -> None:
    """Switch the steady-state shortcut off in this process: ``simulate`` then runs every
    repetition (the explicit ``steady_shortcut`` argument of ``run_schedule``); ``layers_too``:
    and the layer shortcut (:mod:`offsim.engine.layers`, where the tree has it), so that every
    layer is simulated as well."""
    import offsim.simulation as sim

    if layers_too:
        try:
            from offsim.engine import layers
        except ImportError:  # a tree without it
            pass
        else:
            layers.DEFAULT = False
    run = sim.run_schedule

    def every_repetition(cfg: Any, sz: Any, on_iteration: Any = None, steady_shortcut: bool = True,
                         **kwargs: Any) -> Any:
        return run(cfg, sz, on_iteration, steady_shortcut=False, **kwargs)

    sim.run_schedule = every_repetition  # type: ignore[assignment]


def _simulate_best(case: tuple[str, str, str], repeats: int, **kwargs: Any) -> tuple[float, Any]:
    """Best wall time (s) of ``simulate`` on ``case`` and the last result."""
    from offsim import make_run_config, simulate

    cfg = make_run_config(*case, **kwargs)
    best, result = float("inf"), None
    for _ in range(repeats):
        t0 = clock()
        result = simulate(cfg)
        best = min(best, clock() - t0)
    return best, result


def _timed(owner: Any, name: str, best_s: dict[str, float], key: str) -> Any:
    """Wrap ``owner.name`` so that the least CPU time of one call is kept in ``best_s[key]`` (a
    call inside another's is not counted twice: the outermost call only); returns the original
    (None where the tree has no such attribute)."""
    original = getattr(owner, name, None)
    if original is None:
        return None
    depth = [0]

    def timed(*args: Any, **kwargs: Any) -> Any:
        depth[0] += 1
        t0 = clock()
        try:
            return original(*args, **kwargs)
        finally:
            depth[0] -= 1
            if not depth[0]:
                best_s[key] = min(best_s.get(key, float("inf")), clock() - t0)
    setattr(owner, name, timed)
    return original


def probe_engine(repeats: int) -> dict[str, float]:
    """One 175B iteration and the event rate, with this interpreter's SimPy loop; and the shares
    of the executor's run, of composing and compiling the schedule, and of summarising the records
    in it (the least time of each in the runs, over 3 iterations; not measured for a tree without
    the schedule executor)."""
    loop = simpy_loop_s()
    try:
        from offsim import simulation
        from offsim.engine import execute
    except ImportError:  # an old tree: the figures without the shares
        simulation = execute = None
    best_s: dict[str, float] = {}
    parts = [(getattr(execute, "Executor", None), "run", "engine"), (simulation, "compose_run", "compose"),
             (simulation, "compile_system", "compile"), (simulation, "summarize", "summarize")]
    originals = [(owner, name, _timed(owner, name, best_s, key)) for owner, name, key in parts if owner is not None]
    try:
        wall, result = _simulate_best(BIG, repeats, iterations=3)
    finally:
        for owner, name, original in originals:
            if original is not None:
                setattr(owner, name, original)
    out = {"loop_s": loop, "iteration_s": wall / 3, "events": result.events,
           "events_per_s": result.events / wall, "loop_events_per_s": LOOP_EVENTS / loop}
    out |= {f"{key}_iteration_s": s / 3 for key, s in best_s.items()}
    return out


def probe_iterations(repeats: int) -> dict[str, float]:
    """The 175B case at 3 and at 50 iterations (s)."""
    three, _ = _simulate_best(BIG, repeats, iterations=3)
    fifty, _ = _simulate_best(BIG, 1, iterations=50)
    return {"three_s": three, "fifty_s": fifty}


def probe_accumulation(micro_batches: int) -> dict[str, float]:
    """Llama-2 7B with ``micro_batches`` per step: wall time (s) and peak resident bytes."""
    from offsim import load_workload, make_run_config, simulate

    loop = simpy_loop_s()
    wl = load_workload(SMALL[1])
    wl = wl.model_copy(update={"training": wl.training.model_copy(update={"grad_accumulation": micro_batches})})
    cfg = make_run_config(SMALL[0], wl, SMALL[2], iterations=2, warmup_iterations=1)
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    t0 = clock()
    result = simulate(cfg)
    wall = clock() - t0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
    return {"loop_s": loop, "wall_s": wall, "events": result.events, "peak_rss_bytes": rss,
            "rss_before_bytes": rss_before, "feasible": float(result.feasible), "micro_batches": micro_batches}


PROBES = {"engine": probe_engine, "iterations": probe_iterations, "accumulation": probe_accumulation}


def run_probe(name: str, arg: int, tree: Path | None, shortcut: bool = True, layers: bool = False) -> dict[str, float]:
    """Run one probe in a fresh interpreter; ``tree``: an old revision's files, old engine;
    ``shortcut``: False simulates every repetition, and every layer unless ``layers`` (the layer
    shortcut left at its default)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(tree if tree is not None else REPO)  # not an installed copy
    if tree is not None:
        env["OFFSIM_ENGINE"] = "simpy"
    else:
        env.pop("OFFSIM_ENGINE", None)
    argv = [sys.executable, __file__, "--probe", name, str(arg)] + ([] if shortcut else ["--full"])
    argv += ["--layers"] if layers else []
    out = subprocess.run(argv, env=env, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def process_s(argv: list[str], repeats: int, env: dict[str, str] | None = None) -> float:
    """Best CPU time (s, user + system) of a whole Python process."""
    best = float("inf")
    for _ in range(repeats):
        t0 = _children_cpu_s()
        subprocess.run([sys.executable, *argv], check=False, env=env, capture_output=True)
        best = min(best, _children_cpu_s() - t0)
    return best


def bytecode_env(**extra: str) -> dict[str, str]:
    """This environment with every module's bytecode cached in one folder (``PYTHONPYCACHEPREFIX``)
    and written there: an installed package reads its ``.pyc`` files, and with
    ``PYTHONDONTWRITEBYTECODE=1`` (set in this project's sandbox) an offsim tree would be compiled
    from source at every start while the baseline's packages read pip's (~0.14 s, issue 16)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    return env | {"PYTHONPYCACHEPREFIX": str(Path(tempfile.gettempdir()) / "offsim-bench-pycache")} | extra


def process_row(repeats: int, tree: Path | None) -> dict[str, float]:
    """``offsim run`` (the CLI's defaults) against the bare imports, interleaved, best of each
    (bytecode cached for both: :func:`bytecode_env`; the first round only fills the cache)."""
    env = (bytecode_env(PYTHONPATH=str(tree), OFFSIM_ENGINE="simpy") if tree is not None
           else bytecode_env(PYTHONPATH=str(REPO)))
    base, run = float("inf"), float("inf")
    for i in range(repeats + 1):
        b = process_s(["-c", "import numpy, pydantic, simpy, yaml"], 1, bytecode_env())
        r = process_s(["-c", "from offsim.cli import app; app()", "run", "--quiet"], 1, env)
        if i:
            base, run = min(base, b), min(run, r)
    return {"base_s": base, "run_s": run}


def sweep_row(points: int, dask: bool) -> dict[str, float]:
    """Points/s of the 7B sweep on 2 local workers and (``dask``) on a 2-worker LocalCluster."""
    sys.path.insert(0, str(Path(__file__).parent))
    from sweep_throughput import build

    from offsim.sweep.execute import run_sweep

    plan = build(10_000, SMALL[0], SMALL[1])
    plan.points = plan.points[::max(1, len(plan.points) // points)][:points]  # across all four strategies
    with tempfile.TemporaryDirectory() as out:
        t0 = time.perf_counter()
        res = run_sweep(plan, out, workers=2)
        pool = res.new / (time.perf_counter() - t0)
    row = {"points": float(points), "pool_points_per_s": pool}
    if dask:
        from distributed import Client, LocalCluster

        with (LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cl,
              Client(cl) as client, tempfile.TemporaryDirectory() as out):
            t0 = time.perf_counter()
            res = run_sweep(plan, out, scheduler=client)
            row["dask_points_per_s"] = res.new / (time.perf_counter() - t0)
    return row


def old_tree(rev: str, into: Path) -> Path:
    """The package and data folders of ``rev`` (``git archive``) under ``into``."""
    names = ["offsim", "hardware_profiles", "workloads", "strategies"]
    archive = subprocess.run(["git", "-C", str(REPO), "archive", rev, *names], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def _ratio(x: float, base: float) -> str:
    return f"{x / base:.2f}x"


def print_table(now: dict[str, dict[str, float]], old: dict[str, dict[str, float]] | None,
                args: argparse.Namespace) -> None:
    """The issue's table: each figure, its baseline and the ratio, old engine beside."""
    rows = table_rows(now, args.accumulation) + full_rows(now, args.full_accumulation)
    old_rows = table_rows(old, args.accumulation) if old else None
    head = f"{'figure':58} {'executor':>30} {'target':>10}"
    print(head + (f" {'old tree or revision':>30}" if old_rows else ""))
    for i, (name, value, target) in enumerate(rows):
        line = f"{name:58} {value:>30} {target:>10}"
        if old_rows:
            line += f" {old_rows[i][1] if i < len(old_rows) else '':>30}"
        print(line)


def table_rows(m: dict[str, dict[str, float]], accumulation: int) -> list[tuple[str, str, str]]:
    """(figure, measured value with its ratio, target) per row of the issue's table."""
    p, e, it, ac = m["process"], m["engine"], m["iterations"], m["accumulation"]
    rows = [
        ("whole `offsim run` process / bare imports",
         f"{p['run_s']:.2f} s / {p['base_s']:.2f} s = {_ratio(p['run_s'], p['base_s'])}", "<= 1.5x"),
        ("one 175B zero-infinity-nvme iteration / 100k SimPy loop",
         f"{e['iteration_s']:.3f} s / {e['loop_s']:.3f} s = {_ratio(e['iteration_s'], e['loop_s'])}", "<= 0.3x"),
        ("the same, the executor's run alone / SimPy loop",
         (f"{e['engine_iteration_s']:.3f} s / {e['loop_s']:.3f} s = {_ratio(e['engine_iteration_s'], e['loop_s'])}"
          if "engine_iteration_s" in e else "-"), ""),
        ("the same, composing and compiling / SimPy loop",
         (f"{e['compose_iteration_s'] + e['compile_iteration_s']:.3f} s / {e['loop_s']:.3f} s = "
          f"{_ratio(e['compose_iteration_s'] + e['compile_iteration_s'], e['loop_s'])}"
          if "compile_iteration_s" in e and "compose_iteration_s" in e else "-"), ""),
        ("the same, summarising the records / SimPy loop",
         (f"{e['summarize_iteration_s']:.3f} s / {e['loop_s']:.3f} s = "
          f"{_ratio(e['summarize_iteration_s'], e['loop_s'])}" if "summarize_iteration_s" in e else "-"), ""),
        ("engine events/s / SimPy loop events/s",
         f"{e['events_per_s'] / 1e3:.0f}k / {e['loop_events_per_s'] / 1e3:.0f}k = "
         f"{e['events_per_s'] / e['loop_events_per_s']:.2f}", ">= 0.30"),
        ("175B, 50 iterations / 3 iterations",
         f"{it['fifty_s']:.2f} s / {it['three_s']:.2f} s = {_ratio(it['fifty_s'], it['three_s'])}", "<= 1.3x"),
        (f"7B, {accumulation:,} micro-batches (2 iterations) / SimPy loop",
         f"{ac['wall_s']:.2f} s / {ac['loop_s']:.3f} s = {_ratio(ac['wall_s'], ac['loop_s'])}", ""),
        (f"7B, {accumulation:,} micro-batches, peak RSS (before run)",
         f"{ac['peak_rss_bytes'] / 2**20:.0f} MiB ({ac['rss_before_bytes'] / 2**20:.0f} MiB)", "<= 500 MB*"),
    ]
    s = m.get("sweep")
    if s:
        rows.append((f"sweep, {int(s['points']):,} points, 2-worker pool: points/s",
                     f"{s['pool_points_per_s']:.1f} (10k in {1e4 / s['pool_points_per_s']:.0f} s)", "10k <= 60 s"))
        if "dask_points_per_s" in s:
            rows.append(("sweep, Dask LocalCluster / process pool",
                         f"{s['dask_points_per_s']:.1f} / {s['pool_points_per_s']:.1f} = "
                         f"{s['dask_points_per_s'] / s['pool_points_per_s']:.2f}", ">= 0.77"))
    return rows


def full_rows(m: dict[str, dict[str, float]], accumulation: int) -> list[tuple[str, str, str]]:
    """The rows measured with the steady-state shortcut off (none for an old revision)."""
    if "iterations_full" not in m:
        return []
    it, full, ac, acf = m["iterations"], m["iterations_full"], m["accumulation"], m["accumulation_full"]
    return [
        ("175B, 50 / 3 iterations, shortcut off",
         f"{full['fifty_s']:.2f} s / {full['three_s']:.2f} s = {_ratio(full['fifty_s'], full['three_s'])}", ""),
        ("175B, 50 iterations: shortcut off / on",
         f"{full['fifty_s']:.2f} s / {it['fifty_s']:.2f} s = {_ratio(full['fifty_s'], it['fifty_s'])}", ""),
        (f"7B, {accumulation:,} micro-batches, shortcut off / SimPy loop",
         f"{acf['wall_s']:.2f} s / {acf['loop_s']:.3f} s = {_ratio(acf['wall_s'], acf['loop_s'])}", ""),
        (f"7B, {accumulation:,} micro-batches, shortcut off, peak RSS",
         f"{acf['peak_rss_bytes'] / 2**20:.0f} MiB ({acf['rss_before_bytes'] / 2**20:.0f} MiB)", ""),
        ("7B accumulation, per micro-batch: shortcut off / on",
         _ratio(acf['wall_s'] / acf['micro_batches'], ac['wall_s'] / ac['micro_batches']), ""),
    ] + ([(f"7B, {accumulation:,} micro-batches, steady shortcut off: layer shortcut on / off",
           f"{m['accumulation_layers']['wall_s']:.2f} s / {acf['wall_s']:.2f} s = "
           f"{_ratio(m['accumulation_layers']['wall_s'], acf['wall_s'])}", "")] if "accumulation_layers" in m else [])


def measure(args: argparse.Namespace, tree: Path | None) -> dict[str, dict[str, float]]:
    """Every row's figures, for the working tree or (``tree``) an old revision."""
    repeats = 2 if args.quick else 5
    out = {
        "process": process_row(repeats, tree),
        "engine": run_probe("engine", repeats, tree),
        "iterations": run_probe("iterations", 1 if args.quick else 2, tree),
        "accumulation": run_probe("accumulation", args.accumulation, tree),
    }
    if tree is None:
        out["iterations_full"] = run_probe("iterations", 1, tree, shortcut=False)
        out["accumulation_full"] = run_probe("accumulation", args.full_accumulation, tree, shortcut=False)
        out["accumulation_layers"] = run_probe("accumulation", args.full_accumulation, tree, shortcut=False,
                                               layers=True)
    return out


def best_of(a: dict[str, dict[str, float]], b: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    """Per figure, the better of two rounds: least seconds and bytes, most events/s."""
    out: dict[str, dict[str, float]] = {}
    for row, figures in a.items():
        out[row] = {}
        for key, x in figures.items():
            y = b[row][key]
            out[row][key] = max(x, y) if key.endswith("_per_s") else min(x, y) if key.endswith(("_s", "_bytes")) else x
    return out


def measure_rounds(args: argparse.Namespace, tree: Path | None, rounds: int,
                   old: Path | None = None) -> tuple[dict[str, dict[str, float]], dict[str, dict[str, float]] | None]:
    """``rounds`` rounds of :func:`measure`, the working tree and (``old``) the old revision in
    turn, so that both see the same load; the best of the rounds per figure."""
    now, then = measure(args, tree), (measure(args, old) if old else None)
    for _ in range(rounds - 1):
        now = best_of(now, measure(args, tree))
        if old and then:
            then = best_of(then, measure(args, old))
    return now, then


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer repeats, a 200-point sweep, no Dask")
    ap.add_argument("--old-rev", help="also measure this revision with OFFSIM_ENGINE=simpy")
    ap.add_argument("--old-tree", help="also measure the tree in this directory (its offsim/ and data folders)")
    ap.add_argument("--accumulation", type=int, default=10_000, help="micro-batches per step (default 10,000)")
    ap.add_argument("--full-accumulation", type=int, default=1000,
                    help="micro-batches per step with the shortcut off (default 1,000)")
    ap.add_argument("--sweep-points", type=int, default=1000)
    ap.add_argument("--no-sweep", action="store_true")
    ap.add_argument("--probe", nargs=2, help=argparse.SUPPRESS)
    ap.add_argument("--full", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--layers", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.full:
        full_simulation(layers_too=not args.layers)
    if args.probe:
        print(json.dumps(PROBES[args.probe[0]](int(args.probe[1]))))
        return
    print(f"offsim speed table: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"Python {platform.python_version()}; CPU seconds (sweep: wall), best of several runs")
    rounds = 1 if args.quick else 2
    if args.old_tree:
        now, old = measure_rounds(args, None, rounds, Path(args.old_tree).resolve())
    elif args.old_rev:
        with tempfile.TemporaryDirectory() as tmp:
            now, old = measure_rounds(args, None, rounds, old_tree(args.old_rev, Path(tmp)))
    else:
        now, old = measure_rounds(args, None, rounds)
    if not args.no_sweep:
        now["sweep"] = sweep_row(200 if args.quick else args.sweep_points, dask=not args.quick)
    print_table(now, old, args)
    print("* the issue's memory target is for 10,000 micro-batches.")
    print(json.dumps({"executor": now, "old": old}), file=sys.stderr)


if __name__ == "__main__":
    main()
