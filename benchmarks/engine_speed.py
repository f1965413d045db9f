"""How fast the simulator itself runs: events per second and wall time per simulated iteration.

Run: ``python benchmarks/engine_speed.py`` (prints a table; the figures go in the README).
This is a benchmark, not a test: timings on shared machines are noisy, so nothing asserts them.
"""

from __future__ import annotations

import platform
import statistics
import time

from offsim import make_run_config, simulate

CASES = [
    ("dgx2-v100", "gpt3-175b", "zero-infinity-nvme"),
    ("rtx4090-pcie4-ws", "llama2-7b", "zero-offload"),
    ("rtx4090-pcie4-ws", "llama2-7b", "zero-infinity-cpu"),
    ("dgx2-v100", "zero-offload-10b", "zero-offload"),
]
REPEATS = 5


def measure(hardware: str, workload: str, strategy: str, iterations: int = 3) -> dict[str, float]:
    """Median wall time of ``simulate`` over REPEATS runs, and the events it processed."""
    cfg = make_run_config(hardware, workload, strategy, iterations=iterations)
    walls, events = [], 0
    for _ in range(REPEATS):
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
        print(f"{wl + ' / ' + st + ' / ' + hw:62} {m['per_iteration_s']:9.4f}s {m['events']:8.0f} "
              f"{m['events_per_s']:10.0f} {m['simulated_iteration_s']:9.2f}s")


if __name__ == "__main__":
    main()
