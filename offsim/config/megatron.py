"""Megatron-Core offload and recompute options as an offsim strategy.

Accepted as a YAML (or JSON) mapping of the option names (``optimizer_cpu_offload: true``, dashes
or underscores, with or without the leading ``--``), or as a file holding the command-line text
(``--optimizer-cpu-offload --optimizer-offload-fraction 0.5 ...``). Option names, defaults and
constraints are those of Megatron-LM ``d98e8a64dd`` (``../shared/reference/config_formats.md`` §5):
``megatron/training/arguments.py`` (CLI), ``megatron/core/optimizer/optimizer_config.py``
(``OptimizerConfig``), ``megatron/core/optimizer/cpu_offloading/hybrid_optimizer.py`` (the step)
and ``megatron/core/transformer/transformer_config.py`` (activation offload and recompute).

Optimizer offload (``optimizer_cpu_offload`` and its fraction, overlap and pinning switches) and
layer-level activation offload (``cpu_offloading``, ``cpu_offloading_num_layers``) map onto
``system: megatron-offload`` (:mod:`offsim.systems.megatron_offload`) with those switches as its
``system_options``; without either, the options map onto the standard composition (recompute).
"""

from __future__ import annotations

import re
import shlex
from typing import Any

from offsim.config.reading import Reading, Setting, build_strategy, unknown_key_error
from offsim.config.workload import Workload
from offsim.errors import ConfigError

ARGS = "megatron/training/arguments.py"
OPT = "megatron/core/optimizer/optimizer_config.py"
TC = "megatron/core/transformer/transformer_config.py"

#: Options offsim maps: (default on the command line, default in a config mapping, source).
MAPPED: dict[str, tuple[Any, Any, str]] = {
    "optimizer_cpu_offload": (False, False, OPT),
    "optimizer_offload_fraction": (1.0, 0.0, OPT),  # the CLI default is 1.0, OptimizerConfig's 0.0
    "overlap_cpu_optimizer_d2h_h2d": (False, False, OPT),
    "pin_cpu_grads": (True, True, OPT),  # --no-pin-cpu-grads
    "pin_cpu_params": (True, True, OPT),  # --no-pin-cpu-params
    "use_precision_aware_optimizer": (False, False, OPT),
    "use_distributed_optimizer": (False, False, ARGS),
    "cpu_offloading": (False, False, TC),
    "cpu_offloading_num_layers": (0, 0, TC),
    "cpu_offloading_activations": (True, True, TC),
    "cpu_offloading_weights": (False, False, TC),
    "recompute_granularity": (None, None, TC),
    "recompute_activations": (False, False, ARGS),
    "recompute_method": (None, None, TC),
    "recompute_num_layers": (None, None, TC),
    "bf16": (False, False, ARGS),
    "fp16": (False, False, ARGS),
}
_GPU_DTYPES = "storage formats of the GPU share (precision-aware optimizer): offsim uses the workload's precision"
_FINE = "module-level activation offload is not expressible in offsim (it offloads whole blocks)"
#: Options offsim reads and ignores, with the reason.
IGNORED: dict[str, str] = {
    "use_torch_optimizer_for_cpu_offload": "overridden for adam (torch AdamW runs on the CPU anyway)",
    "main_grads_dtype": _GPU_DTYPES, "main_params_dtype": _GPU_DTYPES, "exp_avg_dtype": _GPU_DTYPES,
    "exp_avg_sq_dtype": _GPU_DTYPES,
    "cpu_offloading_double_buffering": "not modelled (offsim's activation reloads are prefetched anyway)",
    "cpu_offloading_retain_pinned_cpu_buffers": "not modelled (CUDA graphs)",
    "fine_grained_activation_offloading": _FINE, "offload_modules": _FINE, "min_offloaded_tensor_size": _FINE,
    "activation_offload_fraction": _FINE, "delta_offload_bytes_across_pp_ranks": _FINE,
    "delay_offload_until_cuda_graph": _FINE,
    "recompute_modules": "offsim's selective recompute is not per module",
    "distribute_saved_activations": "offsim simulates one GPU of the tensor-parallel group",
    "micro_batch_size": "not applied: the workload's training.micro_batch sets the batch",
    "global_batch_size": "not applied: the workload's training sets the batch",
    "tensor_model_parallel_size": "not applied: the workload's training.tensor_parallel",
    "pipeline_model_parallel_size": "pipeline parallelism is not modelled",
    "seq_length": "not applied: the workload's training.seq_len",
    "optimizer": "offsim simulates Adam (the workload's optimizer)",
}
MARKERS = ("optimizer_cpu_offload", "optimizer_offload_fraction", "overlap_cpu_optimizer_d2h_h2d",
           "use_precision_aware_optimizer", "cpu_offloading", "cpu_offloading_num_layers",
           "fine_grained_activation_offloading", "recompute_granularity")


def _norm(key: str) -> str:
    """``--optimizer-cpu-offload`` and ``optimizer_cpu_offload`` are the same option."""
    return str(key).lstrip("-").replace("-", "_")


def is_megatron_options(data: Any) -> bool:
    """True for Megatron options: command-line text, or a mapping naming one of :data:`MARKERS`."""
    if isinstance(data, str):
        return data.lstrip().startswith("--")
    return isinstance(data, dict) and "schema_version" not in data and any(_norm(k) in MARKERS for k in data)


def parse_arguments(text: str) -> dict[str, Any]:
    """``--flag value`` pairs (a flag followed by another flag is a switch; ``--no-x`` is x false)."""
    tokens = shlex.split(re.sub(r"\\\s", " ", text), comments=True)  # line continuations
    out: dict[str, Any] = {}
    i = 0
    while i < len(tokens):
        key = _norm(tokens[i])
        has_value = i + 1 < len(tokens) and not tokens[i + 1].startswith("--")
        if has_value:
            out[key] = yaml_scalar(tokens[i + 1])
            i += 2
            continue
        out[key.removeprefix("no_") if key.startswith("no_") else key] = not key.startswith("no_")
        i += 1
    return out


def yaml_scalar(text: str) -> Any:
    """A command-line value as a number when it reads as one."""
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def _options(data: Any, source: str) -> tuple[dict[str, Any], int]:
    """The options by normalised name, and which defaults apply (0: command line, 1: config)."""
    if isinstance(data, str):
        opts, which = parse_arguments(data), 0
    else:
        opts, which = {_norm(k): v for k, v in data.items()}, 1
    for key in opts:
        if key not in MAPPED and key not in IGNORED:
            raise unknown_key_error(source, key, [*MAPPED, *IGNORED], "Megatron-Core")
    if opts.get("cpu_offloading_num_layers", 0):
        opts.setdefault("cpu_offloading", True)  # arguments.py: --cpu-offloading-num-layers > 0 turns it on
    return opts, which


def _settings(opts: dict[str, Any], which: int) -> dict[str, Setting]:
    return {k: Setting(k, opts[k], "file") if k in opts else Setting(k, d[which], "default", d[2])
            for k, d in MAPPED.items()}


def _optimizer_options(v: dict[str, Any], source: str, approx: list[str]) -> dict[str, Any]:
    """HybridDeviceOptimizer's knobs as :class:`offsim.systems.megatron_offload.Options` (none
    without ``optimizer_cpu_offload``)."""
    if not v["optimizer_cpu_offload"]:
        return {}
    if not (v["use_precision_aware_optimizer"] and v["use_distributed_optimizer"]):
        raise ConfigError(f"{source}: optimizer_cpu_offload needs use_precision_aware_optimizer and "
                          "use_distributed_optimizer (Megatron asserts both)")
    f = float(v["optimizer_offload_fraction"])
    if not 0.0 <= f <= 1.0:
        raise ConfigError(f"{source}: optimizer_offload_fraction: expected 0 to 1, got {f:g}")
    if f == 0.0:
        approx.append("optimizer_offload_fraction 0 (OptimizerConfig's default when the key is absent from a "
                      "config; the command line's is 1.0): nothing is offloaded, the optimizer stays on the GPU")
    else:
        approx.append("the CPU share is stepped as equal tensors of one MLP matrix (hidden x ffn_hidden, or x "
                      "expert_ffn_hidden for experts), not the model's own tensors")
    return {"optimizer_offload_fraction": f, "overlap_cpu_optimizer_d2h_h2d": bool(v["overlap_cpu_optimizer_d2h_h2d"]),
            "pin_cpu_grads": bool(v["pin_cpu_grads"]), "pin_cpu_params": bool(v["pin_cpu_params"])}


def _recompute_fields(v: dict[str, Any], source: str, approx: list[str]) -> dict[str, Any]:
    """Full recompute is offsim's checkpointing (``block`` of N layers: the first N blocks);
    selective recompute keeps the activations offsim counts."""
    gran = "selective" if v["recompute_activations"] else v["recompute_granularity"]
    if gran is None:
        return {}
    if gran == "selective":
        approx.append("selective recompute (core attention): simulated without checkpointing; with flash "
                      "attention offsim stores no score matrix to recompute")
        return {"activation_checkpointing": False}
    if gran != "full":
        raise ConfigError(f"{source}: recompute_granularity: expected full or selective, got {gran!r}")
    n = v["recompute_num_layers"]
    if v["recompute_method"] == "block" and n:
        return {"activation_checkpointing": False,
                "policies": {"activations": {"kind": "per-block", "recompute": int(n)}}}
    if v["recompute_method"] == "uniform" and n and int(n) > 1:
        approx.append(f"recompute_method uniform with {n} layers per chunk: offsim checkpoints every block")
    return {"activation_checkpointing": True}


def _activation_options(v: dict[str, Any], source: str, approx: list[str]) -> dict[str, Any]:
    """Layer-level activation offload (TE ``get_cpu_offload_context``): the first
    ``cpu_offloading_num_layers`` blocks keep their saved activations in host memory (none
    without ``cpu_offloading``)."""
    if not v["cpu_offloading"]:
        return {}
    if v["recompute_granularity"] is not None or v["recompute_activations"]:
        raise ConfigError(f"{source}: cpu_offloading cannot be combined with recompute (Megatron refuses it)")
    if v["cpu_offloading_weights"]:
        approx.append("cpu_offloading_weights: a no-op on TransformerEngine's default path (weight offload is "
                      "deprecated there); the weights stay on the GPU")
    n = int(v["cpu_offloading_num_layers"])
    if not v["cpu_offloading_activations"] or n == 0:
        approx.append("cpu_offloading offloads no activations here (cpu_offloading_activations false or "
                      "cpu_offloading_num_layers 0)")
        return {"activation_offload_layers": 0}
    return {"activation_offload_layers": n}


def _system_fields(v: dict[str, Any], source: str, approx: list[str]) -> dict[str, Any]:
    """``system: megatron-offload`` with its options when optimizer or activation offload is on
    (ZeRO-1 with ``use_distributed_optimizer``, every state placed on the GPU: the system moves
    the CPU share itself); else the recompute settings on the standard composition."""
    fields: dict[str, Any] = {"zero_stage": 1 if v["use_distributed_optimizer"] else 0}
    options = {**_optimizer_options(v, source, approx), **_activation_options(v, source, approx)}
    if not options:
        return {**fields, **_recompute_fields(v, source, approx)}
    options.setdefault("optimizer_offload_fraction", 0.0)  # activation offload alone: the optimizer on the GPU
    if v["cpu_offloading"]:
        fields["activation_checkpointing"] = False
    return {**fields, "system": "megatron-offload", "system_options": options, "pin_memory": True,
            "placement": {"params": "gpu", "grads": "gpu", "optimizer_states": "gpu", "activations": "gpu"}}


def reading_from_megatron(data: Any, source: str, workload: Workload | None = None) -> Reading:
    """Megatron-Core options as offsim understands them (see the module docstring); ``workload`` is
    not needed (the system sizes its CPU tensors from the run's workload) and kept for the loader."""
    del workload
    opts, which = _options(data, source)
    settings = _settings(opts, which)
    v = {k: s.value for k, s in settings.items()}
    approx: list[str] = []
    fields = _system_fields(v, source, approx)
    precision = {}
    if v["bf16"] or v["fp16"]:
        fmt = "bf16" if v["bf16"] else "fp16"
        precision = {"compute": fmt, "params": fmt, "grads": fmt}
    ignored = [f"{k}: {IGNORED[k]}" for k in opts if k in IGNORED]
    strategy = build_strategy(fields, source, "Megatron-Core options", "; ".join(approx))
    return Reading(source=source, fmt="megatron", strategy=strategy, settings=tuple(settings.values()),
                   ignored=tuple(ignored), approximations=tuple(approx), precision=precision)
