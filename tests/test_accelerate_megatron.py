"""Accelerate (DeepSpeed plugin, FSDP) and Megatron-Core option files as strategies (issue 17,
items 2-3): each maps onto the expected knobs, runs, and says what it approximates."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from offsim import make_run_config, simulate
from offsim.cli import app
from offsim.config.accelerate import reading_from_accelerate
from offsim.config.ds_config import reading_from_ds_config
from offsim.config.loading import load_workload, read_strategy
from offsim.config.megatron import parse_arguments, reading_from_megatron
from offsim.errors import ConfigError

DATA = Path(__file__).parent / "data" / "user_configs"
runner = CliRunner()


def test_accelerate_deepspeed_plugin_is_the_ds_config_it_builds() -> None:
    acc = read_strategy(str(DATA / "accelerate_deepspeed_zero3_offload.yaml"), load_workload("tiny"))
    ds = reading_from_ds_config({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"},
                                                       "offload_param": {"device": "cpu"}}}, "same.json")
    skip = {"name", "description", "provenance"}
    assert acc.fmt == "accelerate"
    assert acc.strategy.model_dump(exclude=skip) == ds.strategy.model_dump(exclude=skip)
    assert acc.precision["params"] == "fp16"  # mixed_precision: fp16
    assert any(line.startswith("num_processes:") for line in acc.ignored)


def test_accelerate_plugin_defaults_to_stage_2_and_refuses_unknown_keys(tmp_path: Path) -> None:
    r = reading_from_accelerate({"distributed_type": "DEEPSPEED", "deepspeed_config": {
        "offload_optimizer_device": "cpu"}}, tmp_path / "a.yaml")
    assert r.strategy.zero_stage == 2 and r.strategy.placement.optimizer_states == "cpu"
    with pytest.raises(ConfigError, match=r"unknown Accelerate key 'deepspeed_config\.zero_stag'; did you mean "
                                          r"'deepspeed_config\.zero_stage'"):
        reading_from_accelerate({"distributed_type": "DEEPSPEED", "deepspeed_config": {"zero_stag": 3}},
                                tmp_path / "a.yaml")


def test_accelerate_deepspeed_config_file(tmp_path: Path) -> None:
    (tmp_path / "ds.json").write_text('{"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme"}}}')
    r = reading_from_accelerate({"distributed_type": "DEEPSPEED", "deepspeed_config": {
        "deepspeed_config_file": "ds.json"}}, tmp_path / "acc.yaml")
    assert r.strategy.placement.optimizer_states == "nvme"
    with pytest.raises(ConfigError, match="zero_stage is set beside deepspeed_config_file"):
        reading_from_accelerate({"distributed_type": "DEEPSPEED", "deepspeed_config": {
            "deepspeed_config_file": "ds.json", "zero_stage": 2}}, tmp_path / "acc.yaml")


def test_fsdp2_cpu_offload_maps_and_says_what_it_approximates() -> None:
    r = read_strategy(str(DATA / "accelerate_fsdp2_offload.yaml"))
    st = r.strategy
    assert st.zero_stage == 3 and st.optimizer_device == "cpu" and st.pin_memory
    assert (st.placement.params, st.placement.grads, st.placement.optimizer_states) == ("cpu", "cpu", "cpu")
    assert st.activation_checkpointing is True
    assert any("fp32 parameter shard" in a for a in r.approximations)
    assert any("torch AdamW on the CPU" in a for a in r.approximations)
    assert any(line.startswith("fsdp_config.fsdp_cpu_ram_efficient_loading") for line in r.ignored)


def test_fsdp1_sharding_strategy_sets_the_stage() -> None:
    r = reading_from_accelerate({"distributed_type": "FSDP", "fsdp_config": {
        "sharding_strategy": "SHARD_GRAD_OP"}}, Path("f.yaml"))  # prefix fsdp_ added, as Accelerate does
    assert r.strategy.zero_stage == 2 and r.strategy.optimizer_device == "gpu"


@pytest.mark.parametrize("name", ["accelerate_deepspeed_zero3_offload.yaml", "accelerate_fsdp2_offload.yaml",
                                  "megatron_optimizer_offload.yaml", "megatron_args.txt"])
def test_user_files_run(name: str) -> None:
    cfg = make_run_config("tiny", "tiny", str(DATA / name), iterations=2)
    m = simulate(cfg).metrics
    assert m.feasible, m.infeasible_reason
    assert m.iteration_time_s > 0


def test_megatron_optimizer_offload_maps_onto_the_megatron_offload_system() -> None:
    """HybridDeviceOptimizer's switches become ``system: megatron-offload`` options; the state is
    placed on the GPU and the system moves the CPU share itself (ZeRO-1: the distributed optimizer)."""
    r = read_strategy(str(DATA / "megatron_optimizer_offload.yaml"))
    st = r.strategy
    assert st.system == "megatron-offload" and st.zero_stage == 1 and st.optimizer_device == "gpu"
    assert st.system_options == {"optimizer_offload_fraction": 0.5, "overlap_cpu_optimizer_d2h_h2d": True,
                                 "pin_cpu_grads": True, "pin_cpu_params": True}
    assert st.placement.optimizer_states == "gpu"
    assert any("equal tensors of one MLP matrix" in a for a in r.approximations)


def test_megatron_pinning_switches() -> None:
    args = ("--use-distributed-optimizer --use-precision-aware-optimizer --optimizer-cpu-offload "
            "--no-pin-cpu-grads --no-pin-cpu-params")
    opts = reading_from_megatron(args, "a.txt").strategy.system_options
    assert (opts["pin_cpu_grads"], opts["pin_cpu_params"]) == (False, False)


def test_megatron_defaults_differ_between_cli_and_config() -> None:
    """The command line's fraction defaults to 1.0, OptimizerConfig's to 0.0 (nothing offloaded)."""
    args = "--use-distributed-optimizer --use-precision-aware-optimizer --optimizer-cpu-offload"
    assert reading_from_megatron(args, "a.txt").strategy.system_options["optimizer_offload_fraction"] == 1.0
    keys = {k.lstrip("-").replace("-", "_"): True for k in args.split()}
    r = reading_from_megatron(keys, "m.yaml")
    assert r.strategy.system_options["optimizer_offload_fraction"] == 0.0
    assert any("nothing is offloaded" in a for a in r.approximations)


def test_megatron_activation_offload_and_errors() -> None:
    r = read_strategy(str(DATA / "megatron_args.txt"))
    st = r.strategy
    assert st.system == "megatron-offload" and st.activation_checkpointing is False
    assert st.system_options["activation_offload_layers"] == 1
    assert st.system_options["optimizer_offload_fraction"] == 1.0  # the command line's default
    alone = reading_from_megatron({"cpu_offloading_num_layers": 2}, "m.yaml").strategy
    assert alone.system_options == {"activation_offload_layers": 2, "optimizer_offload_fraction": 0.0}
    assert reading_from_megatron({"recompute_granularity": "full"}, "m.yaml").strategy.system == "custom"
    with pytest.raises(ConfigError, match="needs use_precision_aware_optimizer"):
        reading_from_megatron({"optimizer_cpu_offload": True}, "m.yaml")
    with pytest.raises(ConfigError, match="cannot be combined with recompute"):
        reading_from_megatron({"cpu_offloading_num_layers": 2, "recompute_granularity": "full"}, "m.yaml")
    with pytest.raises(ConfigError, match=r"unknown Megatron-Core key 'optimizer_cpu_ofload'; did you mean "
                                          r"'optimizer_cpu_offload'"):
        reading_from_megatron({"optimizer_cpu_ofload": True, "cpu_offloading": True}, "m.yaml")


def test_megatron_file_runs_as_the_shipped_system_with_its_options() -> None:
    """The options file and the shipped strategy with the same options simulate identically."""
    from offsim import load_strategy

    user = make_run_config("tiny", "tiny", str(DATA / "megatron_optimizer_offload.yaml"), iterations=2)
    shipped = load_strategy("megatron-offload").model_copy(update={"system_options": user.strategy.system_options})
    same = make_run_config("tiny", "tiny", shipped, iterations=2)
    assert simulate(user).metrics.iteration_time_s == simulate(same).metrics.iteration_time_s


def test_parse_arguments() -> None:
    assert parse_arguments("--bf16 --optimizer-offload-fraction 0.25 --no-foo \\\n --x 3") == {
        "bf16": True, "optimizer_offload_fraction": 0.25, "foo": False, "x": 3}


def test_cli_explain_accelerate() -> None:
    result = runner.invoke(app, ["strategies", "--explain", str(DATA / "accelerate_fsdp2_offload.yaml")])
    assert result.exit_code == 0, result.output
    assert "approximated: fsdp_offload_params" in result.output
