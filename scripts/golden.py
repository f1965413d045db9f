"""Record (or check) the golden metrics of every shipped strategy.

    python scripts/golden.py            # rewrite tests/golden/*.json
    python scripts/golden.py --check    # compare with them (what tests/test_golden.py does)
    python scripts/golden.py --only zenflow   # (re)write one strategy's file only

Each golden file holds, per configuration: the run's metrics JSON (``RunMetrics``), the
planner's footprint need per tier and the closed-form time bound's terms; on ``tiny``/``tiny``
also the span list. Configurations: every strategy in ``strategies/`` on ``tiny``/``tiny`` and on
``rtx4090-pcie4-ws``/``llama2-7b``, plus each system's home pairing from ``tests/test_systems*.py``.
Goldens change only on purpose: every difference is listed in ``tests/golden/CHANGES.md`` with the
mechanism that explains it.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

from offsim import make_run_config, simulate
from offsim.config.loading import shipped_files
from offsim.plan.time_bound import time_lower_bound

GOLDEN_DIR = Path(__file__).resolve().parent.parent / "tests" / "golden"

#: each system's home pairing (hardware, workload), as its test in tests/test_systems*.py runs it
HOME_PAIRINGS: dict[str, tuple[str, str]] = {
    "zero-offload": ("dgx2-v100", "zero-offload-10b"),
    "zero-infinity-nvme": ("dgx2-v100", "gpt3-175b"),
    "fuyou": ("fuyou-4090-testbed", "fuyou-gpt3-13b"),
    "tba-ssdtrain": ("tba-a100-optane", "tba-bert-12k"),
    "deep-optimizer-states": ("a100-80gb-pcie4", "dos-7b"),
    "twin-flow": ("a100-80gb-pcie4", "dos-7b"),
    "harmony": ("harmony-8x1080ti", "gpt2-1.5b"),
    "virtual-memory-swap": ("harmony-8x1080ti", "gpt2-1.5b"),
    "mlp-offload": ("polaris-a100-grand", "llama2-7b"),
    "memascend": ("rtx4090-pcie4-ws", "opt-30b"),
    "protrain": ("rtx4090-pcie4-ws", "llama2-13b"),
    "lsp-offload": ("rtx4090-pcie4-ws", "llama2-7b"),
    "superoffload": ("gh200-superchip", "llama2-7b"),
    "zenflow": ("a100-80gb-pcie4", "llama2-7b"),
    "megatron-offload": ("h100-sxm5-gen5", "llama2-7b"),
    "gemini": ("patrickstar-8xv100", "gpt3-13b"),
    "gemini-static": ("patrickstar-8xv100", "gpt3-13b"),
    "fsdp2-cpu-offload": ("h200-sxm-node", "llama2-7b"),
    "greedysnake": ("a100-azure-4nvme", "llama2-7b"),
}


def configurations() -> list[tuple[str, str, str]]:
    """(hardware, workload, strategy) of every golden configuration, in a fixed order."""
    out: list[tuple[str, str, str]] = []
    for strategy in sorted(shipped_files("strategy")):
        out.append(("tiny", "tiny", strategy))
        out.append(("rtx4090-pcie4-ws", "llama2-7b", strategy))
        if strategy in HOME_PAIRINGS:
            hw, wl = HOME_PAIRINGS[strategy]
            if (hw, wl) != ("rtx4090-pcie4-ws", "llama2-7b"):
                out.append((hw, wl, strategy))
    return out


def record(hardware: str, workload: str, strategy: str) -> dict[str, Any]:
    """The golden record of one configuration."""
    cfg = make_run_config(hardware, workload, strategy)
    result = simulate(cfg)
    rec: dict[str, Any] = {
        "metrics": result.metrics.model_dump(mode="json"),
        "footprint_need_bytes": result.footprint_bytes.get("need", {}),
    }
    try:
        bound = time_lower_bound(result.config)  # the resolved configuration
        rec["time_bound"] = {"seconds": bound.seconds, "binding": bound.binding, "terms_s": bound.terms_s}
    except Exception as exc:
        rec["time_bound"] = {"error": f"{type(exc).__name__}: {exc}"}
    if hardware == "tiny" and workload == "tiny" and result.feasible:
        rec["spans"] = [[s.iteration, s.phase, s.resource, s.kind, s.name, s.layer, s.start_s, s.end_s, s.bytes]
                        for s in result.recorder.spans]
    return rec


def file_for(strategy: str) -> Path:
    return GOLDEN_DIR / f"{strategy}.json"


def build(only: str | None = None) -> dict[str, dict[str, Any]]:
    """Every golden record (or strategy ``only``'s), by strategy then by ``hardware/workload``."""
    out: dict[str, dict[str, Any]] = {}
    for hw, wl, strategy in configurations():
        if only is not None and strategy != only:
            continue
        out.setdefault(strategy, {})[f"{hw}/{wl}"] = record(hw, wl, strategy)
    return out


def differences(expected: Any, actual: Any, path: str = "", rel: float = 1e-9) -> list[str]:
    """Where ``actual`` differs from ``expected``: floats to ``rel``, everything else exactly."""
    if isinstance(expected, dict) and isinstance(actual, dict):
        out: list[str] = []
        for key in sorted(set(expected) | set(actual)):
            if key not in expected or key not in actual:
                out.append(f"{path}/{key}: only in {'actual' if key in actual else 'expected'}")
            else:
                out += differences(expected[key], actual[key], f"{path}/{key}", rel)
        return out
    if isinstance(expected, list) and isinstance(actual, list):
        if len(expected) != len(actual):
            return [f"{path}: length {len(expected)} != {len(actual)}"]
        return [d for i, (e, a) in enumerate(zip(expected, actual, strict=True))
                for d in differences(e, a, f"{path}[{i}]", rel)]
    if isinstance(expected, float) or isinstance(actual, float):
        if isinstance(expected, int | float) and isinstance(actual, int | float) and not isinstance(expected, bool):
            if math.isclose(expected, actual, rel_tol=rel, abs_tol=1e-12):
                return []
    if expected == actual:
        return []
    return [f"{path}: {expected!r} != {actual!r}"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare instead of rewriting")
    parser.add_argument("--only", metavar="STRATEGY", help="only this shipped strategy's file")
    args = parser.parse_args()
    built = build(args.only)
    if not built:
        print(f"no shipped strategy named {args.only!r}", file=sys.stderr)
        return 2
    if not args.check:
        GOLDEN_DIR.mkdir(parents=True, exist_ok=True)
        for strategy, records in built.items():
            file_for(strategy).write_text(json.dumps(records, indent=1, sort_keys=True) + "\n")
        print(f"wrote {len(built)} golden files to {GOLDEN_DIR}")
        return 0
    bad = 0
    for strategy, records in built.items():
        diffs = differences(json.loads(file_for(strategy).read_text()), json.loads(json.dumps(records)))
        bad += len(diffs)
        for d in diffs[:20]:
            print(f"{strategy}{d}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
