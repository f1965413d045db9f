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
from offsim.systems._part_static import MEGATRON_ATTENTION_BUFFER, megatron_attention_buffer_bytes
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
    cases' 5%: vanilla 18,385,947,136 - 1,610,612,736 = 16,775,334,400 vs 17,233,556,275 (-2.7%),
    DOS 28,114,176,508 - 1,610,612,736 = 26,503,563,772 vs 26,349,624,361 (+0.6%); each 268,435,456 B
    (Megatron's attention buffer) above the figures before it was counted (-4.2%, -0.4%)."""
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


@pytest.mark.parametrize("case_id", [VANILLA, DOS])
def test_megatron_attention_buffer_counted(case_id: str) -> None:
    """The buffer is a GPU item held through the iteration (footprint moment None) of
    1 x 32 x 2048^2 x 2 = 268,435,456 B, in both cases (the fork's static state keeps it), and it
    raises the simulated GPU peak by exactly that (the buffer is held at every moment)."""
    cfg = _cfg(case_id)
    gpu = footprint(cfg).breakdown["gpu"]
    assert gpu[MEGATRON_ATTENTION_BUFFER] == 268_435_456
    without = cfg.model_copy(update={"workload": cfg.workload.model_copy(update={
        "training": cfg.workload.training.model_copy(update={"megatron_attention_buffer": False})})})
    assert MEGATRON_ATTENTION_BUFFER not in footprint(without).breakdown["gpu"]
    assert simulate(cfg).metrics.peak_bytes.gpu - simulate(without).metrics.peak_bytes.gpu == 268_435_456


def test_megatron_attention_buffer_by_hand() -> None:
    """1 x (32 / tp) x s^2 x 2 B: tensor parallelism splits the heads (np = heads per rank), a
    micro-batch of 2 doubles it, fp32 params double it; none with flash attention or for other
    frameworks."""
    cfg = _cfg(VANILLA)

    def with_training(**kw: object) -> RunConfig:
        tr = cfg.workload.training.model_copy(update=kw)
        return cfg.model_copy(update={"workload": cfg.workload.model_copy(update={"training": tr})})

    assert megatron_attention_buffer_bytes(cfg) == 32 * 2048 * 2048 * 2
    assert megatron_attention_buffer_bytes(with_training(tensor_parallel=4)) == 8 * 2048 * 2048 * 2
    assert megatron_attention_buffer_bytes(with_training(micro_batch=2, seq_len=1024)) == 2 * 32 * 1024 * 1024 * 2
    assert megatron_attention_buffer_bytes(with_training(flash_attention=True)) == 0
    assert megatron_attention_buffer_bytes(with_training(megatron_attention_buffer=False)) == 0
    fp32 = cfg.model_copy(update={"workload": cfg.workload.model_copy(update={
        "precision": cfg.workload.precision.model_copy(update={"params": "fp32"})})})
    assert megatron_attention_buffer_bytes(fp32) == 32 * 2048 * 2048 * 4
