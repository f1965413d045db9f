"""Hugging Face Accelerate config files (``accelerate config`` YAML) as offsim strategies.

The DeepSpeed plugin (``distributed_type: DEEPSPEED``) becomes the ds_config Accelerate builds
from it (or the ``deepspeed_config_file`` it names), read by :mod:`offsim.config.ds_config`.
FSDP (``distributed_type: FSDP``) maps onto the closest ZeRO knobs: sharded parameters are ZeRO-3;
with ``fsdp_offload_params`` it is the ``fsdp2-cpu-offload`` system (PyTorch's ``CPUOffloadPolicy``:
fp32 parameter shards, gradients and the optimizer step on the CPU,
:mod:`offsim.systems.fsdp2_cpu_offload`), for FSDP2 and for FSDP1's ``CPUOffload``, whose data
movement is the same to first order; what each mapping approximates is listed. Plain DDP (``NO``,
``MULTI_GPU``) keeps everything on the GPU. Keys, defaults and behaviour are those read in
accelerate ``16cb6eb80d`` and PyTorch ``torch/distributed/fsdp/_fully_shard/``
(``../shared/reference/config_formats.md`` §3-4); a key missing from the YAML takes the
``accelerate launch`` default, not the plugin dataclass's (``commands/launch.py``).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from offsim.config.ds_config import reading_from_ds_config, resolve_precision
from offsim.config.reading import Reading, Setting, build_strategy, unknown_key_error
from offsim.config.workload import Workload
from offsim.errors import ConfigError

LAUNCH = "accelerate/commands/launch.py"
PLUGIN = "accelerate/utils/dataclasses.py"

#: Top-level keys of an Accelerate config, with why offsim ignores each it does not map.
TOP_LEVEL = {
    "distributed_type": "", "mixed_precision": "", "deepspeed_config": "", "fsdp_config": "",
    "compute_environment": "where it runs", "num_machines": "the hardware profile sets the machines",
    "num_processes": "the workload's training.data_parallel sets the ranks",
    "machine_rank": "launcher only", "main_process_ip": "launcher only", "main_process_port": "launcher only",
    "main_training_function": "launcher only", "rdzv_backend": "launcher only", "same_network": "launcher only",
    "use_cpu": "launcher only", "gpu_ids": "launcher only", "enable_cpu_affinity": "launcher only",
    "debug": "launcher only", "downcast_bf16": "TPU only", "tpu_name": "TPU only", "tpu_zone": "TPU only",
    "tpu_use_cluster": "TPU only", "tpu_use_sudo": "TPU only", "commands": "TPU only", "command_file": "TPU only",
    "dynamo_config": "torch.compile: not modelled", "dynamo_backend": "torch.compile: not modelled",
    "tpu_env": "TPU only", "fp8_config": "fp8 recipes: not modelled",
    "megatron_lm_config": "not read (give Megatron-Core options as their own file)",
    "ipex_config": "CPU training: not modelled", "mpirun_config": "launcher only",
    "parallelism_config": "not modelled (context/tensor parallel sizes come from the workload)",
}

#: DeepSpeed plugin keys: the ds_config key each fills (empty: not a ds_config key) or why ignored.
DS_PLUGIN = {
    "zero_stage": "zero_optimization.stage",
    "offload_optimizer_device": "zero_optimization.offload_optimizer.device",
    "offload_param_device": "zero_optimization.offload_param.device",
    "offload_optimizer_nvme_path": "zero_optimization.offload_optimizer.nvme_path",
    "offload_param_nvme_path": "zero_optimization.offload_param.nvme_path",
    "gradient_accumulation_steps": "gradient_accumulation_steps",
    "gradient_clipping": "gradient_clipping",
    "zero3_save_16bit_model": "zero_optimization.stage3_gather_16bit_weights_on_model_save",
    "deepspeed_config_file": "",
}
DS_PLUGIN_IGNORED = {
    "zero3_init_flag": "deepspeed.zero.Init at model construction: start-up only",
    "deepspeed_moe_layer_cls_names": "not modelled: offsim gathers per layer",
    "deepspeed_multinode_launcher": "launcher only", "deepspeed_hostfile": "launcher only",
    "deepspeed_inclusion_filter": "launcher only", "deepspeed_exclusion_filter": "launcher only",
}

#: FSDP keys (``fsdp_`` prefix added when missing, as Accelerate does) and why offsim ignores each
#: it does not map.
FSDP_KEYS = {
    "fsdp_version": "", "fsdp_offload_params": "", "fsdp_reshard_after_forward": "",
    "fsdp_sharding_strategy": "", "fsdp_activation_checkpointing": "", "fsdp_auto_wrap_policy": "",
    "fsdp_cpu_ram_efficient_loading": "start-up only (rank 0 loads the weights); offsim simulates training steps",
    "fsdp_state_dict_type": "checkpoint saving: not modelled",
    "fsdp_transformer_layer_cls_to_wrap": "offsim wraps per transformer block",
    "fsdp_min_num_params": "size-based wrapping: offsim wraps per transformer block",
    "fsdp_backward_prefetch": "FSDP1 prefetch choice: offsim prefetches one block ahead",
    "fsdp_forward_prefetch": "FSDP1 prefetch choice: offsim prefetches one block ahead",
    "fsdp_use_orig_params": "no effect on time or memory as offsim models them",
    "fsdp_sync_module_states": "start-up only", "fsdp_ignored_modules": "not modelled",
    "fsdp_activation_checkpointing_reentrant": "no effect on time or memory as offsim models them",
}


def json_file(path: Path) -> Any:
    """A JSON file's content (errors as :class:`ConfigError`)."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path}: not a readable JSON file ({exc})") from None


def is_accelerate_config(data: Any) -> bool:
    """True when ``data`` looks like an ``accelerate config`` file."""
    return isinstance(data, dict) and "schema_version" not in data and any(
        k in data for k in ("distributed_type", "deepspeed_config", "fsdp_config"))


def _check_keys(section: dict[str, Any], known: dict[str, str], where: str, source: str) -> None:
    """Refuse an unknown key, naming the nearest known one."""
    for key in section:
        if key not in known:
            raise unknown_key_error(source, f"{where}{key}", [f"{where}{k}" for k in known], "Accelerate")


def _ignored(section: dict[str, Any], reasons: dict[str, str], where: str) -> list[str]:
    return [f"{where}{k}: {reasons[k]}" for k in section if reasons.get(k)]


def reading_from_accelerate(data: dict[str, Any], path: Path, workload: Workload | None = None,
                            read_file: Callable[[Path], Any] = json_file) -> Reading:
    """An Accelerate config as offsim understands it (see the module docstring); ``read_file``
    parses a ``deepspeed_config_file`` (the loader passes its safe YAML/JSON reader)."""
    source = str(path)
    _check_keys(data, TOP_LEVEL, "", source)
    kind = str(data.get("distributed_type", "DEEPSPEED" if "deepspeed_config" in data else "FSDP"))
    top = _ignored(data, TOP_LEVEL, "")
    if kind == "DEEPSPEED":
        reading = _deepspeed(data, path, workload, read_file)
    elif kind == "FSDP":
        reading = _fsdp(data, source)
    elif kind in ("NO", "MULTI_GPU"):
        reading = _ddp(data, source)
    else:
        raise ConfigError(f"{source}: distributed_type {kind}: offsim simulates DEEPSPEED, FSDP, MULTI_GPU "
                          "or NO (single GPU); this one is not expressible")
    return dataclasses.replace(reading, fmt="accelerate", ignored=tuple(top) + reading.ignored)


def _mixed_precision(data: dict[str, Any], source: str) -> dict[str, Any]:
    """The ds_config precision sections Accelerate fills from ``mixed_precision`` (launch default
    ``no``: fp32)."""
    mp = data.get("mixed_precision", "no")
    if mp not in ("no", "fp16", "bf16", "fp8"):
        raise ConfigError(f"{source}: mixed_precision: expected no, fp16, bf16 or fp8, got {mp!r}")
    if mp == "fp16":
        return {"fp16": {"enabled": True, "auto_cast": True}}
    return {"bf16": {"enabled": True}} if mp in ("bf16", "fp8") else {}


def _deepspeed(data: dict[str, Any], path: Path, workload: Workload | None,
               read_file: Callable[[Path], Any]) -> Reading:
    """The DeepSpeed plugin: its own keys, or the ds_config file it names."""
    source = str(path)
    plugin = data.get("deepspeed_config") or {}
    if not isinstance(plugin, dict):
        raise ConfigError(f"{source}: deepspeed_config: expected a mapping of keys, got {plugin!r}")
    _check_keys(plugin, {**DS_PLUGIN, **DS_PLUGIN_IGNORED}, "deepspeed_config.", source)
    ignored = _ignored(plugin, DS_PLUGIN_IGNORED, "deepspeed_config.")
    if "deepspeed_config_file" in plugin:
        ds, where = _ds_file(plugin, path, read_file)
    else:
        ds, where = _plugin_ds_config(plugin, data, source), source
    if data.get("mixed_precision") == "fp8":
        ignored.append("mixed_precision fp8: simulated as bf16 (Accelerate sets bf16.enabled; fp8 GEMMs "
                       "are not modelled)")
    reading = reading_from_ds_config(ds, where, workload, fmt="accelerate")
    return dataclasses.replace(reading, source=source, ignored=tuple(ignored) + reading.ignored)


def _plugin_ds_config(plugin: dict[str, Any], data: dict[str, Any], source: str) -> dict[str, Any]:
    """The ds_config Accelerate builds without a file: batch keys ``auto``, stage 2 by default."""
    ds: dict[str, Any] = {"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto",
                          "gradient_accumulation_steps": "auto", "gradient_clipping": "auto",
                          "zero_optimization": {"stage": 2}, **_mixed_precision(data, source)}
    for key, ds_key in DS_PLUGIN.items():
        if key in plugin and ds_key:
            node = ds
            *parents, leaf = ds_key.split(".")
            for p in parents:
                node = node.setdefault(p, {})
            node[leaf] = plugin[key]
    return ds


def _ds_file(plugin: dict[str, Any], path: Path, read_file: Callable[[Path], Any]) -> tuple[dict[str, Any], str]:
    """The ds_config named by ``deepspeed_config_file`` (relative to the Accelerate file's folder,
    else to the working folder); the plugin keys it owns must not be set beside it."""
    clash = [k for k in plugin if k in DS_PLUGIN and k != "deepspeed_config_file"]
    if clash:
        raise ConfigError(f"{path}: deepspeed_config.{clash[0]} is set beside deepspeed_config_file; "
                          "Accelerate refuses that (the file owns it)")
    name = Path(str(plugin["deepspeed_config_file"]))
    file = path.parent / name if (path.parent / name).exists() else name
    if not file.exists():
        raise ConfigError(f"{path}: deepspeed_config.deepspeed_config_file {name}: no such file")
    ds = read_file(file)
    if not isinstance(ds, dict) or "zero_optimization" not in ds:
        raise ConfigError(f"{file}: no zero_optimization section; Accelerate refuses such a DeepSpeed config")
    ds.setdefault("gradient_accumulation_steps", 1)  # Accelerate's fill when the file has none
    return ds, str(file)


def _ddp(data: dict[str, Any], source: str) -> Reading:
    """Plain data parallelism: every state on the GPU."""
    strategy = build_strategy({}, source, "Accelerate data-parallel (no ZeRO)", "")
    return Reading(source=source, fmt="accelerate", strategy=strategy,
                   precision=_precision(data, source))


def _precision(data: dict[str, Any], source: str) -> dict[str, str]:
    """Workload precision fields from ``mixed_precision`` (via the ds_config rule)."""
    sections = _mixed_precision(data, source)
    on = {k: Setting(f"{k}.enabled", bool(sections.get(k, {}).get("enabled")), "file") for k in ("fp16", "bf16")}
    return resolve_precision({f"{k}.enabled": s for k, s in on.items()}, source)


def _fsdp(data: dict[str, Any], source: str) -> Reading:
    """FSDP1/FSDP2 onto ZeRO knobs (see :func:`fsdp_fields`)."""
    raw = data.get("fsdp_config") or {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: fsdp_config: expected a mapping of keys, got {raw!r}")
    cfg = {k if k.startswith("fsdp_") else f"fsdp_{k}": v for k, v in raw.items()}
    _check_keys(cfg, FSDP_KEYS, "fsdp_config.", source)
    fields, settings, approx = fsdp_fields(cfg, source)
    strategy = build_strategy(fields, source, f"Accelerate FSDP{settings[0].value}", "; ".join(approx))
    return Reading(source=source, fmt="accelerate", strategy=strategy, settings=tuple(settings),
                   ignored=tuple(_ignored(cfg, FSDP_KEYS, "fsdp_config.")), approximations=tuple(approx),
                   precision=_precision(data, source))


_SHARDING_STAGE = {"FULL_SHARD": 3, "SHARD_GRAD_OP": 2, "NO_SHARD": 0, "HYBRID_SHARD": 3, "HYBRID_SHARD_ZERO2": 2}
_FSDP_DEFAULTS = {"fsdp_version": 1, "fsdp_offload_params": False, "fsdp_reshard_after_forward": True,
                  "fsdp_sharding_strategy": "FULL_SHARD", "fsdp_activation_checkpointing": False,
                  "fsdp_auto_wrap_policy": "NO_WRAP"}

#: The system an FSDP config with ``fsdp_offload_params`` runs on.
FSDP_OFFLOAD_SYSTEM = "fsdp2-cpu-offload"

#: What offsim approximates when FSDP offloads parameters (PyTorch ``CPUOffloadPolicy``, system
#: :data:`FSDP_OFFLOAD_SYSTEM`).
FSDP_OFFLOAD_APPROXIMATIONS = (
    "fsdp_offload_params: each fp32 parameter shard is copied up, cast and all-gathered per offsim layer (a "
    "transformer block, the embedding, the head); FSDP does it per unit the auto-wrap policy makes and keeps "
    "the root module (embedding, final norm, head) gathered after forward",
    "fsdp_offload_params: the optimizer is torch AdamW on the CPU, the per-tensor loop torch picks for CPU "
    "tensors (the Accelerate file does not name the optimizer; system_options optimizer: fused for "
    "fused=True), with clip_grad_norm_ (the Trainer's max_grad_norm 1.0); its rate is derived from the DRAM "
    "bytes of torch/optim/adam.py, not measured (strategies/fsdp2-cpu-offload.yaml)",
)

#: What FSDP1's offload adds to :data:`FSDP_OFFLOAD_APPROXIMATIONS`.
FSDP1_OFFLOAD_APPROXIMATION = (
    "fsdp_version 1: FSDP1's CPUOffload(offload_params=True) is simulated as FSDP2's CPUOffloadPolicy: the same "
    "data movement to first order (the fp32 shard up, cast on the GPU, all-gather; reduce-scatter, the fp32 "
    "gradient down into pinned memory, the optimizer on the CPU after backward; config_formats.md section 4); "
    "not modelled: its flat parameters (one tensor per unit), the low-precision shard it keeps on the GPU under "
    "mixed precision, fsdp_backward_prefetch / fsdp_forward_prefetch, and its gradient copy into a pre-allocated "
    "pinned buffer, never blocking (FSDP2's blocks, then adds on the CPU, from the second accumulated "
    "micro-batch)")


def _fsdp_settings(cfg: dict[str, Any]) -> list[Setting]:
    """The FSDP keys offsim maps, each from the file or the ``accelerate launch`` default."""
    return [Setting(k, cfg[k], "file") if k in cfg else Setting(k, d, "default", LAUNCH)
            for k, d in _FSDP_DEFAULTS.items()]


def _fsdp_stage(v: dict[str, Any], source: str, approx: list[str]) -> int:
    """The ZeRO stage FSDP's sharding amounts to."""
    if int(v["fsdp_version"]) >= 2:
        reshard = v["fsdp_reshard_after_forward"]
        reshard = {"true": True, "false": False}.get(str(reshard).lower(), reshard)
        if not isinstance(reshard, bool):
            approx.append(f"fsdp_reshard_after_forward {reshard!r} (reshard to a smaller mesh) is simulated as true")
            reshard = True
        return 3 if reshard else 2
    strategy = str(v["fsdp_sharding_strategy"]).upper()
    if strategy not in _SHARDING_STAGE:
        raise ConfigError(f"{source}: fsdp_config.fsdp_sharding_strategy: expected one of "
                          f"{', '.join(_SHARDING_STAGE)}, got {strategy!r}")
    if strategy.startswith("HYBRID"):
        approx.append(f"fsdp_sharding_strategy {strategy}: the intra-node shard and inter-node replication are "
                      "simulated as sharding over every data-parallel rank")
    return _SHARDING_STAGE[strategy]


def fsdp_fields(cfg: dict[str, Any], source: str) -> tuple[dict[str, Any], list[Setting], list[str]]:
    """Strategy fields for an FSDP config, the settings read, and the approximations.

    Sharded parameters (``FULL_SHARD`` / ``reshard_after_forward: true``) are ZeRO-3 with a
    one-block prefetch (FSDP all-gathers the next group while one computes); ``SHARD_GRAD_OP`` /
    ``false`` is ZeRO-2. With ``fsdp_offload_params`` it is the ``fsdp2-cpu-offload`` system
    (:func:`fsdp_offload_fields`; ``_fsdp_api.py`` ``CPUOffloadPolicy``), FSDP1's offload included.
    """
    settings = _fsdp_settings(cfg)
    v = {s.key: s.value for s in settings}
    approx: list[str] = []
    stage = _fsdp_stage(v, source, approx)
    if v["fsdp_offload_params"]:
        fields = fsdp_offload_fields(stage)
        approx += FSDP_OFFLOAD_APPROXIMATIONS
        if int(v["fsdp_version"]) < 2:
            approx.append(FSDP1_OFFLOAD_APPROXIMATION)
    else:
        fields = {"zero_stage": stage, "reuse_distance_params": 0.0, "sub_group_params": 1e12}
    fields["prefetch_depth"] = 1 if fields["zero_stage"] == 3 else 0
    if fields["zero_stage"] == 3 and str(v["fsdp_auto_wrap_policy"]).upper() == "NO_WRAP":
        approx.append("fsdp_auto_wrap_policy NO_WRAP: the whole decoder stack is one FSDP group, gathered at "
                      "once; offsim gathers one block at a time")
    if v["fsdp_activation_checkpointing"]:
        fields["activation_checkpointing"] = True
    return fields, settings, approx


def fsdp_offload_fields(stage: int) -> dict[str, Any]:
    """Strategy fields of FSDP with ``fsdp_offload_params`` (FSDP2: ``CPUOffloadPolicy()``, pinned,
    Accelerate has no key to unpin it; FSDP1: always pinned; config_formats.md sections 3-4):
    system :data:`FSDP_OFFLOAD_SYSTEM`, parameters, gradients and optimizer state in host memory.
    ``stage`` 3 (``reshard_after_forward: true`` / ``FULL_SHARD``) frees each unit after forward
    (reuse distance 0); 2 (``false`` / ``SHARD_GRAD_OP``) keeps it gathered until backward (a
    reuse distance above any model's parameters). The system's own options keep their defaults
    (the torch AdamW loop, clipping on)."""
    return {"system": FSDP_OFFLOAD_SYSTEM, "zero_stage": 3, "optimizer_device": "cpu", "pin_memory": True,
            "reuse_distance_params": 0.0 if stage == 3 else KEEP_GATHERED_PARAMS,
            "placement": {"params": "cpu", "grads": "cpu", "optimizer_states": "cpu", "activations": "gpu"}}


#: A reuse distance (parameters) above any model's: a unit gathered in forward stays until backward.
KEEP_GATHERED_PARAMS = 1e15
