"""Sweep specs and overrides: loading, expansion, aliases, and what is refused at load time."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from offsim.config.hardware import HardwareProfile
from offsim.errors import ConfigError
from offsim.sweep.overrides import Library, apply_overrides, build_run_config, resolve_axis
from offsim.sweep.spec import MAX_POINTS, count_points, expand_range, load_spec, make_plan

ROOT = Path(__file__).resolve().parent.parent
TINY_GRID = ROOT / "sweeps" / "tiny-grid.yaml"


def write_spec(tmp_path: Path, grid: dict | None = None, points: list | None = None, **extra) -> Path:
    doc = {
        "name": "t",
        "base": {"hardware": "tiny", "workload": "tiny", "strategy": "zero-offload"},
        "grid": grid or {},
        **extra,
    }
    if points is not None:
        doc["points"] = points
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_tiny_grid_expands_in_axis_order_with_stable_ids():
    plan = load_spec(TINY_GRID)
    assert plan.axis_keys == ["dram_gib", "nvme_drives", "pcie_gen", "strategy"]
    assert len(plan.points) == 16
    assert plan.points[0].overrides == {
        "dram_gib": 2,
        "nvme_drives": 1,
        "pcie_gen": 3,
        "strategy": "zero-infinity-nvme",
    }
    assert plan.points[1].overrides["strategy"] == "zero-offload"  # the last axis varies fastest
    assert len({p.point_id for p in plan.points}) == 16
    assert [p.point_id for p in load_spec(TINY_GRID).points] == [p.point_id for p in plan.points]


def test_grid_is_crossed_with_the_list(tmp_path):
    path = write_spec(
        tmp_path,
        {"dram_gib": [8, 16]},
        [{"strategy.prefetch_depth": 1}, {"strategy.prefetch_depth": 2, "micro_batch": 2}],
    )
    plan = load_spec(path)
    assert [p.overrides for p in plan.points] == [
        {"dram_gib": 8, "strategy.prefetch_depth": 1},
        {"dram_gib": 8, "strategy.prefetch_depth": 2, "micro_batch": 2},
        {"dram_gib": 16, "strategy.prefetch_depth": 1},
        {"dram_gib": 16, "strategy.prefetch_depth": 2, "micro_batch": 2},
    ]
    assert plan.axis_keys == ["dram_gib", "strategy.prefetch_depth", "micro_batch"]


def test_ranges():
    assert expand_range("a", {"start": 1, "stop": 4, "step": 1}) == [1, 2, 3, 4]
    assert expand_range("a", {"start": 16, "stop": 128, "factor": 2}) == [16, 32, 64, 128]
    assert expand_range("a", {"start": 0.5, "stop": 1.5, "step": 0.5}) == [0.5, 1.0, 1.5]
    with pytest.raises(ValueError, match="start, stop, step"):
        expand_range("a", {"start": 1, "stop": 4})


@pytest.mark.parametrize(
    ("grid", "message"),
    [
        ({"dram_gbi": [1]}, "axis 'dram_gbi': not an alias"),
        ({"hardware.dram.capacity_gb": [1]}, "axis 'hardware.dram.capacity_gb': unknown field 'capacity_gb'"),
        ({"workload.training.micro": [1]}, "unknown field 'micro' under training"),
        (
            {"hardware.dram.capacity_gib": ["lots"]},
            "axis 'hardware.dram.capacity_gib' = 'lots': "
            "hardware.dram.capacity_gib: Input should be a valid number",
        ),
        (
            {"nvme_drives": [1.5]},
            "axis 'nvme_drives' = 1.5: hardware.nvme.drives: Input should be a valid integer",
        ),
        ({"dram_gib": ["x"]}, "axis 'dram_gib': expected a number"),
        ({"pcie_gen": [4.0]}, "axis 'pcie_gen': expected an integer"),
        ({"hardware.gpu.memory_gib": [-1]}, "greater than 0"),
        ({"strategy.placement.params": ["disk"]}, "Input should be 'gpu', 'cpu' or 'nvme'"),
        ({"gpu": ["no-such-profile"]}, "unknown hardware 'no-such-profile'"),
        ({"dram_gib": [1], "hardware.dram.capacity_gib": [2]}, "both set hardware.dram.capacity_gib"),
        ({"hardware.name": ["x"]}, "use the 'hardware' axis"),
    ],
)
def test_bad_axes_are_refused_at_load_time(tmp_path, grid, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_spec(write_spec(tmp_path, grid))


def test_more_than_a_million_points_needs_yes(tmp_path):
    grid = {
        "dram_gib": {"start": 1, "stop": 1001, "step": 1},
        "hardware.cpu.cores": {"start": 1, "stop": 1000, "step": 1},
    }
    with pytest.raises(ConfigError, match=r"1,001,000 points, more than 1,000,000; pass --yes"):
        load_spec(write_spec(tmp_path, grid))
    assert count_points({"a": [1] * 1000, "b": [1] * 1000}, []) == MAX_POINTS


def test_spec_format_errors_name_the_field(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("name: t\nbase: {hardware: tiny, workload: tiny}\ngrids: {}\n")
    with pytest.raises(ConfigError) as info:
        load_spec(path)
    assert "base.strategy: required field is missing" in str(info.value)
    assert "grids: unknown field" in str(info.value)


def test_combination_errors_are_left_to_the_point(tmp_path):
    # zero-offload is ZeRO-2: streaming params from the CPU needs stage 3, which only the
    # combination with the other axis value gives; the spec loads and the point fails later
    plan = load_spec(
        write_spec(tmp_path, {"strategy.placement.params": ["cpu"], "strategy.zero_stage": [2, 3]})
    )
    assert len(plan.points) == 2


def _sections(plan, overrides):
    return apply_overrides(plan.base, overrides, plan.library)


def test_pcie_gen_scales_both_directions_relative_to_the_profile():
    plan = make_plan("tiny", "tiny", "zero-offload", grid={"pcie_gen": [3, 5]})
    base_link = plan.base["hardware"]["host_link"]
    assert base_link["generation"] == 4
    for gen, factor in ((3, 0.5), (5, 2.0)):
        link = _sections(plan, {"pcie_gen": gen})["hardware"]["host_link"]
        assert link["generation"] == gen
        for d in ("h2d", "d2h"):
            for mem in ("pinned", "pageable"):
                assert link[d][mem]["bandwidth_gb_per_s"] == base_link[d][mem]["bandwidth_gb_per_s"] * factor
    assert base_link["generation"] == 4  # the base is not modified


def test_aliases_that_scale_related_fields():
    plan = make_plan(
        "tiny",
        "tiny",
        "zero-offload",
        grid={"dram_gib": [32], "cpu_cores": [8]},
        fixed={"hardware.dram.power_w": 20},
    )
    hw = _sections(plan, {"dram_gib": 32, "cpu_cores": 8})["hardware"]
    assert hw["dram"]["capacity_gib"] == 32
    assert hw["dram"]["power_w"] == pytest.approx(10.0)  # 20 W for 64 GiB -> 10 W for 32 GiB
    assert hw["cpu"]["cores"] == 8
    assert hw["cpu"]["optimizer_params_per_s"] == pytest.approx(2e9)  # 1e9 at 4 cores


def test_cpu_cores_on_a_profile_whose_optimizer_rate_is_derived():
    """A profile without a measured rate gets it derived from its CPU again (no KeyError)."""
    plan = make_plan("a100-80gb-pcie4", "tiny", "zero-offload", grid={"cpu_cores": [1, 64]})
    one = HardwareProfile.model_validate(_sections(plan, {"cpu_cores": 1})["hardware"])
    many = HardwareProfile.model_validate(_sections(plan, {"cpu_cores": 64})["hardware"])
    assert one.cpu.cores == 1 and many.cpu.cores == 64
    assert one.cpu.optimizer_params_per_s < many.cpu.optimizer_params_per_s  # one thread streams less


def test_block_swaps_and_whole_swaps():
    plan = make_plan(
        "tiny",
        "tiny",
        "zero-offload",
        grid={
            "gpu": ["rtx4090-pcie4-ws"],
            "nvme_model": ["rtx4090-pcie4-ws"],
            "nvme_drives": [3],
            "hardware.gpu.price_usd": [1500],
        },
    )
    ov = {
        "gpu": "rtx4090-pcie4-ws",
        "nvme_model": "rtx4090-pcie4-ws",
        "nvme_drives": 3,
        "hardware.gpu.price_usd": 1500,
    }
    cfg = build_run_config(_sections(plan, ov), ov)
    assert cfg.hardware.name == "tiny"
    assert cfg.hardware.gpu.model == "NVIDIA GeForce RTX 4090"
    assert cfg.hardware.gpu.price_usd == 1500  # field values apply after block swaps
    assert cfg.hardware.nvme.model.startswith("Samsung 990 PRO")
    assert cfg.hardware.nvme.drives == 3
    keep = {"nvme_model": "rtx4090-pcie4-ws"}
    assert build_run_config(_sections(plan, keep), keep).hardware.nvme.drives == 1  # tiny's count kept
    plan = make_plan("tiny", "tiny", "zero-offload", grid={"workload": ["llama2-7b"], "micro_batch": [2]})
    ov = {"workload": "llama2-7b", "micro_batch": 2}
    cfg = build_run_config(_sections(plan, ov), ov)
    assert (cfg.workload.name, cfg.workload.training.micro_batch) == ("llama2-7b", 2)


def test_set_block_is_baked_into_the_base(tmp_path):
    plan = load_spec(TINY_GRID)
    assert plan.base["hardware"]["gpu"]["price_usd"] == 1000
    with pytest.raises(ConfigError, match=r"set: axis 'hardware\.gpu\.price_usd' = -1"):
        load_spec(write_spec(tmp_path, {"dram_gib": [8]}, set={"hardware.gpu.price_usd": -1}))


def test_point_errors_name_the_axis():
    plan = make_plan("tiny", "tiny", "zero-offload", grid={"hardware.gpu.reserved_gib": [20.0]})
    ov = {"hardware.gpu.reserved_gib": 20.0}
    with pytest.raises(
        ValueError,
        match=r"axis 'hardware.gpu.reserved_gib' = 20.0: hardware.gpu: "
        r"reserved_gib must be below memory_gib",
    ):
        build_run_config(_sections(plan, ov), ov)


def test_resolve_axis_kinds():
    assert resolve_axis("nvme_drives").writes == ("hardware", "nvme", "drives")
    assert resolve_axis("strategy").kind == "swap"
    assert resolve_axis("hardware.gpu.peak_tflops.bf16").path == ("gpu", "peak_tflops", "bf16")
    assert resolve_axis("run.iterations").section == "run"
    lib = Library({"hardware": {}, "workload": {}, "strategy": {}})
    with pytest.raises(ValueError, match="was not resolved"):
        lib.get("hardware", "x", "gpu")


def test_policy_aliases_take_a_kind_or_a_mapping(tmp_path):
    plan = make_plan(
        "tiny",
        "tiny",
        "zero-infinity-nvme",
        grid={"policy": ["lru", {"kind": "belady"}], "dram_cache_gib": [0.5]},
    )
    for p, kind in zip(plan.points, ["lru", "belady"], strict=True):
        cfg = build_run_config(_sections(plan, p.overrides), p.overrides)
        assert cfg.strategy.policies.eviction.kind == kind
        assert cfg.strategy.policies.dram_cache_gib == 0.5
    with pytest.raises(ConfigError, match=r"axis 'policy' = 'nosuch': strategy\.policies\.eviction"):
        load_spec(write_spec(tmp_path, {"policy": ["nosuch"]}))
