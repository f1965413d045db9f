"""DeepSpeed ZeRO-2 offload's gradient copies (ZeRO-Offload; stage2.py / stage_1_and_2.py
``copy_grads_in_partition``; deepspeed_runtime.md §4, §14.2): bytes per step counted by hand for
each release's ``z12_accum_mode``, and the backward of ``overlap_comm`` false, where the copies sit
on the compute stream, timed by hand on the tiny profile (1 GB/s each way, no latency)."""

from __future__ import annotations

from collections import Counter

import pytest

from offsim import simulate
from offsim.config.loading import load_strategy
from offsim.config.run import RunConfig, make_run_config
from offsim.mechanisms.base import Moment
from offsim.mechanisms.zero2_grads import lp_d2h_on
from offsim.plan.deepspeed_versions import Z12AccumMode
from offsim.plan.footprint import state_sizes
from tests.test_deepspeed_grads import _grad_bytes as grad_bytes

#: tiny/tiny: one rank, bf16 gradients (2 B), fp32 optimizer gradients (4 B)
P = 67_118_080


def _cfg(gas: int = 1, mode: str | None = None, **st_updates: object) -> RunConfig:
    st = load_strategy("zero-offload").model_copy(update=st_updates)
    if mode is not None:
        st = st.model_copy(update={"system_options": {"z12_accum_mode": mode}})
    cfg = make_run_config("tiny", "tiny", st)
    training = cfg.workload.training.model_copy(update={"grad_accumulation": gas})
    return cfg.model_copy(update={"workload": cfg.workload.model_copy(update={"training": training})})


def _grad_bytes(cfg: RunConfig) -> Counter[tuple[str, str]]:
    """Gradient bytes per (kind, resource) in the last iteration, the spans that move bytes only."""
    return Counter({key: n for key, n in grad_bytes(cfg).items() if n})


def test_which_micro_batches_copy_16_bits_down() -> None:
    """§14.2: v1 every micro-batch but the boundary; drop_middle only the first; d2h_every_mb all;
    one micro-batch per step none (only the fp32 copy)."""
    first, middle, last, only = (True, False), (False, False), (False, True), (True, True)
    table = {Z12AccumMode.V1: (True, True, False, False), Z12AccumMode.DROP_MIDDLE: (True, False, False, False),
             Z12AccumMode.D2H_EVERY_MB: (True, True, True, False)}
    for mode, want in table.items():
        assert tuple(lp_d2h_on(mode, *mb) for mb in (first, middle, last, only)) == want


def test_one_micro_batch_moves_the_fp32_gradient_only() -> None:
    """GAS = 1: ``async_inplace_copy_grad_to_fp32_buffer_from_gpu`` alone, 4 B per element down;
    no round trip, nothing added on the host (the generic path's host accumulation is gone)."""
    assert state_sizes(_cfg()).params_total == P
    assert _grad_bytes(_cfg()) == Counter({("grad_offload", "d2h"): 4 * P})


@pytest.mark.parametrize(("mode", "lp_down"), [("v1", 2), ("drop_middle", 1), ("d2h_every_mb", 3)])
def test_accumulation_round_trip_by_release(mode: str, lp_down: int) -> None:
    """GAS = 3: micro-batches 1 and 2 bring the 16-bit accumulator up (2 x 2 B); the 16-bit sum
    goes down on 2 (v1: micro-batches 0, 1), 1 (drop_middle: 0) or 3 (d2h_every_mb) micro-batches;
    the boundary's fp32 copy once (4 B)."""
    got = _grad_bytes(_cfg(gas=3, mode=mode))
    assert got == Counter({("grad_offload", "d2h"): (lp_down * 2 + 4) * P, ("grad_offload", "h2d"): 2 * 2 * P})


def test_copies_on_the_compute_stream_lengthen_backward_by_their_time() -> None:
    """``overlap_comm`` false: each layer's fp32 copy runs between its backward and the next
    layer's, so backward = its compute (2 x forward: tiny has no recompute) + the IPG bucket
    copies (2 x 2 B x P at the HBM rate) + 4 B x P at 1 GB/s = 2 x 0.0645682 + 0.0002674 +
    0.2684723 = 0.3979 s; with ``overlap_comm`` the copies overlap it."""
    cfg = _cfg(overlap_grad_offload=False)
    m = simulate(cfg).metrics
    ipg_s = 4 * P / cfg.hardware.gpu.hbm_bytes_per_s
    assert m.phases_s.backward == pytest.approx(2 * m.phases_s.forward + ipg_s + 4 * P / 1e9, rel=1e-5)
    overlapped = simulate(_cfg(overlap_grad_offload=True)).metrics.phases_s.backward
    assert overlapped < m.phases_s.backward - 0.1


def test_overlapped_copies_hold_backward_one_bucket_behind() -> None:
    """``overlap_comm`` true: before a layer's copies are issued the compute stream waits for the
    previous layer's (``average_tensor``: ``torch.cuda.synchronize()`` in v0.3.x, later
    ``current_stream().wait_stream(reduction_stream)``). On tiny the 1 GB/s copies are slower than
    the compute, and the epilogue synchronizes after the last bucket (stage_1_and_2.py
    ``independent_gradient_partition_epilogue``: ``if self.overlap_comm:
    get_accelerator().synchronize()``), so backward ends when every layer's copies are done (the
    embedding's 8192 x 1024 x 4 B = 33,554,432 B included; 0.2349179 s before the epilogue
    wait), the first starting after the LM head's backward and its IPG bucket copy (8,389,632
    elements x 2 x 2 B at the HBM rate): backward = 0.0171799 + 0.0000336 + 4P / 1 GB/s
    (0.2684723 s) = 0.2856858 s."""
    cfg = _cfg(overlap_grad_offload=True)
    result = simulate(cfg)
    last = max(s.iteration for s in result.recorder.spans)
    head = next(s for s in result.recorder.spans
                if s.iteration == last and s.kind == "backward" and s.layer == 5)
    head_ipg_s = 8_389_632 * 4 / cfg.hardware.gpu.hbm_bytes_per_s
    want = (head.end_s - head.start_s) + head_ipg_s + 4 * P / 1e9
    assert result.metrics.phases_s.backward == pytest.approx(want, rel=1e-6)


@pytest.mark.parametrize(("overlap", "bucket", "factor", "gpu_bytes"), [
    (True, 5e8, 1.0, 2 * 500_000_000 * 2),
    (False, 5e8, 1.0, 500_000_000 * 2),
    (False, 5e7, 4.5, 225_000_000 * 2),
])
def test_footprint_holds_the_ipg_buckets_and_the_accumulator(overlap: bool, bucket: float, factor: float,
                                                            gpu_bytes: int) -> None:
    """GPU: the IPG bucket buffer(s), allocated at ``reduce_bucket_size`` x factor 16-bit elements
    whatever the model (one, two with ``overlap_comm``; factor 4.5 in v0.3.0-v0.3.16), held through
    forward and backward (freed at backward's end, ``_release_ipg_buffers``); host, with
    accumulation only: the pinned 16-bit accumulator of every owned parameter (2P); GPU, held:
    ``temp_grad_buffer_for_gpu_offload``, the largest parameter (tiny's 8192 x 1024 embedding)."""
    from offsim.systems import zero_offload
    for gas, accumulator in ((1, 0), (3, 2 * P)):
        cfg = _cfg(gas=gas, overlap_grad_offload=overlap, reduce_bucket_params=bucket)
        st = cfg.strategy.model_copy(update={"system_options": {"ipg_buffer_factor": factor}})
        needs = zero_offload.compose(cfg.model_copy(update={"strategy": st})).mechanisms["grads"].footprint()
        assert [n.nbytes for n in needs] == [gpu_bytes, accumulator, 8_388_608 * 2]
        assert needs[0].moment is Moment.FORWARD_BACKWARD and needs[2].moment is None


@pytest.mark.parametrize(("z12_reduce", "factor"), [("reduce", 1), ("allreduce", 2)])
def test_bucket_reduction_bytes_by_release(z12_reduce: str, factor: int) -> None:
    """Two data-parallel ranks on dgx2-v100: each bucket's 16-bit gradients cross the GPU link as
    one dist.reduce per owner (v0.3.0-v0.12.3: (dp - 1) / dp x 2 B x P per rank, a reduce-scatter's
    bytes) or one all-reduce of the bucket (v0.12.4+: twice that); the step's all-gather of the
    updated 16-bit partitions adds (dp - 1) / dp x 2 B x P either way."""
    st = load_strategy("zero-offload").model_copy(update={"system_options": {"z12_reduce": z12_reduce}})
    cfg = make_run_config("dgx2-v100", "tiny", st)
    training = cfg.workload.training.model_copy(update={"data_parallel": 2})
    cfg = cfg.model_copy(update={"workload": cfg.workload.model_copy(update={"training": training})})
    m = simulate(cfg).metrics
    assert m.feasible, m.infeasible_reason
    assert m.traffic_bytes.gpu_link == pytest.approx(factor * 0.5 * 2 * P + 0.5 * 2 * P, rel=1e-6)


def test_each_accumulator_is_its_own_pinned_tensor() -> None:
    """The 10B workload (GAS 51): one pinned 16-bit accumulator per parameter tensor, each rounded
    up to a power of two by PyTorch's caching host allocator. 2 B x 10,279,239,680 = 20,558,479,360 B
    exact; rounding moves the 50304 x 4096 embedding (412,090,368 -> 536,870,912 B) and each block's
    53,248-element norms-and-biases remainder (106,496 -> 131,072 B; offsim lumps them as one tensor),
    the other tensors being powers of two already: + 124,780,544 + 50 x 24,576 = 20,684,488,704 B."""
    from offsim.systems import zero_offload
    for allocator, want in (("caching", 20_684_488_704), ("exact", 20_558_479_360)):
        st = load_strategy("zero-offload").model_copy(update={"host_allocator": allocator})
        system = zero_offload.compose(make_run_config("dgx2-v100", "zero-offload-10b", st))
        needs = system.mechanisms["grads"].footprint()
        assert needs[1].nbytes == want
