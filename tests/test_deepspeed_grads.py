"""DeepSpeed ZeRO-3 offload's gradient path (stage3.py ``partition_grads``; deepspeed_runtime.md §3,
§7, §14.9): bytes per micro-batch counted by hand, the version switch of the boundary copy, and the
gradient swapper holding the host back."""

from __future__ import annotations

from collections import Counter

import pytest

from offsim import simulate
from offsim.config.loading import load_strategy, load_workload
from offsim.config.run import RunConfig, make_run_config
from offsim.plan.footprint import state_sizes
from offsim.plan.paths import Paths, resource_capacities

#: tiny/tiny: one rank, bf16 params and gradients (b_acc = 2 B), fp32 optimizer gradients (4 B)
P = 67_118_080  # parameters of the tiny workload (state_sizes(...).params_total)


def _cfg(strategy: str, gas: int = 1, **st_updates: object) -> RunConfig:
    st = load_strategy(strategy).model_copy(update=st_updates)
    cfg = make_run_config("tiny", "tiny", st)
    training = cfg.workload.training.model_copy(update={"grad_accumulation": gas})
    wl = cfg.workload.model_copy(update={"training": training})
    return cfg.model_copy(update={"workload": wl})


def _grad_bytes(cfg: RunConfig) -> Counter[tuple[str, str]]:
    result = simulate(cfg)
    assert result.metrics.feasible, result.metrics.infeasible_reason
    spans = result.recorder.spans
    last = max(s.iteration for s in spans)
    out: Counter[tuple[str, str]] = Counter()
    for s in spans:
        if s.iteration == last and s.kind in ("grad_offload", "grad_cast", "grad_accumulate"):
            out[(s.kind, s.resource)] += s.bytes
    return out


def test_one_micro_batch_moves_8_bytes_per_element_in_three_copies() -> None:
    """§3 table, GAS = 1: D2H b_acc + 4 (the accumulator slice, then the fp32 copy at the
    boundary), H2D b_acc (the slice back to a GPU tensor): 6 + 2 B per element, nothing on the host."""
    assert state_sizes(_cfg("zero-infinity-cpu")).params_total == P
    got = _grad_bytes(_cfg("zero-infinity-cpu"))
    assert got == Counter({("grad_offload", "d2h"): 6 * P, ("grad_offload", "h2d"): 2 * P})


def test_accumulation_pays_the_round_trip_every_micro_batch() -> None:
    """§3, GAS = 3: every micro-batch D2H b_acc and H2D b_acc; the fp32 copy (4 B) once."""
    got = _grad_bytes(_cfg("zero-infinity-cpu", gas=3))
    assert got == Counter({("grad_offload", "d2h"): (3 * 2 + 4) * P, ("grad_offload", "h2d"): 3 * 2 * P})


def test_older_releases_copy_16_bit_and_upcast_on_the_cpu() -> None:
    """§14.9, v0.6.0-v0.15.3: the boundary copy is a 16-bit D2H (2 B) and a CPU upcast that reads
    2 B and writes 4 B per element; v0.15.4-v0.16.2: fp32 D2H and a CPU copy of 4 + 4 B."""
    got = _grad_bytes(_cfg("zero-infinity-cpu", z3_fp32_grad_copy="cpu_upcast_blocking"))
    assert got == Counter({("grad_offload", "d2h"): (2 + 2) * P, ("grad_offload", "h2d"): 2 * P,
                           ("grad_cast", "dram_copy"): 6 * P})
    got = _grad_bytes(_cfg("zero-infinity-cpu", z3_fp32_grad_copy="bounce_sync"))
    assert got == Counter({("grad_offload", "d2h"): (2 + 4) * P, ("grad_offload", "h2d"): 2 * P,
                           ("grad_cast", "dram_copy"): 8 * P})


def test_a_blocking_copy_holds_the_backward_back() -> None:
    """A blocking boundary copy (v0.16.3-v0.19.4) makes the host, which issues the compute,
    wait for it: the backward is longer than with the current release's non_blocking copy.
    With several reduce buckets (1.3e7 elements: about one tiny block each), since the default
    5e8 holds the whole 6.7e7-parameter tiny model in one bucket, flushed after the last layer,
    where the epilogue waits for the reduction stream anyway (both 0.666 s)."""
    fast = simulate(_cfg("zero-infinity-cpu", reduce_bucket_params=1.3e7)).metrics.phases_s.backward
    slow = simulate(_cfg("zero-infinity-cpu", reduce_bucket_params=1.3e7,
                         z3_fp32_grad_copy="gpu_upcast_blocking")).metrics.phases_s.backward
    assert slow > fast


def test_nvme_gradients_written_once_at_the_boundary() -> None:
    """§7: with gradients on NVMe only the boundary's fp32 copy is written (4 B per element), no
    read of a partial sum; the earlier micro-batches keep the sum in the host accumulator."""
    cfg = _cfg("zero-infinity-nvme", gas=2)
    got = _grad_bytes(cfg)
    assert got[("grad_offload", "nvme_write")] == 4 * P
    assert got[("grad_offload", "nvme_read")] == 0
    assert got[("grad_offload", "h2d")] == 2 * 2 * P


def test_the_gradient_swapper_blocks_the_host_when_its_pool_is_small() -> None:
    """§7: the host waits once the swapper's buffers hold unwritten gradients; one small buffer
    (buffer_count 1, sub_group_size 1e6: 4 MB) stalls the backward more than sixteen large ones.
    Reduce buckets of 1.3e7 elements (about one tiny block each), so that several buckets' copies
    meet the pool (the default 5e8 is one bucket for the whole tiny model)."""
    small = simulate(_cfg("zero-infinity-nvme", optimizer_buffer_count=1, sub_group_params=1e6,
                          reduce_bucket_params=1.3e7))
    large = simulate(_cfg("zero-infinity-nvme", optimizer_buffer_count=16, sub_group_params=1e6,
                          reduce_bucket_params=1.3e7))
    stalls = [s for s in small.recorder.spans if "gradient swapper" in s.name]
    assert stalls and small.metrics.phases_s.backward > large.metrics.phases_s.backward


def test_backward_ends_when_the_reduction_stream_drains() -> None:
    """§3 "End of backward": ``independent_gradient_partition_epilogue`` synchronizes the
    reduction stream, so the host (and the backward) ends with the last gradient copy: the stall
    ends exactly where the last boundary D2H ends, and nothing of the backward runs after it."""
    result = simulate(_cfg("zero-infinity-cpu"))
    spans = result.recorder.spans
    last = max(s.iteration for s in spans)
    drain = [s for s in spans if s.iteration == last and "end of backward" in s.name]
    d2h_end = max(s.end_s for s in spans if s.iteration == last and s.kind == "grad_offload" and s.resource == "d2h")
    backward_end = max(s.end_s for s in spans if s.iteration == last and s.phase == "backward")
    assert len(drain) == 1 and drain[0].end_s == d2h_end == backward_end


def test_no_drain_wait_with_gradients_on_nvme() -> None:
    """With gradients on NVMe the swapper's writes go on after backward (its last flush is in
    step()), and its blocking copies already hold the host: no end-of-backward wait."""
    spans = simulate(_cfg("zero-infinity-nvme")).recorder.spans
    assert not [s for s in spans if "end of backward" in s.name]


def _pageable_rate_bytes_per_s(dp: int) -> float:
    """The fastest a 1 GB pageable D2H of one rank runs on dgx2-v100 while every rank of the node
    copies alike: the least of its own cap and each resource's per-rank capacity / its usage."""
    wl = load_workload("gpt3-175b")
    wl = wl.model_copy(update={"training": wl.training.model_copy(update={"data_parallel": dp})})
    cfg = make_run_config("dgx2-v100", wl, "zero-infinity-nvme")
    sz = state_sizes(cfg)
    cap = resource_capacities(cfg, sz.ranks_per_node, sz.dp)
    flow = Paths(cfg, cap, 1.0).dma(False, 10**9, pinned=False)
    return min(flow.cap_bytes_per_s, *(cap[r] / u for r, u in flow.usage))


def test_pageable_copies_share_the_root_port_and_the_hosts_memcpy_not_one_node_wide_6_gb_per_s() -> None:
    """A pageable copy is a CPU memcpy into a pinned bounce buffer by the calling process's own
    thread, then a DMA (hardware_facts.md 2.3: ~6 GB/s pageable vs ~12 pinned on Gen3), so its
    6 GB/s cap is per copy, not a node-wide pool. What the 16 DGX-2 GPUs share: the root-port
    uplink, 12 GB/s per 4 GPUs (nccl-tests #78 topology; ZeRO-Infinity's ~3.0 GB/s per GPU with
    all 16 copying, hardware_facts.md 2.4), the host memcpy (100 GB/s / 16 = 6.25 GB/s per rank,
    2 B of it per byte: 3.125 GB/s) and DRAM (199 / 16 = 12.44 GB/s, 3 B per byte: 4.15 GB/s).
    By hand, dp 16: min(6 cap less 20 us, 3.0, 3.125, 4.15) = 3.0 GB/s per rank (not 6 / 16 =
    0.375); dp 1: min(6 GB/s less latency: 1e9 / (20e-6 + 1e9 / 6e9) = 5.9993 GB/s, 100 / 2,
    199 / 3, 12 pinned link) = 5.9993 GB/s."""
    assert _pageable_rate_bytes_per_s(16) == pytest.approx(3.0e9)
    assert _pageable_rate_bytes_per_s(1) == pytest.approx(1e9 / (20e-6 + 1e9 / 6e9))
