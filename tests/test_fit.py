"""``offsim fit`` (issue 17 item 5), DeepSpeed's estimator as offsim re-derives it, the parameter
counts in ``run --json``/``fit --json``, and the shipped Llama 3 workloads as Llama 3.1's shapes."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from offsim import make_run_config
from offsim.cli import app
from offsim.config.hf import workload_from_hf_config
from offsim.config.loading import load_workload, shipped_files
from offsim.plan.ds_estimator import (
    estimator_table,
    largest_module_params,
    matching_row,
    zero2_bytes,
    zero3_bytes,
)

runner = CliRunner()
GIB = 2**30


def _strict(text: str) -> Any:
    """Parse JSON refusing NaN and Infinity (RFC 8259)."""
    def refuse(name: str) -> None:
        raise ValueError(f"non-standard JSON constant {name}")

    return json.loads(text, parse_constant=refuse)


def _fit(*args: str) -> tuple[int, Any]:
    result = runner.invoke(app, ["fit", *args, "--json"])
    return result.exit_code, _strict(result.stdout) if result.stdout.strip() else None


# ------------------------------------------------------------------ DeepSpeed's estimator, as documented
# DeepSpeed docs/code-docs/source/memory.rst ("Memory Requirements", read at deepspeedai/DeepSpeed
# cef03bcd91): estimate_zero3_model_states_mem_needs_all_cold(total_params=2851e6,
# largest_layer_params=32e6, num_gpus_per_node=8, num_nodes=1) prints, per CPU | per GPU ("GB" = 2^30):
ZERO3_COLD_DOC = [  # (offload_optimizer, offload_param, zero_init): (cpu GiB, gpu GiB)
    ((True, True, True), (71.69, 0.12)),
    ((True, True, False), (127.45, 0.12)),
    ((True, False, True), (63.72, 0.78)),
    ((True, False, False), (127.45, 0.78)),
    ((False, False, True), (1.43, 6.09)),
    ((False, False, False), (127.45, 6.09)),
]


@pytest.mark.parametrize(("options", "printed"), ZERO3_COLD_DOC)
def test_zero3_estimator_matches_the_documented_cold_table(options: tuple[bool, bool, bool],
                                                            printed: tuple[float, float]) -> None:
    optim, param, init = options
    cpu, gpu = zero3_bytes(2851e6, 32e6, 8, 1, offload_optimizer=optim, offload_param=param, zero_init=init)
    assert (round(cpu / GIB, 2), round(gpu / GIB, 2)) == printed


def test_zero2_estimator_against_the_documented_cold_table() -> None:
    # memory.rst, estimate_zero2_model_states_mem_needs_all_cold(total_params=2851e6, 8 GPUs, 1 node):
    # "127.45GB | 5.31GB | offload_optimizer=cpu" and "127.45GB | 15.93GB | offload_optimizer=none".
    cpu, gpu = zero2_bytes(2851e6, 8, 1, offload_optimizer=True)
    assert (round(cpu / GIB, 2), round(gpu / GIB, 2)) == (127.45, 5.31)
    cpu, gpu = zero2_bytes(2851e6, 8, 1, offload_optimizer=False)
    assert round(cpu / GIB, 2) == 127.45
    # The page's 15.93 GiB GPU figure is the older 4P + 16P/T; stage_1_and_2.py (02aa38c3a5)
    # computes 2P + 18P/T (16-bit params; 16-bit and fp32 grads, fp32 params and Adam moments).
    assert round(gpu / GIB, 2) == 11.28


def test_zero3_estimator_matches_the_t5_large_worked_example() -> None:
    # memory.rst, "GPU RAM", t5-large on 4 GPUs: total 737.67M, largest layer 32.90M (the shared
    # 32128 x 1024 embedding); case1 3291MB, case2 125MB, case3 477MB (bytes >> 20).
    p, lg = 737.67e6, 32128 * 1024
    cases = {(False, False): 3291, (True, True): 125, (True, False): 477}
    for (optim, param), mib in cases.items():
        _, gpu = zero3_bytes(p, lg, 4, 1, offload_optimizer=optim, offload_param=param)
        assert int(gpu) >> 20 == mib


def test_the_table_has_deepspeeds_lines_in_its_order() -> None:
    rows = estimator_table(1e9, 1e8, 2, 1)
    assert [(r.stage, r.options) for r in rows][:3] == [
        (2, "offload_optimizer=cpu"), (2, "offload_optimizer=none"),
        (3, "offload_param=cpu, offload_optimizer=cpu, zero_init=1")]
    assert len(rows) == 8 and {r.stage for r in rows} == {2, 3}


def test_largest_module_is_the_embedding_or_the_biggest_matrix() -> None:
    llama = load_workload("llama2-7b").model
    assert largest_module_params(llama) == 32000 * 4096  # embed_tokens (and lm_head) > 4096 x 11008
    mixtral = load_workload("mixtral-8x7b").model
    assert largest_module_params(mixtral) == 32000 * 4096  # one expert's w1 is 4096 x 14336, smaller
    wide_mlp = llama.model_copy(update={"vocab": 1000})
    assert largest_module_params(wide_mlp) == 4096 * 11008


@pytest.mark.parametrize(("strategy", "line"), [
    ("zero-offload", "ZeRO-2 offload_optimizer=cpu"),
    ("zero-infinity-cpu", "ZeRO-3 offload_param=cpu, offload_optimizer=cpu, zero_init=1"),
    ("zero-infinity-nvme", None),  # the estimator has no NVMe lines
    ("twin-flow", None),  # a share of the optimizer on the GPU: no line either
])
def test_strategies_map_onto_the_estimator_line_they_resemble(strategy: str, line: str | None) -> None:
    cfg = make_run_config("rtx4090-pcie4-ws", "llama2-7b", strategy)
    row = matching_row(cfg, estimator_table(1e9, 1e8, 1, 1))
    assert (None if row is None else f"ZeRO-{row.stage} {row.options}") == line


# ------------------------------------------------------------------------------------------ offsim fit
@pytest.fixture(scope="module")
def main_example() -> tuple[int, Any]:
    """``offsim fit`` on the README's main pairing, every shipped strategy."""
    return _fit("-H", "rtx4090-pcie4-ws", "-w", "llama2-7b")


def test_fit_json_fields(main_example: tuple[int, Any]) -> None:
    code, doc = main_example
    assert code == 0
    assert {"hardware", "workload", "params_total", "params_active", "fits_any", "strategies",
            "deepspeed_estimator"} <= set(doc)
    assert doc["params_total"] == doc["params_active"] == load_workload("llama2-7b").model.total_params
    assert {r["strategy"] for r in doc["strategies"]} == set(shipped_files("strategy"))
    for row in doc["strategies"]:
        assert {"strategy", "notes", "status", "fits", "iteration_time_s", "tokens_per_s", "tiers", "margins",
                "reason", "simulated_peak_bytes", "deepspeed"} <= set(row)
    fitting = [r for r in doc["strategies"] if r["fits"]]
    assert fitting and all(set(r["tiers"]) == {"gpu", "host_pinned", "host", "nvme"} for r in fitting)
    for row in fitting:  # each tier's verdict with its margin: the GPU's first, then those that hold something
        tiers = [m["tier"] for m in row["margins"]]
        assert tiers[0] == "gpu" and set(tiers) <= set(row["tiers"])
        assert row["margins"][0]["verdict"] in ("fits", "marginal")  # marginal is accepted (gpu_memory.md §4)
        assert all(m["spare_bytes"] >= 0 and m["verdict"] == "fits" for m in row["margins"][1:])
    for row in fitting:
        for rep in row["tiers"].values():
            assert rep["peak_bytes"] <= rep["capacity_bytes"]
            assert sum(i["bytes"] for i in rep["largest"]) <= rep["peak_bytes"] * (1 + 1e-9)


def test_fit_sorts_fastest_first_then_the_ones_that_do_not_fit(main_example: tuple[int, Any]) -> None:
    rows = main_example[1]["strategies"]
    fits = [r["fits"] for r in rows]
    assert fits == sorted(fits, reverse=True) and any(fits) and not all(fits)
    times = [r["iteration_time_s"] for r in rows if r["fits"]]
    assert times == sorted(times) and all(t > 0 for t in times)


def test_fit_gives_the_reason_of_those_that_do_not_fit(main_example: tuple[int, Any]) -> None:
    rows = {r["strategy"]: r for r in main_example[1]["strategies"]}
    gpu_only = rows["gpu-only"]  # 6.74B params with Adam on a 24 GB GPU
    assert gpu_only["status"] == "does-not-fit" and gpu_only["iteration_time_s"] is None
    reason = gpu_only["reason"]
    assert reason["tier"] == "gpu" and reason["need_bytes"] > reason["capacity_bytes"]
    gpu = make_run_config("rtx4090-pcie4-ws", "llama2-7b", "gpu-only").hardware.gpu
    assert reason["capacity_bytes"] == gpu.memory_bytes
    assert "optimizer state" in reason["text"]


def test_fit_time_is_run_time(main_example: tuple[int, Any]) -> None:
    """The time fit reports is what ``offsim run`` simulates with the same iterations."""
    row = next(r for r in main_example[1]["strategies"] if r["strategy"] == "zero-offload")
    run = runner.invoke(app, ["run", "-H", "rtx4090-pcie4-ws", "-w", "llama2-7b", "-s", "zero-offload", "--json", "-q"])
    assert math.isclose(row["iteration_time_s"], _strict(run.stdout)["iteration_time_s"], rel_tol=1e-12)


def test_fit_carries_deepspeeds_estimate_beside_offsims(main_example: tuple[int, Any]) -> None:
    doc = main_example[1]
    est = doc["deepspeed_estimator"]
    p = doc["params_total"]
    assert (est["params"], est["largest_layer_params"], est["gpus_per_node"], est["nodes"]) == (p, 32000 * 4096, 1, 1)
    zero_offload = next(r for r in doc["strategies"] if r["strategy"] == "zero-offload")["deepspeed"]
    assert zero_offload["estimator_gpu_bytes"] == 2 * p  # ZeRO-2, optimizer on the CPU: 16-bit params
    # offsim's GPU figure adds what the estimator leaves out (activations, buffers, the CUDA reserve)
    extra = sum(i["bytes"] for i in zero_offload["not_in_estimator"]["gpu"])
    assert extra > 0 and zero_offload["offsim_gpu_bytes"] >= zero_offload["estimator_gpu_bytes"] + extra * (1 - 1e-9)
    assert any("activations" in i["what"] for i in zero_offload["not_in_estimator"]["gpu"])


def test_fit_table_for_humans() -> None:
    result = runner.invoke(app, ["fit", "-H", "tiny", "-w", "tiny"], terminal_width=200)
    assert result.exit_code == 0, result.output
    assert f"of {len(shipped_files('strategy'))} strategies fit" in result.output
    assert "DeepSpeed's estimator" in result.output and "model states only" in result.output
    p = load_workload("tiny").model.total_params
    assert f"{2 * p / GIB:.2f}" in result.output  # the ZeRO-2 optimizer-on-CPU GPU line


def test_fit_strategies_repeated_or_comma_separated() -> None:
    code, doc = _fit("-H", "tiny", "-w", "tiny", "-s", "zero-offload,gpu-only", "-s", "fuyou", "-s", "gpu-only")
    assert code == 0
    names = [r["strategy"] for r in doc["strategies"]]
    assert sorted(names) == ["fuyou", "gpu-only", "zero-offload"]
    times = [r["iteration_time_s"] for r in doc["strategies"]]
    assert times == sorted(times)


def test_fit_nowhere_exits_1_with_a_reason_per_strategy() -> None:
    code, doc = _fit("-H", "laptop-a1000-4gb", "-w", "llama2-7b")
    assert code == 1 and doc["fits_any"] is False
    for row in doc["strategies"]:
        assert not row["fits"] and row["reason"]["text"]
        if row["status"] == "does-not-fit":
            r = row["reason"]
            assert r["tier"] in ("gpu", "host_pinned", "host") and r["need_bytes"] > r["capacity_bytes"]
        else:  # strategies that keep state on NVMe: this laptop has none
            assert row["status"] == "cannot-run" and "nvme" in row["reason"]["text"]
    assert {r["status"] for r in doc["strategies"]} == {"does-not-fit", "cannot-run"}
    text = runner.invoke(app, ["fit", "-H", "laptop-a1000-4gb", "-w", "llama2-7b"], terminal_width=250).output
    assert f"0 of {len(shipped_files('strategy'))} strategies fit" in text
    for row in doc["strategies"]:
        assert f"{row['strategy']} does not fit" in text or f"{row['strategy']} cannot run here" in text


def test_fit_bad_input_exits_2_in_one_line() -> None:
    for args in (["-s", "no-such-strategy"], ["-H", "no-such-box"],
                 ["-H", "laptop-a1000-4gb", "-s", "zero-infinity-nvme"]):  # asked for, cannot run here
        result = runner.invoke(app, ["fit", *args])
        assert result.exit_code == 2, args
        assert "Traceback" not in result.output and result.output.count("error:") == 1


# ------------------------------------------------------------------ params_total / params_active
def test_run_and_fit_json_report_total_and_active_params_of_a_moe() -> None:
    # Mistral's announcement: 46.7B total, 12.9B per token (tolerances of tests/test_hf_models.py).
    run = runner.invoke(app, ["run", "-H", "h100-sxm5-gen5", "-w", "mixtral-8x7b", "-s", "zero-infinity-cpu",
                              "--json", "-q"])
    assert run.exit_code == 0, run.output
    doc = _strict(run.stdout)
    assert doc["params_total"] == pytest.approx(46.7e9, rel=0.002)
    assert doc["params_active"] == pytest.approx(12.9e9, rel=0.005)
    code, fit = _fit("-H", "laptop-a1000-4gb", "-w", "mixtral-8x7b", "-s", "zero-offload")
    assert code == 1  # 46.7B params do not fit a laptop; the counts are reported all the same
    assert (fit["params_total"], fit["params_active"]) == (doc["params_total"], doc["params_active"])


# -------------------------------------------------------------------------- Llama 3.1 = llama3-* shapes
# config.json of meta-llama/Llama-3.1-8B and Llama-3.1-70B on the Hugging Face hub (the keys that
# shape the model; as copied in ../shared/reference/config_formats.md §6.3 and in third-party copies
# of the files): the same shapes as Llama 3, with a 131072 context by RoPE scaling ("rope_type":
# "llama3", factor 8), which changes neither parameters nor FLOPs.
LLAMA31 = {
    "llama3-8b": {"hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
                  "num_attention_heads": 32, "num_key_value_heads": 8},
    "llama3-70b": {"hidden_size": 8192, "intermediate_size": 28672, "num_hidden_layers": 80,
                   "num_attention_heads": 64, "num_key_value_heads": 8},
}
LLAMA31_COMMON = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "attention_bias": False,
                  "mlp_bias": False, "hidden_act": "silu", "max_position_embeddings": 131072,
                  "rms_norm_eps": 1e-05, "rope_theta": 500000.0, "tie_word_embeddings": False,
                  "vocab_size": 128256,
                  "rope_scaling": {"factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                                   "original_max_position_embeddings": 8192, "rope_type": "llama3"}}
#: Exact counts (config_formats.md §6.3): 8,030,261,248 and 70,553,706,496.
LLAMA31_TOTAL = {"llama3-8b": 8_030_261_248, "llama3-70b": 70_553_706_496}


@pytest.mark.parametrize("shipped", sorted(LLAMA31))
def test_shipped_llama3_workloads_are_llama31_shapes(shipped: str, tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    data = {**LLAMA31_COMMON, **LLAMA31[shipped]}
    from_hub = workload_from_hf_config(data, path).model
    ours = load_workload(shipped).model
    assert from_hub.model_dump(exclude={"max_positions"}) == ours.model_dump(exclude={"max_positions"})
    assert from_hub.total_params == ours.total_params == LLAMA31_TOTAL[shipped]


def test_fit_reads_a_ds_config_as_run_does() -> None:
    """A DeepSpeed file is read with the workload, as ``offsim run`` reads it: the same time, and
    what offsim ignored in it kept with the row."""
    ds = str(Path(__file__).parent / "data" / "user_configs" / "hf_zero3_cpu_offload.json")
    code, doc = _fit("-H", "tiny", "-w", "tiny", "-s", ds)
    assert code == 0
    (row,) = doc["strategies"]
    assert row["strategy"] == ds and row["fits"] and row["notes"]
    assert row["deepspeed"]["options"].startswith("ZeRO-3 offload_param=cpu, offload_optimizer=cpu")
    run = runner.invoke(app, ["run", "-H", "tiny", "-w", "tiny", "-s", ds, "--json", "-q"])
    assert math.isclose(row["iteration_time_s"], _strict(run.stdout)["iteration_time_s"], rel_tol=1e-12)
