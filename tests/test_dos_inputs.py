"""Deep Optimizer States 7B cases (issue 23): their inputs against the artifact's logs, and their
GPU peak item by item against the sources.

Logs: github.com/DataStates/artifacts deep-optimizer-states/sample-logs/deep-optimizer-states-output-7B/
log-7B-...-prefetch0-flush_async0-opt_gaps0.log (vanilla) and ...-prefetch1-flush_async1-opt_gaps2.log
(DOS). Their printed DeepSpeed config (config.py print ``zero_config``, stage3.py:137/138) and
Megatron-DeepSpeed argument dump are copied below beside each input; the fork that ran is
DataStates/DeepSpeed 4570a955 (the logs' ds_report), its stage3.py read for the GPU items.
"""

from __future__ import annotations

import pytest

from offsim.api import simulate
from offsim.config.run import RunConfig
from offsim.fit_check import footprint
from offsim.validation import case_config, default_cases_path, load_cases

VANILLA = "dos-7b-vanilla-zero3-cpu-optimizer"
DOS = "dos-7b-deep-optimizer-states"

#: torch max_memory_allocated over a steady iteration, bytes: the Max_MA of the logs' "Engine after
#: backward" lines (16.05 and 24.54 GiB), as validation/cases.yaml reads them
MEASURED_MAX_MA_BYTES = {VANILLA: 17_233_556_275, DOS: 26_349_624_361}


def _cfg(case_id: str) -> RunConfig:
    case = next(c for c in load_cases(default_cases_path()) if c.id == case_id)
    return case_config(case)


@pytest.mark.parametrize("case_id", [VANILLA, DOS])
def test_inputs_as_the_logs_print_them(case_id: str) -> None:
    cfg = _cfg(case_id)
    st, tr, pr = cfg.strategy, cfg.workload.training, cfg.workload.precision
    # zero_config: overlap_comm=True (both logs), reduce_scatter=True, contiguous_gradients=True; the
    # vanilla case's override overlap_grad_offload false (71da749, for part_grads_async 0) moves no
    # figure (test below): its removal is handed to the lead with the case notes
    if case_id == DOS:
        assert st.overlap_grad_offload is True
    assert st.reduce_scatter is True
    # stage3.py:137 "Reduce bucket size 500,000,000", :138 "Prefetch bucket size 50,000,000"
    assert st.reduce_bucket_params == 500_000_000
    assert st.zero3_prefetch_bucket_params == 50_000_000
    # max_live_parameters=1,000,000,000 max_reuse_distance=1,000,000,000 sub_group_size=10000000
    assert st.zero3_max_live_params == 1_000_000_000
    assert st.reuse_distance_params == 1_000_000_000
    assert st.sub_group_params == 10_000_000
    # offload_optimizer=DeepSpeedZeroOffloadOptimizerConfig(device='cpu', ..., pin_memory=True, ...)
    assert st.pin_memory is True
    assert st.placement.optimizer_states == "cpu" and st.placement.params == "gpu"
    # Megatron: micro_batch_size 1, global_batch_size 1 (gradient_accumulation_steps 1), seq_length
    # 2048, --checkpoint-activations (checkpoint_num_layers 1), use_flash_attn False, bf16
    assert (tr.micro_batch, tr.grad_accumulation, tr.data_parallel, tr.seq_len) == (1, 1, 1, 2048)
    assert tr.activation_checkpointing is True and tr.flash_attention is False
    assert st.activation_checkpointing is None
    # params_dtype torch.bfloat16; data_types grad_accum_dtype bf16; communication_data_type None -> bf16
    assert (pr.compute, pr.params, pr.grads) == ("bf16", "bf16", "bf16")


def test_vanilla_overlap_comm_moves_no_figure() -> None:
    """overlap_comm (offsim's overlap_grad_offload) as the log prints it, True, gives the figures the
    old override False gave: with one micro-batch per step the fork's blocking boundary copy
    (stage3.py partition_grads, copy_(non_blocking=part_grads_async=False)) makes the host wait for
    every flush either way (offsim.systems._part_grads._flushes_waited)."""
    cfg = _cfg(VANILLA)
    off = cfg.model_copy(update={"strategy": cfg.strategy.model_copy(update={"overlap_grad_offload": False})})
    on_m, off_m = simulate(cfg).metrics, simulate(off).metrics
    assert on_m.peak_bytes.gpu == off_m.peak_bytes.gpu
    assert on_m.iteration_time_s == pytest.approx(off_m.iteration_time_s, rel=1e-9)


def test_gpu_items_as_the_fork_allocates_them() -> None:
    """Hand counts of the vanilla case's GPU items (bytes):
    - 16-bit params: the log's 5,948,837,888 parameters x 2 B = 11,897,675,776 (log: MA 11.08 GiB after
      building the model; one rank, so every partition is the whole tensor);
    - IPG buffer: reduce_bucket_size 5e8 x bf16 2 B = 1,000,000,000 (_setup_for_real_optimizer; log:
      MA 11.08 -> 12.01 GiB at "After initializing ZeRO optimizer");
    - boundary norm: the LM head's partition copied back to the GPU (partition_grads,
      grad_buffer.to(device), bf16) and its fp64 chunk (_constant_buffered_norm2, chunk <= 2.5e8):
      50,304 x 4,096 = 206,045,184 elements x (2 + 8) B = 2,060,451,840."""
    gpu = footprint(_cfg(VANILLA)).breakdown["gpu"]
    assert gpu["params (16-bit)"] == 5_948_837_888 * 2
    ipg = [size for name, size in gpu.items() if name.startswith("IPG bucket buffer")]
    assert ipg == [500_000_000 * 2]
    assert gpu["boundary gradient norms (fp64 chunk, GPU slices)"] == 50_304 * 4_096 * (2 + 8)


@pytest.mark.parametrize("case_id", [VANILLA, DOS])
def test_allocated_peak_within_the_measure(case_id: str) -> None:
    """The engine's GPU level starts at the profile's reserved item (CUDA context, allocator slack;
    a100-80gb-pcie4 reserved_gib 1.5 = 1,610,612,736 B), which torch max_memory_allocated does not hold
    (the logs print MA 0.0 GB before building the model). Without it offsim's peak is within the
    cases' 5%: vanilla 18,117,511,680 - 1,610,612,736 = 16,506,898,944 vs 17,233,556,275 (-4.2%),
    DOS 27,845,741,052 - 1,610,612,736 = 26,235,128,316 vs 26,349,624,361 (-0.4%)."""
    cfg = _cfg(case_id)
    result = simulate(cfg)
    levels = result.levels()
    gpu = levels[levels.tier == "gpu"]
    reserved = cfg.hardware.gpu.reserved_bytes
    assert reserved == 1.5 * 2**30
    assert gpu["bytes"].iloc[0] == reserved
    allocated = result.metrics.peak_bytes.gpu - reserved
    assert allocated == pytest.approx(MEASURED_MAX_MA_BYTES[case_id], rel=0.05)


def test_megatron_attention_buffer_hand_count() -> None:
    """Megatron-DeepSpeed's unfused attention (use_flash_attn False) keeps its baddbmm input in a
    GlobalMemoryBuffer (megatron/model/transformer.py CoreAttention, megatron/core/utils.py
    GlobalMemoryBuffer.get_tensor): micro-batch x heads x seq x seq x 2 B = 1 x 32 x 2048^2 x 2 =
    268,435,456 B = 0.25 GiB, kept from the first forward. The vanilla log's MA before forward rises
    12.02 -> 12.28 GiB after iteration 1 (printed to 0.01 GiB: 0.25-0.27 GiB)."""
    wl = _cfg(VANILLA).workload
    buffer_bytes = wl.training.micro_batch * wl.model.heads * wl.training.seq_len ** 2 * 2
    assert buffer_bytes == 268_435_456
    assert (12.28 - 12.02 - 0.01) * 2**30 <= buffer_bytes <= (12.28 - 12.02 + 0.01) * 2**30


@pytest.mark.xfail(strict=True, reason="offsim does not count Megatron-DeepSpeed's GlobalMemoryBuffer of the "
                   "unfused attention (268,435,456 B here): a static GPU item in systems/_part_static.py, not this "
                   "helper's file (issue 23, f11 report)")
def test_megatron_attention_buffer_counted() -> None:
    gpu = footprint(_cfg(VANILLA)).breakdown["gpu"]
    assert any("attention" in name and size >= 268_435_456 for name, size in gpu.items())
