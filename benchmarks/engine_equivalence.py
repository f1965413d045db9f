"""Hash every record a set of runs makes, to check that an engine change moved none of them.

Run: ``python benchmarks/engine_equivalence.py > new.txt`` here and, with ``PYTHONPATH=DIR``
(DIR a ``git archive`` of the revision before the change), ``> old.txt``; ``diff old.txt new.txt``
must be empty. Per configuration (every shipped strategy on three workloads, and the 175B case the
speed table times): a SHA-256 of the spans, the memory levels, the cache events (every record,
the steady-state shortcut's copies included, in order, each as its ``repr``), the phases, the
iteration starts, the end time and the events processed. Session 12 checked its engine changes
the same way on 69 configurations (README, "Simulator speed"); this script keeps that check.
``--layer-shortcut=on`` (``=off``) as the first argument runs with the layer shortcut
(:mod:`offsim.engine.layers`) on (off) whatever its default.
"""

# ruff: noqa: T201 - a benchmark prints its figures

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

from offsim import make_run_config, simulate

ROOT = Path(__file__).resolve().parent.parent
WORKLOADS = [("tiny", "tiny", 2), ("rtx4090-pcie4-ws", "llama2-7b", 3), ("dgx2-v100", "gpt3-13b", 2),
             ("a100-80gb-pcie4", "llama2-13b", 2)]
EXTRA = [("dgx2-v100", "gpt3-175b", "zero-infinity-nvme", 3), ("dgx2-v100", "zero-offload-10b", "zero-offload", 3),
         ("fuyou-4090-testbed", "gpt3-13b", "fuyou", 2)]


def cases() -> list[tuple[str, str, str, int]]:
    """(hardware, workload, strategy, iterations) of every configuration checked."""
    strategies = sorted(p.stem for p in (ROOT / "strategies").glob("*.yaml"))
    return [(hw, wl, st, it) for hw, wl, it in WORKLOADS for st in strategies] + EXTRA


def digest(hardware: str, workload: str, strategy: str, iterations: int) -> str:
    """The SHA-256 of one run's records (or of its error, or infeasibility)."""
    h = hashlib.sha256()
    try:
        result = simulate(make_run_config(hardware, workload, strategy, iterations=iterations))
    except Exception as exc:  # a configuration that fails must fail the same way
        return f"error {type(exc).__name__}"
    if not result.feasible:
        return f"infeasible {result.metrics.infeasible_reason}"
    rec = result.recorder
    for log in (rec.spans, rec.levels, rec.cache_events):
        for record in log:
            h.update(repr(record).encode())
        h.update(b"|")
    h.update(repr((rec.phases, rec.iteration_starts_s, rec.end_s, result.events)).encode())
    return h.hexdigest()


def main() -> None:
    only = sys.argv[1:]
    if only and only[0].startswith("--layer-shortcut="):  # the layer shortcut on or off (default: the engine's)
        from offsim.engine import layers

        layers.DEFAULT = only.pop(0).split("=", 1)[1] == "on"
    for hw, wl, st, it in cases():
        if only and st not in only:
            continue
        print(f"{hw} {wl} {st} {it} {digest(hw, wl, st, it)}", flush=True)


if __name__ == "__main__":
    main()
