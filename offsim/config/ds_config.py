"""DeepSpeed ``ds_config.json`` as an offsim strategy, and a shipped strategy as a ds_config.

Three pure steps: :func:`parse_ds_config` checks every key against DeepSpeed's own (an unknown
key is an error naming the nearest known one) and flattens the file to dotted keys;
:func:`resolve_ds_config` gives every key offsim models a value and an origin (the file,
DeepSpeed's default with the file it comes from, or ``"auto"`` resolved as the Hugging Face
integration resolves it) and derives the batch; :func:`reading_from_ds_config` maps the result
onto :class:`~offsim.config.strategy.Strategy` knobs. :func:`ds_config_from_strategy` goes the
other way. Defaults and their files are those of DeepSpeed ``edaa722126`` (v0.19.5 + 27
commits), as read in ``../shared/reference/config_formats.md`` §1 and ``deepspeed_runtime.md``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from offsim.config.reading import Reading, Setting, build_strategy, unknown_key_error
from offsim.config.strategy import Strategy
from offsim.config.workload import Workload
from offsim.errors import ConfigError
from offsim.units import MiB

CFG = "deepspeed/runtime/config.py"
CONST = "deepspeed/runtime/constants.py"
ZERO = "deepspeed/runtime/zero/config.py"
OFFLOAD = "deepspeed/runtime/zero/offload_config.py"
PREC = "deepspeed/runtime/precision_config.py"
AIO = "deepspeed/runtime/swap_tensor/aio_config.py"
ACT = "deepspeed/runtime/activation_checkpointing/config.py"

#: Bytes of one element of DeepSpeed's parameter swap buffer (16-bit parameters).
SWAP_ELEMENT_BYTES = 2


@dataclass(frozen=True)
class Key:
    """One DeepSpeed key.

    Attributes:
        default: DeepSpeed's default (``None``: absent).
        source: the DeepSpeed file that defines it.
        ignored: why offsim does not model it; empty when it maps onto a strategy knob.
        opaque: a section offsim takes whole, without checking the keys inside.
    """

    default: Any
    source: str
    ignored: str = ""
    opaque: bool = False


def _ignored(source: str, reason: str, *names: str, default: Any = None) -> dict[str, Key]:
    return {n: Key(default, source, reason) for n in names}


_Z = "zero_optimization."
_OO = "zero_optimization.offload_optimizer."
_OP = "zero_optimization.offload_param."

#: Keys offsim maps onto strategy knobs or onto the workload's batch and precision.
MAPPED: dict[str, Key] = {
    "train_batch_size": Key(None, CFG), "train_micro_batch_size_per_gpu": Key(None, CFG),
    "gradient_accumulation_steps": Key(None, CFG), "gradient_clipping": Key(1.0, CONST),
    "fp16.enabled": Key(False, PREC), "bf16.enabled": Key(False, PREC),
    _Z + "stage": Key(0, ZERO), _Z + "sub_group_size": Key(1e9, ZERO),
    _Z + "reduce_bucket_size": Key(5e8, ZERO), _Z + "stage3_prefetch_bucket_size": Key(5e7, ZERO),
    _Z + "stage3_max_reuse_distance": Key(1e9, ZERO), _Z + "overlap_comm": Key(None, ZERO),
    _Z + "stage3_max_live_parameters": Key(1e9, ZERO), _Z + "reduce_scatter": Key(True, ZERO),
    _OO + "device": Key("none", OFFLOAD), _OO + "pin_memory": Key(True, OFFLOAD),
    _OO + "buffer_count": Key(4, OFFLOAD), _OO + "pipeline_read": Key(False, OFFLOAD),
    _OO + "pipeline_write": Key(False, OFFLOAD), _OO + "ratio": Key(1.0, OFFLOAD),
    _OO + "super_offload": Key(False, OFFLOAD),
    _OP + "device": Key("none", OFFLOAD), _OP + "pin_memory": Key(True, OFFLOAD),
    _OP + "buffer_count": Key(5, OFFLOAD), _OP + "buffer_size": Key(1e8, OFFLOAD),
    _OP + "max_in_cpu": Key(1e9, OFFLOAD),
    "activation_checkpointing.cpu_checkpointing": Key(False, ACT),
}

_SECTIONS = {"zero_optimization": ZERO, "zero_optimization.offload_optimizer": OFFLOAD,
             "zero_optimization.offload_param": OFFLOAD, "fp16": PREC, "bf16": PREC, "aio": AIO,
             "activation_checkpointing": ACT}

_NOT_TIME = "no effect on iteration time or memory as offsim models them"
_SINGLE = "offsim simulates one rank's schedule; this tunes collectives it does not model"
#: Keys offsim reads and ignores, each with the reason given in the warning.
IGNORED: dict[str, Key] = {
    **_ignored(CFG, "monitoring, logging or checkpoint I/O: " + _NOT_TIME, "steps_per_print",
               "wall_clock_breakdown", "dump_state", "memory_breakdown", "load_universal_checkpoint",
               "use_node_local_storage", "dataloader_drop_last"),
    **_ignored(CFG, "gradient pre/post scaling and sparse gradients: " + _NOT_TIME, "prescale_gradients",
               "gradient_predivide_factor", "sparse_gradients", "communication_data_type",
               "seq_parallel_communication_data_type", "disable_allgather", "graph_harvesting"),
    **_ignored(CFG, "optimizer choice checks; the workload's optimizer decides what offsim updates",
               "zero_allow_untested_optimizer", "zero_force_ds_cpu_optimizer"),
    **_ignored(_SECTIONS["zero_optimization"], _SINGLE, *(_Z + k for k in (
        "contiguous_gradients", "allgather_partitions", "allgather_bucket_size",
        "round_robin_gradients", "use_multi_rank_bucket_allreduce", "stage3_use_all_reduce_for_fetch_params",
        "stage3_allgather_sequential", "stage3_module_granularity_threshold"))),
    **_ignored(ZERO, "not modelled: offsim partitions every parameter (no small-parameter persistence)",
               _Z + "stage3_param_persistence_threshold", _Z + "stage3_model_persistence_threshold"),
    **_ignored(ZERO, "not expressible in offsim: ZeRO++ / MiCS / quantized weights change the collectives",
               *(_Z + k for k in ("zero_hpz_partition_size", "zero_quantized_weights",
                                  "zero_quantized_nontrainable_weights", "zero_quantized_gradients",
                                  "mics_shard_size", "mics_hierarchical_params_gather"))),
    **_ignored(ZERO, "checkpoint, initialisation or debugging: " + _NOT_TIME, *(_Z + k for k in (
        "stage3_gather_16bit_weights_on_model_save", "ignore_unused_parameters", "load_from_fp32_weights",
        "elastic_checkpoint", "override_module_apply", "log_trace_cache_warnings", "enable_sanity_checks",
        "save_muon_momentum_buffer_in_memory", "memory_efficient_linear"))),
    _Z + "cpu_offload_use_pin_memory": Key(None, ZERO, "deprecated; DeepSpeed itself ignores it (use "
                                            "offload_*.pin_memory)"),
    **_ignored(OFFLOAD, "the NVMe comes from the hardware profile", _OO + "nvme_path", _OP + "nvme_path"),
    **_ignored(OFFLOAD, "start-up only (NVMe optimizer initialisation): " + _NOT_TIME, _OO + "fast_init"),
    **_ignored(OFFLOAD, "CPU Adam's rate comes from the hardware profile", _OO + "cpuadam_cores_perc"),
    **_ignored(PREC, "loss scaling: " + _NOT_TIME, *("fp16." + k for k in (
        "loss_scale", "initial_scale_power", "loss_scale_window", "hysteresis", "consecutive_hysteresis",
        "min_loss_scale"))),
    "fp16.auto_cast": Key(False, PREC, "autocast of the model's inputs: the workload's compute format decides"),
    **_ignored(PREC, "not modelled: offsim keeps fp32 master weights and moments (the workload's precision)",
               "fp16.fp16_master_weights_and_grads", "bf16.bf16_master_weights_and_grads",
               "bf16.bf16_optimizer_states", "bf16.immediate_grad_update"),
    "bf16.check_grad_overflow": Key(True, PREC, "not modelled: offsim runs DeepSpeed's overflow check for "
                                    "fp16 only (overflow_check), as stage3.py did before v0.19.3"),
    **_ignored(AIO, "offsim takes NVMe throughput from the hardware profile (its measured curves)",
               *("aio." + k for k in ("block_size", "queue_depth", "intra_op_parallelism", "single_submit",
                                      "overlap_events", "use_gds"))),
    "aio.thread_count": Key(None, AIO, "DeepSpeed itself ignores it since v0.16.4 (renamed "
                            "intra_op_parallelism, PR #7056)"),
    **_ignored(ACT, "not modelled: offsim simulates one GPU of the tensor-parallel group",
               "activation_checkpointing.partition_activations"),
    **_ignored(ACT, "buffer layout, synchronisation and profiling of deepspeed.checkpointing: " + _NOT_TIME,
               *("activation_checkpointing." + k for k in (
                   "contiguous_memory_optimization", "number_checkpoints", "synchronize_checkpoint_boundary",
                   "profile"))),
}

_OPAQUE_TOP = ("optimizer", "scheduler", "tensorboard", "wandb", "csv_monitor", "comet", "flops_profiler",
               "comms_logger", "checkpoint", "data_types", "elasticity", "autotuning", "compression_training",
               "data_efficiency", "curriculum_learning", "pipeline", "sparse_attention", "nebula", "eigenvalue",
               "progressive_layer_drop", "quantize_training", "hybrid_engine", "compile", "timers", "amp",
               "weight_quantization", "torch_autocast")
OPAQUE: dict[str, Key] = {
    **{k: Key(None, CFG, "not modelled by offsim (the workload's optimizer and precision decide; "
                         "monitoring, schedules and other features do not change the simulated step)",
              opaque=True) for k in _OPAQUE_TOP},
    _Z + "zenflow": Key(None, ZERO, "not expressible in offsim: ZenFlow's top-k GPU update is not "
                        "simulated", opaque=True),
    _Z + "zeropp_loco_param": Key(None, ZERO, "not expressible in offsim (LoCo-ZeRO++)", opaque=True),
    _Z + "leaf_module": Key(None, ZERO, "not modelled: offsim gathers per layer", opaque=True),
}

#: Field names DeepSpeed also accepts (pydantic ``populate_by_name``) and old names, by canonical key.
ALIASES = {
    _Z + "prefetch_bucket_size": _Z + "stage3_prefetch_bucket_size",
    _Z + "param_persistence_threshold": _Z + "stage3_param_persistence_threshold",
    _Z + "model_persistence_threshold": _Z + "stage3_model_persistence_threshold",
    _Z + "max_live_parameters": _Z + "stage3_max_live_parameters",
    _Z + "max_reuse_distance": _Z + "stage3_max_reuse_distance",
    _Z + "gather_16bit_weights_on_model_save": _Z + "stage3_gather_16bit_weights_on_model_save",
    _Z + "stage3_gather_fp16_weights_on_model_save": _Z + "stage3_gather_16bit_weights_on_model_save",
}
#: Deprecated booleans and what they stand for (zero/config.py): true sets the device to cpu.
DEPRECATED_OFFLOAD = {_Z + "cpu_offload": _OO + "device", _Z + "cpu_offload_param": _OP + "device"}

KNOWN: dict[str, Key] = {**MAPPED, **IGNORED, **OPAQUE}
#: Keys whose ``"auto"`` the Hugging Face integration fills from the model's hidden size h
#: (transformers integrations/deepspeed.py ``trainer_config_finalize``; Accelerate fills them at
#: any stage), with the rule shown to the user.
AUTO_FROM_HIDDEN = {
    _Z + "reduce_bucket_size": ("h x h", lambda h: h * h),
    _Z + "stage3_prefetch_bucket_size": ("int(0.9 x h x h)", lambda h: int(0.9 * h * h)),
}
_AUTO_BATCH = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")
_AUTO_OTHER = {"fp16.enabled": "the workload's precision", "bf16.enabled": "the workload's precision",
               "gradient_clipping": "1.0 (TrainingArguments.max_grad_norm's default)"}

#: The markers of a ds_config: any of these at the top level (and no offsim ``schema_version``).
MARKERS = ("zero_optimization", "train_micro_batch_size_per_gpu", "train_batch_size",
           "gradient_accumulation_steps", "fp16", "bf16", "aio", "zero_allow_untested_optimizer")


def is_ds_config(data: Any) -> bool:
    """True when ``data`` looks like a DeepSpeed config rather than an offsim strategy file."""
    return isinstance(data, dict) and "schema_version" not in data and any(k in data for k in MARKERS)


def _section_keys(prefix: str) -> list[str]:
    """The known keys (and sub-sections) directly under ``prefix``."""
    names = [*KNOWN, *_SECTIONS, *ALIASES, *DEPRECATED_OFFLOAD]
    return [k for k in names if k.startswith(prefix) and "." not in k[len(prefix):]]


def _strictness(prefix: str) -> str:
    """How DeepSpeed itself treats an unknown key in this section (config_formats.md §1.1)."""
    if prefix.startswith(("zero_optimization", "fp16", "bf16")):
        return "DeepSpeed refuses it too"
    return "DeepSpeed would ignore it silently"


def parse_ds_config(data: dict[str, Any], source: str) -> dict[str, Any]:
    """Flatten a ds_config to ``{dotted key: value}`` with canonical names.

    Aliases become their ``stage3_`` names, ``bfloat16`` becomes ``bf16``, the deprecated
    ``cpu_offload``/``cpu_offload_param`` booleans become offload devices, and the boolean form
    ``"zero_optimization": true`` is stage 1 (zero/config.py ``read_zero_config_deprecated``).
    An unknown key, a key given under two names, or a value of the wrong kind is an error.
    """
    data = dict(data)
    if "bfloat16" in data:
        if "bf16" in data:
            raise ConfigError(f"{source}: both 'bf16' and its old name 'bfloat16' are given")
        data["bf16"] = data.pop("bfloat16")
    if isinstance(data.get("zero_optimization"), bool):
        data["zero_optimization"] = {"stage": 1 if data["zero_optimization"] else 0}
    flat: dict[str, Any] = {}
    _flatten(data, "", source, flat)
    for key, value in flat.items():
        _check_value(key, value, source)
    return flat


def _flatten(node: dict[str, Any], prefix: str, source: str, out: dict[str, Any]) -> None:
    """Walk one section; see :func:`parse_ds_config`."""
    for raw, value in node.items():
        key = ALIASES.get(prefix + str(raw), prefix + str(raw))
        if key in _SECTIONS and isinstance(value, dict):
            _flatten(value, key + ".", source, out)
            continue
        if key in DEPRECATED_OFFLOAD:
            if not isinstance(value, bool):
                raise ConfigError(f"{source}: {key}: expected true or false, got {value!r}")
            key, value = DEPRECATED_OFFLOAD[key], "cpu" if value else "none"
        elif key in _SECTIONS:
            raise ConfigError(f"{source}: {key}: expected a mapping of keys, got {value!r}")
        elif key not in KNOWN:
            err = unknown_key_error(source, key, _section_keys(prefix), "DeepSpeed")
            top = f"; '{raw}' is a top-level key" if prefix and (raw in KNOWN or raw in _SECTIONS) else ""
            raise ConfigError(f"{err} ({_strictness(prefix)}{top})")
        if key in out:
            raise ConfigError(f"{source}: {key} is given twice (under two of its names)")
        out[key] = value


def _check_value(key: str, value: Any, source: str) -> None:
    """Refuse a value of the wrong kind for a key offsim maps (ignored keys are not read)."""
    if key not in MAPPED or value == "auto":
        return
    default = MAPPED[key].default
    if key.endswith(".device"):
        if value not in ("none", "cpu", "nvme"):
            raise ConfigError(f"{source}: {key}: expected none, cpu or nvme, got {value!r}")
    elif isinstance(default, bool) or key.endswith("overlap_comm"):
        if not isinstance(value, bool):
            raise ConfigError(f"{source}: {key}: expected true or false, got {value!r}")
    elif isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise ConfigError(f"{source}: {key}: expected a number >= 0, got {value!r}")
    if key == _Z + "stage" and value not in (0, 1, 2, 3):
        raise ConfigError(f"{source}: {key}: expected 0, 1, 2 or 3, got {value!r}")


# ---------------------------------------------------------------- resolution: a value and an origin per key


def resolve_ds_config(flat: dict[str, Any], source: str, workload: Workload | None) -> dict[str, Setting]:
    """A :class:`Setting` for every key offsim maps: the file's value, DeepSpeed's default, or
    ``"auto"`` resolved as the Hugging Face integration does.

    ``overlap_comm`` defaults to true at stage 3 and false below (zero/config.py validator).
    The batch keys and ``fp16/bf16.enabled`` keep ``"auto"`` here: the workload fills them
    (:func:`resolve_batch`, :func:`resolve_precision`). An ``"auto"`` that needs the model's
    hidden size while no workload is given, or one that nothing resolves, is an error.
    """
    stage = flat.get(_Z + "stage", 0)
    stage = 0 if stage == "auto" else int(stage)
    out: dict[str, Setting] = {}
    for key, spec in MAPPED.items():
        if key not in flat:
            default = (stage == 3) if key == _Z + "overlap_comm" else spec.default
            out[key] = Setting(key, default, "default", spec.source)
        elif flat[key] == "auto":
            out[key] = _resolve_auto(key, source, workload)
        else:
            out[key] = Setting(key, flat[key], "file")
    return out


def _resolve_auto(key: str, source: str, workload: Workload | None) -> Setting:
    """One ``"auto"``: from the hidden size, from the workload, or an error saying what is missing."""
    if key in AUTO_FROM_HIDDEN:
        rule, fn = AUTO_FROM_HIDDEN[key]
        if workload is None:
            raise ConfigError(
                f"{source}: {key} is \"auto\", which the Hugging Face integration sets to {rule} from the "
                "model's hidden size h; no workload is given here, so h is unknown: give the workload "
                "(-w/--workload) or write a number")
        h = workload.model.hidden
        return Setting(key, fn(h), "auto", f"{rule}, h = {h} (workload {workload.name})")
    if key in _AUTO_BATCH or key in ("fp16.enabled", "bf16.enabled"):
        return Setting(key, "auto", "auto", "from the workload")
    if key == "gradient_clipping":
        return Setting(key, 1.0, "auto", _AUTO_OTHER[key])
    raise ConfigError(
        f"{source}: {key} is \"auto\", which neither DeepSpeed nor the Hugging Face integration resolves "
        "(Accelerate refuses it: 'not found in kwargs'); write a value")


def _batch_int(key: str, value: Any, source: str) -> int | None:
    """A batch key as a positive integer (``None`` when absent)."""
    if value is None:
        return None
    if not float(value).is_integer() or value < 1:
        raise ConfigError(f"{source}: {key}: expected a whole number >= 1, got {value!r}")
    return int(value)


def resolve_batch(settings: dict[str, Setting], workload: Workload, source: str) -> tuple[dict[str, int],
                                                                                        list[Setting]]:
    """``workload.training`` fields from the batch keys, by DeepSpeed's rule.

    ``"auto"`` is the workload's value (the Trainer's arguments). Absent keys are derived as
    ``DeepSpeedConfig._set_batch_related_parameters`` does (runtime/config.py): with the
    data-parallel size as world size, ``train = micro x accumulation x dp``, a missing value by
    integer division, accumulation 1 when only one of train/micro is given. A contradiction is
    DeepSpeed's error. No batch key at all keeps the workload's batch.
    """
    tr, dp = workload.training, workload.training.data_parallel
    raw = {k: settings[k].value for k in _AUTO_BATCH}
    if raw["train_micro_batch_size_per_gpu"] == "auto":
        raw["train_micro_batch_size_per_gpu"] = tr.micro_batch
    if raw["gradient_accumulation_steps"] == "auto":
        raw["gradient_accumulation_steps"] = tr.grad_accumulation
    if raw["train_batch_size"] == "auto":
        raw["train_batch_size"] = ((raw["train_micro_batch_size_per_gpu"] or tr.micro_batch)
                                   * (raw["gradient_accumulation_steps"] or tr.grad_accumulation) * dp)
    t, m, g = (_batch_int(k, raw[k], source) for k in _AUTO_BATCH)
    if t is None and m is None:
        if g is not None:
            raise ConfigError(f"{source}: gradient_accumulation_steps is given without train_batch_size or "
                              "train_micro_batch_size_per_gpu; DeepSpeed needs one of them")
        return {}, []
    m, g, t = _derive_batch(t, m, g, dp)
    if min(t, m, g) < 1 or t != m * g * dp:
        raise ConfigError(
            f"{source}: check batch related parameters: train_batch_size is not equal to "
            f"micro_batch_per_gpu * gradient_acc_step * world_size: {t} != {m} * {g} * {dp} (DeepSpeed's "
            f"rule; world_size is workload {workload.name}'s training.data_parallel)")
    derived = [Setting(k, v, settings[k].origin if settings[k].value not in (None, "auto") else "derived",
                       "" if settings[k].value not in (None, "auto") else f"DeepSpeed's batch rule, dp = {dp}")
               for k, v in zip(_AUTO_BATCH, (t, m, g), strict=True)]
    return {"micro_batch": m, "grad_accumulation": g}, derived


def _derive_batch(t: int | None, m: int | None, g: int | None, dp: int) -> tuple[int, int, int]:
    """Micro-batch, accumulation and train batch with the missing ones derived (DeepSpeed's order)."""
    if t is not None and m is not None:
        return m, (t // m // dp if g is None else g), t
    g = 1 if g is None else g
    if t is not None:
        return t // dp // g, g, t
    if m is None:
        raise ConfigError("train_batch_size or train_micro_batch_size_per_gpu is needed")
    return m, g, m * g * dp


def resolve_precision(settings: dict[str, Setting], source: str) -> dict[str, str]:
    """``workload.precision`` fields from ``fp16``/``bf16``: the enabled format for compute,
    parameters and gradients; ``"auto"`` keeps the workload's; neither enabled is fp32 training
    (DeepSpeed runs fp32 without them; no separate master copy)."""
    fp16, bf16 = settings["fp16.enabled"].value, settings["bf16.enabled"].value
    if fp16 is True and bf16 is True:
        raise ConfigError(f"{source}: fp16.enabled and bf16.enabled are both true; DeepSpeed refuses that")
    for fmt, on in (("fp16", fp16), ("bf16", bf16)):
        if on is True:
            return {"compute": fmt, "params": fmt, "grads": fmt}
    if "auto" in (fp16, bf16):
        return {}
    return {"compute": "fp32", "params": "fp32", "grads": "fp32", "master_params": "none"}


# ---------------------------------------------------------------- mapping onto strategy knobs


@dataclass
class _Notes:
    """What the mapping says about the file, collected while mapping."""

    approximations: list[str]
    ignored: list[str]


def _devices(v: dict[str, Any], stage: int, given: set[str], notes: _Notes, source: str) -> tuple[str, str]:
    """The optimizer and parameter offload devices DeepSpeed actually uses at ``stage``."""
    opt, par = v[_OO + "device"], v[_OP + "device"]
    if opt != "none" and stage == 0:
        raise ConfigError(f"{source}: {_OO}device {opt} needs ZeRO stage 1, 2 or 3 (stage is 0)")
    if opt == "nvme" and stage < 3:
        notes.approximations.append(
            f"{_OO}device nvme at stage {stage}: DeepSpeed's stage 1/2 optimizer treats any offload device "
            "as cpu (stage_1_and_2.py cpu_offload), so offsim places the optimizer state on cpu")
        opt = "cpu"
    if par != "none" and stage < 3:
        notes.ignored.append(f"{_OP}device: DeepSpeed reads offload_param only at stage 3 (stage is {stage})")
        par = "none"
    for key in (_OP + "buffer_count", _OP + "buffer_size", _OP + "max_in_cpu"):
        if key in given and par != "nvme":
            notes.ignored.append(f"{key}: DeepSpeed uses it only with {_OP}device nvme")
    return opt, par


def _placement_fields(v: dict[str, Any], opt: str, par: str, notes: _Notes) -> dict[str, Any]:
    """Placement, optimizer device and pinning."""
    cpu_ckpt = bool(v["activation_checkpointing.cpu_checkpointing"])
    fields: dict[str, Any] = {
        "placement": {"params": "gpu" if par == "none" else par, "grads": "gpu" if opt == "none" else opt,
                      "optimizer_states": "gpu" if opt == "none" else opt,
                      "activations": "cpu" if cpu_ckpt else "gpu"},
        "optimizer_device": "gpu" if opt == "none" else "cpu",
    }
    pins = [v[_OO + "pin_memory"]] if opt != "none" else []
    pins += [v[_OP + "pin_memory"]] if par != "none" else []
    fields["pin_memory"] = pins[0] if pins else True
    if len(set(pins)) > 1:
        notes.approximations.append(
            f"{_OO}pin_memory {pins[0]} and {_OP}pin_memory {pins[1]} differ; offsim has one pin_memory "
            f"and uses the optimizer's ({pins[0]})")
    if cpu_ckpt:
        fields["activation_checkpointing"] = True
        notes.approximations.append(
            "activation_checkpointing.cpu_checkpointing: checkpoints wait in host memory "
            "(placement.activations cpu, checkpointing on); DeepSpeed applies this section only where model "
            "code calls deepspeed.checkpointing (Megatron-DeepSpeed), not for Hugging Face models")
    return fields


def _prefetch_depth(v: dict[str, Any], stage: int, par: str) -> int:
    """Layers fetched ahead: none below stage 3 (parameters stay whole on the GPU) or with a zero
    prefetch bucket; else one layer, two when the parameters come from NVMe (the swapper reads
    ahead into its buffer pool; the shipped zero-infinity-nvme preset)."""
    if stage < 3 or v[_Z + "stage3_prefetch_bucket_size"] == 0:
        return 0
    return 2 if par == "nvme" else 1


def _stage_fields(v: dict[str, Any], stage: int, par: str, given: set[str], notes: _Notes) -> dict[str, Any]:
    """Sub-groups, buckets, reuse distance, prefetch and overlap."""
    fields: dict[str, Any] = {
        "zero_stage": stage,
        "reduce_bucket_params": float(v[_Z + "reduce_bucket_size"]),
        "overlap_grad_offload": bool(v[_Z + "overlap_comm"]),
        "prefetch_depth": _prefetch_depth(v, stage, par),
    }
    if stage == 3:
        fields["sub_group_params"] = float(v[_Z + "sub_group_size"])
        fields["reuse_distance_params"] = float(v[_Z + "stage3_max_reuse_distance"])
        fields["zero3_prefetch_bucket_params"] = float(v[_Z + "stage3_prefetch_bucket_size"])
        fields["zero3_max_live_params"] = float(v[_Z + "stage3_max_live_parameters"])
        fields["reduce_scatter"] = bool(v[_Z + "reduce_scatter"])  # stage3.py __avg_scatter_contiguous_grads
        if fields["prefetch_depth"]:
            notes.approximations.append(
                f"{_Z}stage3_prefetch_bucket_size {v[_Z + 'stage3_prefetch_bucket_size']:g} elements: offsim "
                f"prefetches whole layers, {fields['prefetch_depth']} ahead (prefetch_depth), in time; the GPU "
                f"window follows DeepSpeed's per-submodule rule with this bucket and the live cap "
                f"(offsim/plan/zero3_fetch.py)")
    else:
        fields["sub_group_params"] = 1e12  # stage 1/2 step the whole partition at once (stage_1_and_2.py)
        for key in (_Z + "sub_group_size", _Z + "stage3_max_reuse_distance", _Z + "stage3_prefetch_bucket_size",
                    _Z + "stage3_max_live_parameters"):
            if key in given:
                notes.ignored.append(f"{key}: DeepSpeed uses it only at stage 3 (stage is {stage})")
        if _Z + "reduce_scatter" in given:
            notes.ignored.append(f"{_Z}reduce_scatter: offsim models it at stage 3 only (stage is {stage}); "
                                 f"{_SINGLE}")
    return fields


def _optimizer_fields(v: dict[str, Any], stage: int, opt: str, given: set[str], notes: _Notes,
                      source: str) -> dict[str, Any]:
    """Twin-Flow ratio, SuperOffload, the NVMe swap pipeline and buffers."""
    fields: dict[str, Any] = {"optimizer_buffer_count": int(v[_OO + "buffer_count"]),
                              "max_in_cpu_params": float(v[_OP + "max_in_cpu"])}
    ratio = float(v[_OO + "ratio"])
    if ratio < 1.0:
        if stage != 3 or opt == "none":
            raise ConfigError(f"{source}: {_OO}ratio {ratio:g} < 1 needs stage 3 with an offload device "
                              "(DeepSpeed's validator, offload_config.py)")
        if ratio <= 0:
            raise ConfigError(f"{source}: {_OO}ratio {ratio:g} keeps no optimizer state on the CPU; "
                              f"write {_OO}device none instead")
        fields["optimizer_gpu_fraction"] = 1.0 - ratio
    read, write = bool(v[_OO + "pipeline_read"]), bool(v[_OO + "pipeline_write"])
    fields["optimizer_swap_pipeline"] = read or write
    if read != write:
        notes.approximations.append(
            f"{_OO}pipeline_read {read} / pipeline_write {write}: DeepSpeed pipelines the swaps if either is "
            "set (PipelinedOptimizerSwapper); offsim overlaps reads and writes together")
    if v[_OO + "super_offload"]:
        fields.update(_super_offload(v, stage, opt, notes, source))
    elif "gradient_clipping" in given:
        notes.ignored.append("gradient_clipping: the global-norm clipping pass is not simulated on its own")
    return fields


def _super_offload(v: dict[str, Any], stage: int, opt: str, notes: _Notes, source: str) -> dict[str, Any]:
    """SuperOffload: with clipping off, the CPU steps each sub-group while backward continues
    (superoffload_stage3.py); with clipping on (DeepSpeed's default since v0.19.3) it steps after
    backward, as plain ZeRO-3 offload."""
    if stage != 3 or opt != "cpu":
        raise ConfigError(f"{source}: {_OO}super_offload needs stage 3 with {_OO}device cpu "
                          "(DeepSpeed's SuperOffloadOptimizer_Stage3)")
    if float(v["gradient_clipping"]) != 0.0:
        notes.approximations.append(
            "super_offload with gradient_clipping > 0: DeepSpeed steps after backward "
            "(_step_with_clipping), simulated as ZeRO-3 offload; its worker-process IPC is not modelled")
        return {}
    notes.approximations.append(
        "super_offload: the CPU step overlapping backward is simulated per layer (optimizer_schedule "
        "layerwise); DeepSpeed steps per sub-group, and its worker-process IPC is not modelled")
    return {"optimizer_schedule": "layerwise"}


def _swap_buffer_fields(v: dict[str, Any], opt: str, par: str) -> dict[str, Any]:
    """Pinned NVMe staging buffers: offload_param's buffer_count x buffer_size 16-bit elements."""
    if "nvme" not in (opt, par):
        return {}
    return {"pinned_buffer_count": int(v[_OP + "buffer_count"]),
            "pinned_buffer_mib": float(v[_OP + "buffer_size"]) * SWAP_ELEMENT_BYTES / MiB}


def ignored_lines(flat: dict[str, Any]) -> list[str]:
    """``key: why`` for every key of the file offsim does not model."""
    return [f"{key}: {KNOWN[key].ignored}" for key in flat if key in KNOWN and KNOWN[key].ignored]


def strategy_fields(settings: dict[str, Setting], given: set[str], source: str) -> tuple[dict[str, Any], _Notes]:
    """The :class:`Strategy` fields the resolved settings map onto, and the notes on the way."""
    v = {k: s.value for k, s in settings.items()}
    stage = int(v[_Z + "stage"])
    notes = _Notes([], [])
    opt, par = _devices(v, stage, given, notes, source)
    fields = {**_placement_fields(v, opt, par, notes), **_stage_fields(v, stage, par, given, notes),
              **_optimizer_fields(v, stage, opt, given, notes, source), **_swap_buffer_fields(v, opt, par)}
    fields["system"] = deepspeed_system(stage, opt, fields, bool(v[_OO + "super_offload"]))
    return fields, notes


def deepspeed_system(stage: int, opt: str, fields: dict[str, Any], super_offload: bool) -> str:
    """The offsim system (:mod:`offsim.systems`) of the DeepSpeed code path a ds_config selects:
    ``superoffload`` (``offload_optimizer.super_offload``: SuperOffloadOptimizer_Stage3),
    ``twin-flow`` (``offload_optimizer.ratio`` < 1), ``zero-infinity`` (stage 3 with an offload
    device: zero/stage3.py), ``zero-offload`` (stages 1-2 with the optimizer offloaded:
    zero/stage_1_and_2.py), else ``custom`` (no offload: the knobs in the standard order)."""
    if opt == "none":
        return "custom"
    if super_offload:
        return "superoffload"
    if fields.get("optimizer_gpu_fraction", 0.0) > 0:
        return "twin-flow"
    return "zero-infinity" if stage == 3 else "zero-offload"


def reading_from_ds_config(data: dict[str, Any], source: str, workload: Workload | None = None,
                           fmt: str = "ds_config") -> Reading:
    """A ds_config as offsim understands it: the strategy, each value's origin, the ignored keys,
    the approximations, and the workload's batch and precision as the file sets them.

    Without a workload the batch keys cannot be checked against the data-parallel size; they are
    then applied when the strategy is given with one (:func:`~offsim.config.run.make_run_config`).
    """
    flat = parse_ds_config(data, source)
    settings = resolve_ds_config(flat, source, workload)
    fields, notes = strategy_fields(settings, set(flat), source)
    training: dict[str, int] = {}
    batch_settings: list[Setting] = []
    if workload is not None:
        training, batch_settings = resolve_batch(settings, workload, source)
    for s in batch_settings:
        settings[s.key] = s
    words = "DeepSpeed config" if fmt == "ds_config" else "Accelerate DeepSpeed plugin"
    strategy = build_strategy(fields, source, words, "; ".join(notes.approximations))
    return Reading(source=source, fmt=fmt, strategy=strategy, settings=tuple(settings.values()),
                   ignored=tuple(ignored_lines(flat) + notes.ignored), approximations=tuple(notes.approximations),
                   training=training, precision=resolve_precision(settings, source))


# ---------------------------------------------------------------- export: a strategy as a ds_config

#: Where an exported NVMe config swaps (DeepSpeed needs a path; offsim takes the NVMe from the profile).
NVME_PATH = "/local_nvme"


def _export_offload(st: Strategy, stage: int) -> dict[str, Any]:
    """``offload_optimizer`` and, at stage 3, ``offload_param`` of ``st``."""
    opt = st.placement.optimizer_states if st.optimizer_device == "cpu" else "none"
    oo: dict[str, Any] = {"device": opt}
    if opt != "none":
        oo.update(pin_memory=st.pin_memory, buffer_count=st.optimizer_buffer_count,
                  pipeline_read=st.optimizer_swap_pipeline, pipeline_write=st.optimizer_swap_pipeline)
        if opt == "nvme":
            oo["nvme_path"] = NVME_PATH
        if st.optimizer_gpu_fraction > 0:
            oo["ratio"] = round(1.0 - st.optimizer_gpu_fraction, 9)
        if st.optimizer_schedule == "layerwise":
            oo["super_offload"] = True
    out = {"offload_optimizer": oo}
    if stage == 3:
        par = st.placement.params
        op: dict[str, Any] = {"device": "none" if par == "gpu" else par}
        if par != "gpu":
            op["pin_memory"] = st.pin_memory
        if par == "nvme":
            op.update(nvme_path=NVME_PATH, buffer_count=st.pinned_buffer_count,
                      buffer_size=round(st.pinned_buffer_mib * MiB / SWAP_ELEMENT_BYTES),
                      max_in_cpu=round(st.max_in_cpu_params))
        out["offload_param"] = op
    return out


def ds_config_from_strategy(st: Strategy) -> dict[str, Any]:
    """``st`` written as a ds_config: the batch and precision keys ``"auto"`` (the workload
    decides), every other key explicit. SuperOffload's layer-wise step is written as
    ``super_offload`` with ``gradient_clipping`` 0, at stage 3 (DeepSpeed's only stage for it).
    Knobs DeepSpeed has no key for are listed by :func:`inexpressible`."""
    stage = 3 if st.optimizer_schedule == "layerwise" else st.zero_stage
    zero: dict[str, Any] = {"stage": stage, **_export_offload(st, stage),
                            "overlap_comm": st.overlap_grad_offload,
                            "reduce_bucket_size": round(st.reduce_bucket_params)}
    if stage == 3:
        zero["sub_group_size"] = round(st.sub_group_params)
        zero["stage3_max_reuse_distance"] = round(st.reuse_distance_params)
        zero["stage3_prefetch_bucket_size"] = 0 if st.prefetch_depth == 0 else round(st.zero3_prefetch_bucket_params)
        zero["stage3_max_live_parameters"] = round(st.zero3_max_live_params)
        zero["reduce_scatter"] = st.reduce_scatter
    cfg: dict[str, Any] = {"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto",
                           "gradient_accumulation_steps": "auto",
                           "fp16": {"enabled": "auto"}, "bf16": {"enabled": "auto"}}
    if st.optimizer_schedule == "layerwise":
        cfg["gradient_clipping"] = 0.0
    cfg["zero_optimization"] = zero
    if st.placement.activations == "cpu":
        cfg["activation_checkpointing"] = {"partition_activations": True, "cpu_checkpointing": True}
    return cfg


def _same(a: Any, b: Any) -> bool:
    """Equal, floats within a relative 1e-6 (element counts rounded to whole numbers)."""
    if isinstance(a, float) and isinstance(b, float | int):
        return math.isclose(a, b, rel_tol=1e-6)
    return bool(a == b)


def inexpressible(st: Strategy) -> list[str]:
    """``field: value (the ds_config gives ...)`` for each knob of ``st`` that its ds_config
    (:func:`ds_config_from_strategy`) read back does not reproduce."""
    back = reading_from_ds_config(ds_config_from_strategy(st), f"{st.name}.json").strategy
    skip = {"name", "description", "provenance"}
    a, b = st.model_dump(exclude=skip), back.model_dump(exclude=skip)
    return [f"{k}: {a[k]!r} (the ds_config gives {b[k]!r})" for k in a if not _same(a[k], b[k])]
