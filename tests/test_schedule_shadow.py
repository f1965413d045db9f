"""Shadow check of the schedule builder against the SimPy engine it will replace.

For every golden configuration, the work the compiled schedule contains (GPU kernels and flows,
by track, activity, layer and bytes, per iteration) equals the work the engine
(the former :mod:`offsim.engine.simulate`) ran, with two exceptions that are runtime decisions: the GPU
parameter cache's and the DRAM optimizer cache's fetches depend on the policies (compared per
unit: the engine ran each unit's fetch program a whole number of times), and Deep Optimizer
States' per-step split is chosen from observed rates (left out of the schedule, said in its notes).
"""

from __future__ import annotations

import importlib.util
from collections import Counter
from pathlib import Path

import pytest

from offsim import make_run_config, simulate
from offsim.api import resolve
from offsim.core.enums import CacheId
from offsim.schedule.ops import Access, Delay, Flow, Schedule
from offsim.systems._registry import compile_strategy

_SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "golden.py"
_spec = importlib.util.spec_from_file_location("offsim_golden_script_shadow", _SCRIPT)
assert _spec is not None and _spec.loader is not None
golden = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(golden)

PARAM_KINDS = {"param_fetch", "param_allgather"}
OPT_IO_KINDS = {"optimizer_swap_in", "optimizer_swap_out"}
Key = tuple[str, str, int, int]


def _keys(op_body: object, activity: str, layer: int) -> list[Key]:
    if isinstance(op_body, Delay):
        return [("gpu", activity, layer, 0)] if op_body.seconds > 0 else []
    if isinstance(op_body, Flow):
        return [(str(link), activity, layer, op_body.nbytes) for link in op_body.links]
    return []


def schedule_work(schedule: Schedule, iteration: int, skip: set[str]) -> Counter[Key]:
    """Kernels and flows of one iteration; activation fetches counted once per access."""
    out: Counter[Key] = Counter()
    act = schedule.cache(CacheId.GPU_ACTIVATIONS)
    for inst in schedule.instances():
        if inst.iteration != iteration:
            continue
        for op in inst.block.ops:
            if isinstance(op.body, Access) and op.body.cache is CacheId.GPU_ACTIVATIONS and act is not None:
                for p in act.fetch[op.body.unit].ops:
                    out.update(_keys(p.body, str(p.tag.activity), p.tag.layer))
            elif str(op.tag.activity) not in skip:
                out.update(_keys(op.body, str(op.tag.activity), op.tag.layer))
    return out


def engine_work(spans: list, iteration: int, skip: set[str]) -> Counter[Key]:
    """The engine's spans of one iteration, stalls and skipped kinds left out."""
    return Counter((s.resource, s.kind, s.layer, round(s.bytes)) for s in spans
                   if s.iteration == iteration and s.kind not in skip and s.resource != "gpu_stall"
                   and not (s.resource == "gpu" and s.end_s == s.start_s))


def _differences(a: Counter[Key], b: Counter[Key]) -> list[str]:
    out = []
    for k in sorted(set(a) | set(b)):
        if a[k] != b[k]:
            out.append(f"{k}: schedule {a[k]}, engine {b[k]}")
    return out


def _near(a: Counter[Key], b: Counter[Key]) -> list[str]:
    """Differences, with bytes equal to within 1 B (the schedule rounds once, the engine never)."""
    def coarse(c: Counter[Key]) -> Counter[Key]:
        return Counter({(r, k, lay, n // 4): v for (r, k, lay, n), v in c.items()})
    return _differences(coarse(a), coarse(b)) if _differences(a, b) else []


@pytest.mark.parametrize(("hardware", "workload", "strategy"), golden.configurations(), ids=lambda v: str(v))
def test_schedule_has_the_engines_work(hardware: str, workload: str, strategy: str) -> None:
    cfg = make_run_config(hardware, workload, strategy)
    result = simulate(cfg)
    if not result.feasible:
        pytest.skip(f"infeasible: {result.metrics.infeasible_reason}")
    cfg = result.config  # resolved (auto-swap's amount chosen)
    schedule = compile_strategy(cfg)
    skip = set(PARAM_KINDS)
    if schedule.cache(CacheId.DRAM_OPTIMIZER) is not None:
        skip |= OPT_IO_KINDS
    if cfg.strategy.optimizer_split == "perf-model":
        skip |= {"optimizer", "optimizer_h2d", "optimizer_d2h", "param_update", "optimizer_swap_in"}
    for it in range(cfg.iterations):
        diffs = _near(schedule_work(schedule, it, skip), engine_work(result.recorder.spans, it, skip))
        assert not diffs, f"iteration {it}:\n" + "\n".join(diffs[:20])


@pytest.mark.parametrize(("hardware", "workload", "strategy"),
                         [c for c in golden.configurations() if c[0] == "tiny"], ids=lambda v: str(v))
def test_parameter_fetches_are_whole_programs(hardware: str, workload: str, strategy: str) -> None:
    """Per layer and iteration, the engine's parameter fetch work is its fetch program run a
    whole number of times (the misses the policies caused)."""
    cfg = resolve(make_run_config(hardware, workload, strategy))
    schedule = compile_strategy(cfg)
    cache = schedule.cache(CacheId.GPU_PARAMS)
    if cache is None:
        pytest.skip("parameters are not streamed")
    spans = simulate(cfg).recorder.spans
    for u, program in cache.fetch.items():
        one: Counter[Key] = Counter()
        for p in program.ops:
            one.update(_keys(p.body, str(p.tag.activity), u))
        one = Counter({k: v for k, v in one.items() if k[3] > 0})
        for it in range(cfg.iterations):
            ran = Counter(k for k in engine_work(spans, it, set()).elements() if k[1] in PARAM_KINDS and k[2] == u)
            if not one:
                assert not ran
                continue
            runs = {ran[k] / v for k, v in one.items()}  # how many times each flow of the program ran
            assert set(ran) <= set(one), (u, it, ran, one)
            assert len(runs) == 1 and runs.pop().is_integer(), (u, it, ran, one)
