"""FSDP2's default CPU threads per rank follow torchrun (pytorch/pytorch @ 010929fd3f
``torch/distributed/run.py`` ``config_from_args``): ``OMP_NUM_THREADS=1`` for each process when
it starts several per node and the user set none; with one process, torch's own default (the
node's cores)."""

from __future__ import annotations

import pytest

from offsim import load_strategy, load_workload, make_run_config, simulate
from offsim.plan import cpu_adam
from offsim.systems.fsdp2_cpu_offload import TORCHRUN_THREADS_PER_RANK, launched_threads

GB = 1e9
P = 6_738_415_616  # llama2-7b parameters
PASSES_BYTES = 72 + 12  # torch's for-loop AdamW (72 B) and clip_grad_norm_ (12 B) per element


def _step_s(dp: int, **options: object) -> float:
    wl = load_workload("llama2-7b")
    wl = wl.model_copy(update={"training": wl.training.model_copy(update={"data_parallel": dp})})
    st = load_strategy("fsdp2-cpu-offload")
    st = st.model_copy(update={"system_options": {**st.system_options, **options}})
    r = simulate(make_run_config("h200-sxm-node", wl, st))
    assert r.metrics.feasible, r.metrics.infeasible_reason
    return r.metrics.optimizer_step_s


def test_launched_threads_by_hand() -> None:
    assert TORCHRUN_THREADS_PER_RANK == 1
    assert launched_threads(8, None) == 1
    assert launched_threads(1, None) is None  # one process: torchrun sets nothing
    assert launched_threads(8, 4) == 4  # the user's OMP_NUM_THREADS wins


def test_eight_ranks_default_to_one_thread_each() -> None:
    """h200-sxm-node, dp 8: each rank steps P / 8 = 842,301,952 elements. One thread streams
    25 GB/s (cpu_adam.THREAD_STREAM_BYTES_PER_S), below the rank's DRAM share 439 GB/s x 0.548 / 8
    = 30.07 GB/s: 842,301,952 x 84 B / 25 GB/s = 2.8301 s. With 12 threads (the node's 96 cores
    / 8, offsim's default before torchrun's was modelled) the DRAM share binds: 2.3528 s."""
    one = P / 8 * PASSES_BYTES / cpu_adam.THREAD_STREAM_BYTES_PER_S
    assert one == pytest.approx(2.8301, rel=1e-4)
    assert _step_s(8) == pytest.approx(one, rel=1e-9)
    assert _step_s(8, threads_per_rank=1) == pytest.approx(one, rel=1e-9)
    share = P / 8 * PASSES_BYTES / (439 * GB * cpu_adam.ADAM_DRAM_EFFICIENCY / 8)
    assert share == pytest.approx(2.3528, rel=1e-4)
    assert _step_s(8, threads_per_rank=12) == pytest.approx(share, rel=1e-9)


def test_one_rank_keeps_the_nodes_cores() -> None:
    """dp 1: torchrun sets no OMP_NUM_THREADS; the step is DRAM-bound on the whole node:
    P x 84 B / (439 GB/s x 0.548) = 2.3529 s (as tests/test_systems_fsdp2.py has it)."""
    assert _step_s(1) == pytest.approx(P * PASSES_BYTES / (439 * GB * cpu_adam.ADAM_DRAM_EFFICIENCY), rel=1e-9)
