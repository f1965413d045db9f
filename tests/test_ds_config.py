"""DeepSpeed ds_config files as strategies (issue 17, item 1): round trips of the shipped DeepSpeed
strategies, the documentation's ZeRO-3 offload configs, the bad-input errors, and the CLI paths.

The configs under ``tests/data/user_configs/`` and their sources are listed in its README.md.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from offsim import make_run_config, simulate
from offsim.cli import app
from offsim.config.ds_config import ds_config_from_strategy, inexpressible, reading_from_ds_config
from offsim.config.loading import load_strategy, load_workload, read_strategy
from offsim.errors import ConfigError

DATA = Path(__file__).parent / "data" / "user_configs"
runner = CliRunner()

#: Shipped DeepSpeed strategies, and the knobs a ds_config cannot carry for each (with why).
ROUND_TRIP = {
    "zero-offload": set(),
    "zero-infinity-cpu": set(),
    "zero-infinity-nvme": set(),
    "twin-flow": set(),
    # ZeRO-Offload's delayed parameter update was never in DeepSpeed (no key; deepspeed_runtime.md §6)
    "zero-offload-dpu": {"delayed_param_update"},
    # DeepSpeed's SuperOffload exists at stage 3 only, as the shipped preset is now
    "superoffload": set(),
}


def _metrics(cfg: object) -> dict[str, object]:
    m = simulate(cfg).metrics  # type: ignore[arg-type]
    return {"t": m.iteration_time_s, "peak": m.peak_bytes.model_dump(), "traffic": m.traffic_bytes.model_dump()}


@pytest.mark.parametrize("name", list(ROUND_TRIP))
def test_shipped_strategy_round_trips_through_a_ds_config(name: str, tmp_path: Path) -> None:
    st = load_strategy(name)
    lost = {line.split(":", 1)[0] for line in inexpressible(st)}
    assert lost == ROUND_TRIP[name]
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(ds_config_from_strategy(st)))
    back = make_run_config("tiny", "tiny", str(path), iterations=2)
    assert back.workload == load_workload("tiny")  # batch and precision "auto": the workload's
    if not lost:
        assert _metrics(back) == _metrics(make_run_config("tiny", "tiny", st, iterations=2))


def test_superoffload_preset_is_at_deepspeeds_only_stage() -> None:
    """DeepSpeed builds SuperOffloadOptimizer_Stage3 only at stage 3 (runtime/engine.py
    _configure_zero_optimizer; zero/offload_config.py "Only valid with ZeRO Stage 3"): the shipped
    preset is there, and a stage-2 ds_config asking for it is refused."""
    assert load_strategy("superoffload").zero_stage == 3
    stage2 = {"gradient_clipping": 0.0, "zero_optimization": {
        "stage": 2, "offload_optimizer": {"device": "cpu", "super_offload": True}}}
    with pytest.raises(ConfigError, match="super_offload needs stage 3"):
        reading_from_ds_config(stage2, "so.json")


@pytest.mark.parametrize("name", ["hf_zero3_cpu_offload.json", "hf_zero3_nvme_offload.json",
                                  "ds_zero3_cpu_offload.json", "ds_zero3_nvme_offload.json"])
def test_documentation_configs_import_and_run(name: str) -> None:
    cfg = make_run_config("rtx4090-pcie4-ws", "llama2-7b", str(DATA / name), iterations=2)
    st = cfg.strategy
    assert st.zero_stage == 3 and st.optimizer_device == "cpu"
    tier = "nvme" if "nvme" in name else "cpu"
    assert st.placement.params == tier and st.placement.optimizer_states == tier
    assert simulate(cfg).metrics.iteration_time_s > 0
    assert cfg.notes  # every key offsim does not model is listed


def test_hf_auto_values_resolve_from_the_hidden_size() -> None:
    r = read_strategy(str(DATA / "hf_zero3_cpu_offload.json"), load_workload("llama2-7b"))
    s = {x.key: x for x in r.settings}
    assert s["zero_optimization.reduce_bucket_size"].value == 4096 * 4096
    assert s["zero_optimization.stage3_prefetch_bucket_size"].value == int(0.9 * 4096 * 4096)
    assert s["zero_optimization.reduce_bucket_size"].origin == "auto"
    assert r.strategy.reduce_bucket_params == 4096 * 4096


def test_hf_nvme_example_as_printed_is_refused_with_the_fix() -> None:
    """The Transformers docs nest ``aio`` inside ``zero_optimization``; DeepSpeed refuses that."""
    with pytest.raises(ConfigError, match=r"zero_optimization\.aio.*'aio' is a top-level key"):
        read_strategy(str(DATA / "hf_zero3_nvme_offload_as_shown.json"))


def test_batch_keys_set_the_workload_batch() -> None:
    cfg = make_run_config("tiny", "tiny", str(DATA / "ds_zero3_cpu_offload.json"))
    assert (cfg.workload.training.micro_batch, cfg.workload.training.grad_accumulation) == (1, 8)
    assert cfg.workload.precision.params == "fp16"  # fp16.enabled true
    assert any("grad_accumulation = 8" in n for n in cfg.notes)


def test_batch_derived_as_deepspeed_does() -> None:
    wl = load_workload("tiny")
    r = reading_from_ds_config({"train_batch_size": 12, "train_micro_batch_size_per_gpu": 3}, "x.json", wl)
    assert r.training == {"micro_batch": 3, "grad_accumulation": 4}
    r = reading_from_ds_config({"train_micro_batch_size_per_gpu": 2}, "x.json", wl)
    assert r.training == {"micro_batch": 2, "grad_accumulation": 1}


def test_contradictory_batch_keys_are_an_error() -> None:
    data = {"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 4}
    with pytest.raises(ConfigError, match=r"32 != 4 \* 4 \* 1"):
        reading_from_ds_config(data, "bad.json", load_workload("tiny"))


def test_unknown_key_names_the_nearest() -> None:
    with pytest.raises(ConfigError, match=r"bad\.json: unknown DeepSpeed key "
                                          r"'zero_optimization\.stage3_max_reuse_distanse'; did you mean "
                                          r"'zero_optimization\.stage3_max_reuse_distance'"):
        reading_from_ds_config({"zero_optimization": {"stage": 3, "stage3_max_reuse_distanse": 1}}, "bad.json")
    with pytest.raises(ConfigError, match=r"did you mean 'train_micro_batch_size_per_gpu'"):
        reading_from_ds_config({"train_micro_batch_size_per_gpus": 1}, "bad.json")


def test_unresolvable_auto_says_what_is_missing() -> None:
    data = {"zero_optimization": {"stage": 3, "reduce_bucket_size": "auto"}}
    with pytest.raises(ConfigError, match=r"hidden size h; no workload is given"):
        reading_from_ds_config(data, "a.json")
    with pytest.raises(ConfigError, match=r"sub_group_size is \"auto\", which neither DeepSpeed nor"):
        reading_from_ds_config({"zero_optimization": {"stage": 3, "sub_group_size": "auto"}}, "a.json",
                               load_workload("tiny"))


def test_deepspeed_ignored_keys_and_defaults() -> None:
    r = reading_from_ds_config({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"},
                                                      "sub_group_size": 5}, "aio": {"thread_count": 4}}, "z.json")
    assert any(line.startswith("aio.thread_count: DeepSpeed itself ignores it") for line in r.ignored)
    assert any(line.startswith("zero_optimization.sub_group_size: DeepSpeed uses it only at stage 3")
               for line in r.ignored)
    st = r.strategy
    assert st.pin_memory is True  # offload_config.py default since v0.19.5
    assert st.overlap_grad_offload is False  # overlap_comm: false below stage 3
    assert st.sub_group_params == 1e12 and st.prefetch_depth == 0


def test_reduce_scatter_maps_at_stage_3_and_is_listed_as_ignored_below() -> None:
    """zero_optimization.reduce_scatter (default true, zero/config.py) picks ZeRO-3's in-place
    all-reduce of a bucket when false (stage3.py __avg_scatter_contiguous_grads); offsim models
    it at stage 3 only, so below that it is reported as ignored."""
    z3 = {"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}}}
    assert reading_from_ds_config(z3, "z3.json").strategy.reduce_scatter is True
    z3["zero_optimization"]["reduce_scatter"] = False
    assert reading_from_ds_config(z3, "z3.json").strategy.reduce_scatter is False
    assert ds_config_from_strategy(reading_from_ds_config(z3, "z3.json").strategy)[
        "zero_optimization"]["reduce_scatter"] is False
    z2 = {"zero_optimization": {"stage": 2, "reduce_scatter": False, "offload_optimizer": {"device": "cpu"}}}
    r = reading_from_ds_config(z2, "z2.json")
    assert r.strategy.reduce_scatter is True
    assert any(line.startswith("zero_optimization.reduce_scatter: offsim models it at stage 3 only")
               for line in r.ignored)


def test_twin_flow_ratio_and_its_stage_rule() -> None:
    r = reading_from_ds_config({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu",
                                                                                           "ratio": 0.3}}}, "t.json")
    assert r.strategy.optimizer_gpu_fraction == pytest.approx(0.7)
    with pytest.raises(ConfigError, match=r"ratio 0\.3 < 1 needs stage 3"):
        reading_from_ds_config({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu",
                                                                                          "ratio": 0.3}}}, "t.json")


def test_cli_run_with_a_ds_config() -> None:
    result = runner.invoke(app, ["run", "-H", "tiny", "-w", "tiny", "-s", str(DATA / "ds_zero3_cpu_offload.json"),
                                 "--json", "--iterations", "2"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["feasible"] is True
    assert "ignored: zero_optimization.contiguous_gradients" in result.stderr


def test_cli_run_bad_ds_config_is_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "ds.json"
    bad.write_text(json.dumps({"zero_optimization": {"stag": 3}}))
    result = runner.invoke(app, ["run", "-H", "tiny", "-w", "tiny", "-s", str(bad)])
    assert result.exit_code == 2
    assert "did you mean 'zero_optimization.stage'" in result.output and "Traceback" not in result.output


def test_cli_explain() -> None:
    path = str(DATA / "hf_zero3_cpu_offload.json")
    result = runner.invoke(app, ["strategies", "--explain", path, "-w", "llama2-7b", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    origins = {s["key"]: s["from"] for s in data["settings"]}
    assert origins["zero_optimization.stage"] == "file"
    assert origins["zero_optimization.reduce_bucket_size"] == "auto"
    assert origins["zero_optimization.offload_optimizer.buffer_count"] == "default"
    assert any(x.startswith("steps_per_print") for x in data["ignored"])
    result = runner.invoke(app, ["strategies", "--explain", path])  # no workload: "auto" unresolvable
    assert result.exit_code == 2 and "no workload is given" in result.output


def test_cli_ds_config(tmp_path: Path) -> None:
    result = runner.invoke(app, ["strategies", "--ds-config", "zero-infinity-nvme"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["zero_optimization"]["offload_param"]["device"] == "nvme"
    out = tmp_path / "dpu.json"
    result = runner.invoke(app, ["strategies", "--ds-config", "zero-offload-dpu", "-o", str(out)])
    assert result.exit_code == 0 and out.exists()
    assert "not expressible in a ds_config, left out: delayed_param_update" in result.stderr


@pytest.mark.parametrize("name", [n for n, lost in ROUND_TRIP.items() if not lost])
def test_cli_round_trip_export_then_run(name: str, tmp_path: Path) -> None:
    """``offsim strategies --ds-config NAME -o FILE`` then ``offsim run -s FILE`` gives the run of
    ``-s NAME``: the same time, peaks per tier and bytes per link (issue 17's round trip, through
    the commands a user types)."""
    out = tmp_path / f"{name}.json"
    exported = runner.invoke(app, ["strategies", "--ds-config", name, "-o", str(out)])
    assert exported.exit_code == 0, exported.output

    def run(strategy: str) -> dict[str, object]:
        result = runner.invoke(app, ["run", "-H", "tiny", "-w", "tiny", "-s", strategy, "--iterations", "2",
                                     "--json", "-q"])
        assert result.exit_code == 0, result.output
        doc = json.loads(result.stdout)
        return {key: doc[key] for key in ("iteration_time_s", "peak_bytes", "traffic_bytes")}

    assert run(str(out)) == run(name)



def test_zero2_offload_takes_deepspeeds_gradient_path_from_a_ds_config_or_a_custom_file(tmp_path: Path) -> None:
    """A user's stage-2 CPU-offload ds_config (read as the zero-offload system) and a custom
    strategy file with the same knobs (no system named) both compose DeepSpeed's ZeRO-2 gradient
    copies (offsim/mechanisms/zero2_grads.py, stage2.py copy_grads_in_partition); stage 3 does not."""
    from offsim.config.run import RunConfig
    from offsim.mechanisms.zero2_grads import Zero2Grads
    from offsim.systems._registry import compose
    from tests.conftest import strategy

    path = tmp_path / "z2.json"
    path.write_text(json.dumps({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}}))
    cfg = make_run_config("tiny", "tiny", str(path), iterations=2)
    assert isinstance(compose(cfg).mechanisms["grads"], Zero2Grads)
    knobs = {"zero_stage": 2, "optimizer_device": "cpu",
             "placement": {"params": "gpu", "grads": "cpu", "optimizer_states": "cpu", "activations": "gpu"}}
    custom = RunConfig(hardware=cfg.hardware, workload=cfg.workload, strategy=strategy(**knobs))
    assert custom.strategy.system == "custom"
    assert isinstance(compose(custom).mechanisms["grads"], Zero2Grads)
    stage3 = RunConfig(hardware=cfg.hardware, workload=cfg.workload, strategy=strategy(**{**knobs, "zero_stage": 3}))
    assert not isinstance(compose(stage3).mechanisms["grads"], Zero2Grads)
