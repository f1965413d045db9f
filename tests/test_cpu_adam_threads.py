"""``cpu_adam_threads_per_rank`` (OMP_NUM_THREADS of each rank's CPU Adam; deepspeed_runtime.md §5,
§14.7): hand-computed rates on a100-80gb-pcie4 (1 socket, 32 cores, no clock given, DRAM 164 GB/s)."""

from __future__ import annotations

import pytest

from offsim import load_strategy, make_run_config, simulate
from offsim.plan.paths import cpu_adam_rank_rate


def _cfg(threads: int | None):
    st = load_strategy("zero-infinity-cpu").model_copy(update={"cpu_adam_threads_per_rank": threads})
    return make_run_config("a100-80gb-pcie4", "tiny", st)


def test_one_thread_streams_what_one_thread_can() -> None:
    # one thread: 25e9 B/s per thread (cpu_adam.THREAD_STREAM_BYTES_PER_S) / 28 B per element
    assert cpu_adam_rank_rate(_cfg(1), 1) == pytest.approx(25e9 / 28)
    # four threads: 4 x 25e9 / 28 = 3.57e9 > the DRAM bound 164e9 x 0.548 / 28 = 3.21e9
    assert cpu_adam_rank_rate(_cfg(4), 1) == pytest.approx(164e9 * 0.548 / 28)
    # unset: the rank's share of the 32 cores, DRAM-bound as well
    assert cpu_adam_rank_rate(_cfg(None), 1) == pytest.approx(164e9 * 0.548 / 28)
    # more threads than the rank's share of the cores only time-share them (4 ranks: 8 cores each)
    assert cpu_adam_rank_rate(_cfg(16), 4) == pytest.approx(cpu_adam_rank_rate(_cfg(8), 4))


def test_fewer_threads_lengthen_the_step() -> None:
    one = simulate(_cfg(1)).metrics.phases_s.optimizer
    all_cores = simulate(_cfg(None)).metrics.phases_s.optimizer
    assert one > all_cores
