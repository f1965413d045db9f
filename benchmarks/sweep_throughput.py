"""Sweep throughput: points per second locally (process pool) and on a 2-worker Dask LocalCluster.

The sweep is a grid over a 7B model (llama2-7b by default) on one machine profile: four offload
strategies x DRAM size x NVMe drives x PCIe generation x prefetch depth x micro-batch x sequence
length x CPU cores, cut to ``--points`` points in grid order. Every point is simulated (the
pre-filter settles only the points that do not fit in memory; the profile has no prices, so no
point is pruned as dominated). Results go to a temporary folder that is deleted afterwards.

    python benchmarks/sweep_throughput.py                       # 10,000 points, local and Dask
    python benchmarks/sweep_throughput.py --points 2000 --mode local
    python benchmarks/sweep_throughput.py --profile 300         # where one worker's time goes
    python benchmarks/sweep_throughput.py --points 2000 --worker  # one pool worker's share, timed
    python benchmarks/sweep_throughput.py --points 2000 --worker --profile 1  # ... and profiled

Prints figures only; nothing here asserts a timing.
"""

# ruff: noqa: T201 - a benchmark prints its figures

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import random
import resource
import sys
import tempfile
import time
from pathlib import Path

if "PYTHONPATH" not in os.environ:  # this checkout, not a copy installed in site-packages
    sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

from offsim.sweep.evaluate import Payload, run_chunk
from offsim.sweep.execute import run_sweep
from offsim.sweep.spec import SweepPlan, make_plan

GRID = {
    "strategy": ["zero-offload", "zero-offload-dpu", "zero-infinity-cpu", "zero-infinity-nvme"],
    "dram_gib": [128, 256, 384, 512, 768],
    "nvme_drives": [1, 2, 4, 8],
    "pcie_gen": [3, 4, 5],
    "prefetch_depth": [1, 2, 4],
    "micro_batch": [1, 2],
    "seq_len": [1024, 2048, 4096],
    "cpu_cores": [16, 32, 64],
}


def build(points: int, hardware: str, workload: str) -> SweepPlan:
    """The benchmark plan, cut to ``points`` points."""
    plan = make_plan(hardware, workload, GRID["strategy"][0], grid=GRID, name="throughput")
    plan.points = plan.points[:points]
    return plan


def cpu_s(who: int | None = None) -> float:
    """CPU seconds (user + system) of this process and of its children that have ended (``who``:
    ``resource.RUSAGE_SELF`` or ``RUSAGE_CHILDREN`` alone)."""
    total = 0.0
    for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN) if who is None else (who,):
        use = resource.getrusage(w)
        total += use.ru_utime + use.ru_stime
    return total


def run_local(plan: SweepPlan, workers: int, prefilter: bool) -> None:
    with tempfile.TemporaryDirectory() as out:
        t0, c0, own0 = time.perf_counter(), cpu_s(), cpu_s(resource.RUSAGE_SELF)
        res = run_sweep(plan, out, workers=workers, prefilter=prefilter)  # the pool has ended on return
        wall, cpu, own = time.perf_counter() - t0, cpu_s() - c0, cpu_s(resource.RUSAGE_SELF) - own0
    report(f"local process pool, {workers} workers", res, wall, cpu)
    print(f"  of which the sweep's own process: {own:.1f} s")


def run_dask(plan: SweepPlan, workers: int, prefilter: bool) -> None:
    from distributed import Client, LocalCluster

    t0, c0 = time.perf_counter(), cpu_s()
    with (
        LocalCluster(
            n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None
        ) as cluster,
        Client(cluster) as client,
        tempfile.TemporaryDirectory() as out,
    ):
        started = time.perf_counter() - t0
        t1 = time.perf_counter()
        res = run_sweep(plan, out, scheduler=client, prefilter=prefilter)
        wall = time.perf_counter() - t1
    cpu = cpu_s() - c0  # the workers have ended: their CPU is counted, the cluster's start and stop too
    report(f"Dask LocalCluster, {workers} workers (cluster start {started:.1f} s, not counted)", res, wall, cpu)


def report(name: str, res, wall: float, cpu: float) -> None:
    """Points/s of wall time, and the CPU seconds all processes spent (on a machine shared with
    other work the wall time swings; CPU over the workers is what the sweep costs)."""
    counts = res.frame["status"].value_counts().to_dict()
    print(f"{name}: {res.new} points in {wall:.1f} s = {res.new / wall:.1f} points/s  {counts}")
    print(f"  CPU, every process: {cpu:.1f} s ({1000 * cpu / max(1, res.new):.1f} ms a point)")
    if res.new:
        print(f"  10,000 points would take {10_000 / (res.new / wall) / 60:.1f} min at this rate")


def profile(plan: SweepPlan, n: int) -> None:
    """cProfile of one worker evaluating ``n`` points in this process."""
    payload = Payload.from_plan(plan, prefilter=True)
    sample = random.Random(0).sample(plan.points, min(n, len(plan.points)))  # across the whole grid
    items = [(p.index, p.point_id, p.overrides) for p in sample]
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.enable()
    rows = run_chunk(payload, items)
    prof.disable()
    wall = time.perf_counter() - t0
    n = len(rows)
    statuses = {s: sum(r["status"] == s for r in rows) for s in {r["status"] for r in rows}}
    print(
        f"one process: {n} points in {wall:.2f} s = {n / wall:.1f} points/s "
        f"(mean {1000 * wall / n:.1f} ms/point, "
        f"{sum(r.get('events') or 0 for r in rows) / n:,.0f} events/point) "
        f"{statuses}"
    )
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("cumulative").print_stats(25)
    print(out.getvalue())


def worker_share(plan: SweepPlan, workers: int, profiled: bool) -> None:
    """One pool worker's share of the sweep in this process, as the pool deals it: every
    ``workers``-th chunk of the grid, reusing runs (:func:`offsim.engine.reuse.enable`), timed
    in CPU seconds of this process (and profiled with ``profiled``)."""
    from offsim.engine import reuse
    from offsim.sweep.execute import _chunks, hardware_axis_keys

    payload = Payload.from_plan(plan, prefilter=True)
    share = _chunks(plan.points, workers, hardware_axis_keys(plan))[::workers]
    memo = reuse.RunMemo()
    prof = cProfile.Profile() if profiled else None
    c0, t0 = cpu_s(resource.RUSAGE_SELF), time.perf_counter()
    with reuse.reusing(memo):
        if prof is not None:
            prof.enable()
        rows = [row for items in share for row in run_chunk(payload, items)]
        if prof is not None:
            prof.disable()
    cpu, wall = cpu_s(resource.RUSAGE_SELF) - c0, time.perf_counter() - t0
    statuses = {s: sum(r["status"] == s for r in rows) for s in sorted({r["status"] for r in rows})}
    print(f"one worker's share: {len(rows)} points, {cpu:.2f} s CPU ({1000 * cpu / len(rows):.2f} ms a point), "
          f"{wall:.2f} s wall; runs reused {memo.hits}, look-ups missed {memo.misses}, "
          f"compiles shared {getattr(memo, 'compiles_saved', '-')}; {statuses}")
    if prof is not None:
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("cumulative").print_stats(45)
        print(out.getvalue())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--points", type=int, default=10_000)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--hardware", default="rtx4090-pcie4-ws")
    ap.add_argument("--workload", default="llama2-7b")
    ap.add_argument("--mode", choices=["local", "dask", "both"], default="both")
    ap.add_argument("--no-prefilter", dest="prefilter", action="store_false")
    ap.add_argument("--profile", type=int, default=0, help="instead: profile N points in one process")
    ap.add_argument("--worker", action="store_true",
                    help="instead: time one pool worker's share in this process (with --profile: profile it)")
    args = ap.parse_args()
    plan = build(args.points, args.hardware, args.workload)
    print(f"{len(plan.points)} points of {args.workload} on {args.hardware}; {os.cpu_count()} cores")
    if args.worker:
        worker_share(plan, args.workers, bool(args.profile))
        return
    if args.profile:
        profile(plan, args.profile)
        return
    if args.mode in ("local", "both"):
        run_local(plan, args.workers, args.prefilter)
    if args.mode in ("dask", "both"):
        run_dask(plan, args.workers, args.prefilter)


if __name__ == "__main__":
    main()
