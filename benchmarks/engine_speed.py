"""How fast the simulator itself runs: events per second and wall time per simulated iteration.

Run: ``python benchmarks/engine_speed.py`` (prints a table; the figures go in the README).
This is a benchmark, not a test: timings on shared machines are noisy, so nothing asserts them.
"""

# ruff: noqa: T201 - a benchmark prints its figures

from __future__ import annotations

import platform
import statistics
import time

from offsim import make_run_config, simulate
from offsim.search import swap_amount

CASES = [
    ("dgx2-v100", "gpt3-175b", "zero-infinity-nvme"),
    ("rtx4090-pcie4-ws", "llama2-7b", "zero-offload"),
    ("rtx4090-pcie4-ws", "llama2-7b", "zero-infinity-cpu"),
    ("dgx2-v100", "zero-offload-10b", "zero-offload-dpu"),  # shipped zero-offload: 10B no longer fits a V100
    ("fuyou-4090-testbed", "gpt3-13b", "fuyou"),  # auto-swap: the choice is memoised, see below
]
#: Cases whose activation policy is auto-swap: also timed cold, the swap amount chosen afresh
#: (its model over every count plus the simulated short list) on every run.
AUTO_SWAP = [("fuyou-4090-testbed", "gpt3-13b", "fuyou"), ("fuyou-4090-testbed", "gpt3-175b", "fuyou")]
REPEATS = 5


def measure(hardware: str, workload: str, strategy: str, iterations: int = 3,
            cold: bool = False) -> dict[str, float]:
    """Median wall time of ``simulate`` over REPEATS runs, and the events it processed;
    ``cold`` forgets memoised auto-swap choices before each run."""
    cfg = make_run_config(hardware, workload, strategy, iterations=iterations)
    walls, events = [], 0
    for _ in range(REPEATS):
        if cold:
            swap_amount._CHOICES.clear()
        t0 = time.perf_counter()
        result = simulate(cfg)
        walls.append(time.perf_counter() - t0)
        events = result.events
    wall = statistics.median(walls)
    return {"wall_s": wall, "per_iteration_s": wall / cfg.iterations, "events": events,
            "events_per_s": events / wall, "feasible": result.feasible,
            "simulated_iteration_s": result.metrics.iteration_time_s or float("nan")}


def main() -> None:
    print(f"offsim engine speed on {platform.processor() or platform.machine()}, Python {platform.python_version()}")
    print(f"{'case':62} {'wall/iter':>10} {'events':>8} {'events/s':>10} {'sim iter':>10}")
    for hw, wl, st in CASES:
        m = measure(hw, wl, st)
        if not m["feasible"]:  # refused before simulating: its wall time measures the fit check only
            print(f"{wl + ' / ' + st + ' / ' + hw:62} {'infeasible: not simulated':>41}")
            continue
        print(f"{wl + ' / ' + st + ' / ' + hw:62} {m['per_iteration_s']:9.4f}s {m['events']:8.0f} "
              f"{m['events_per_s']:10.0f} {m['simulated_iteration_s']:9.2f}s")
    print("\nauto-swap, cold (choice made afresh each run): whole simulate() wall time")
    for hw, wl, st in AUTO_SWAP:
        m = measure(hw, wl, st, cold=True)
        what = "infeasible" if not m["feasible"] else f"{m['simulated_iteration_s']:.2f} s/iteration"
        print(f"{wl + ' / ' + st + ' / ' + hw:62} {m['wall_s']:9.3f}s  ({what})")


if __name__ == "__main__":
    main()
