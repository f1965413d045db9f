"""RunConfig: one hardware profile, one workload, one strategy, and how long to simulate."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from pydantic import Field, model_validator

from offsim.config.base import Frozen
from offsim.config.hardware import HardwareProfile
from offsim.config.loading import load_profile, load_strategy, load_workload, read_strategy
from offsim.config.reading import Reading
from offsim.config.strategy import Strategy
from offsim.config.workload import Workload
from offsim.core.window import MeasureWindow
from offsim.errors import ConfigError


class RunConfig(Frozen):
    """Everything one simulation needs; cross-file rules are checked here.

    Attributes:
        iterations: optimizer steps simulated.
        warmup_iterations: leading steps excluded from the steady-state metrics.
        tail_iterations: trailing steps excluded from them (set from the system's
            :class:`MeasureWindow` when the run is composed: work a next iteration would overlap).
    """

    hardware: HardwareProfile
    workload: Workload
    strategy: Strategy
    iterations: int = Field(default=3, ge=1, le=1000)
    warmup_iterations: int = Field(default=1, ge=0)
    tail_iterations: int = Field(default=0, ge=0)
    notes: tuple[str, ...] = Field(
        default=(), exclude=True,
        description="what offsim says about the inputs: keys of a user's strategy file it ignores, "
                    "approximations, workload fields the file changed (not part of the written config)")

    @model_validator(mode="after")
    def _check(self) -> RunConfig:
        hw, wl, st = self.hardware, self.workload, self.strategy
        if st.uses_nvme() and hw.nvme is None:
            p = st.placement
            fields = [f"placement.{k}" for k in ("params", "grads", "optimizer_states", "activations")
                      if getattr(p, k) == "nvme"] or ["policies.activations"]
            raise ValueError(
                f"strategy '{st.name}' places {', '.join(fields)} on nvme but hardware profile "
                f"'{hw.name}' has no nvme block"
            )
        gpus = hw.topology.gpus_per_node * hw.topology.nodes
        t = wl.training
        if t.data_parallel * t.tensor_parallel > gpus:
            raise ValueError(
                f"workload '{wl.name}' training.data_parallel={t.data_parallel} x tensor_parallel="
                f"{t.tensor_parallel} exceeds the {gpus} GPUs of hardware profile '{hw.name}' "
                "(topology.gpus_per_node x nodes)"
            )
        if t.tensor_parallel > hw.topology.gpus_per_node:
            raise ValueError(f"workload '{wl.name}' training.tensor_parallel={t.tensor_parallel} spans more than "
                             f"one node of hardware profile '{hw.name}' ({hw.topology.gpus_per_node} GPUs per node)")
        if st.lp_copy == "fused_zero_copy" and wl.precision.params != "fp16":
            raise ValueError(f"strategy '{st.name}' lp_copy 'fused_zero_copy' needs fp16 parameters; workload "
                             f"'{wl.name}' has {wl.precision.params} (DeepSpeed fused the copy for fp16 only)")
        if self.warmup_iterations + self.tail_iterations >= self.iterations:
            raise ValueError("warmup_iterations (plus the system's trailing iterations) must be below iterations")
        return self

    @property
    def activation_checkpointing(self) -> bool:
        """The strategy's override, else the workload's setting."""
        s = self.strategy.activation_checkpointing
        return self.workload.training.activation_checkpointing if s is None else s

    @property
    def steady_iterations(self) -> int:
        """Iterations the metrics average over."""
        return self.iterations - self.warmup_iterations - self.tail_iterations

    @property
    def measured_range(self) -> range:
        """Indices of the iterations the metrics average over."""
        return range(self.warmup_iterations, self.iterations - self.tail_iterations)


def fit_window(cfg: RunConfig, window: MeasureWindow) -> RunConfig:
    """``cfg`` with at least ``window.lead`` warmup iterations, ``window.tail`` trailing ones and
    whole periods (at least one) measured; a note says what was raised and why."""
    warmup = max(cfg.warmup_iterations, window.lead)
    asked = max(1, cfg.iterations - cfg.warmup_iterations - cfg.tail_iterations)
    steady = window.period * math.ceil(asked / window.period)
    iterations = warmup + steady + window.tail
    if (iterations, warmup, window.tail) == (cfg.iterations, cfg.warmup_iterations, cfg.tail_iterations):
        return cfg
    note = (f"iterations {cfg.iterations} -> {iterations} (warmup {cfg.warmup_iterations} -> {warmup}, "
            f"{window.tail} trailing left out, {steady} measured): {window.why}")
    return cfg.model_copy(update={"iterations": iterations, "warmup_iterations": warmup,
                                  "tail_iterations": window.tail, "notes": (*cfg.notes, note)})


def make_run_config(
    hardware: str | Path | HardwareProfile,
    workload: str | Path | Workload,
    strategy: str | Path | Strategy,
    *,
    iterations: int = 3,
    warmup_iterations: int = 1,
) -> RunConfig:
    """Build a RunConfig from names, paths or models; cross-file errors become ConfigError.

    A strategy given as a path may be a DeepSpeed, Accelerate or Megatron-Core file: it is read
    with the workload (for ``"auto"`` values), the batch and precision it sets are applied to the
    workload (:func:`apply_strategy_file`), and what offsim ignored or approximated is kept in
    :attr:`RunConfig.notes`.
    """
    hw = hardware if isinstance(hardware, HardwareProfile) else load_profile(str(hardware))
    wl = workload if isinstance(workload, Workload) else load_workload(str(workload))
    notes: tuple[str, ...] = ()
    if isinstance(strategy, Strategy):
        st = strategy
    else:
        reading = read_strategy(str(strategy), wl) if _is_path(strategy) else None
        st = reading.strategy if reading is not None else load_strategy(str(strategy))
        if reading is not None and reading.fmt != "offsim":
            wl, changed = apply_strategy_file(wl, reading)
            notes = reading.notes() + tuple(changed)
    try:
        return RunConfig(hardware=hw, workload=wl, strategy=st, iterations=iterations,
                         warmup_iterations=warmup_iterations, notes=notes)
    except ValueError as exc:
        errs: list[dict] = getattr(exc, "errors", lambda: [])()
        msg = "; ".join(e["msg"].removeprefix("Value error, ") for e in errs) or str(exc)
        raise ConfigError(msg) from None


def _is_path(name_or_path: str | Path) -> bool:
    """True when ``name_or_path`` names a file rather than a shipped strategy."""
    text = str(name_or_path)
    return Path(text).suffix in (".yaml", ".yml", ".json", ".txt") or "/" in text or Path(text).exists()


def apply_strategy_file(wl: Workload, reading: Reading) -> tuple[Workload, list[str]]:
    """The workload with the batch and precision a user's strategy file sets, and one line per
    field it changed.

    The file's explicit values win; its ``"auto"`` values (and absent keys, where DeepSpeed's
    batch rule leaves them free) were already filled from the workload, so they change nothing.
    """
    changes: dict[str, dict[str, Any]] = {"training": dict(reading.training), "precision": dict(reading.precision)}
    lines: list[str] = []
    updated: dict[str, object] = {}
    for part, fields in changes.items():
        current = getattr(wl, part)
        diff = {k: v for k, v in fields.items() if getattr(current, k) != v}
        if not diff:
            continue
        updated[part] = current.model_validate({**current.model_dump(), **diff})
        lines += [f"{Path(reading.source).name}: sets workload {wl.name}'s {part}.{k} = {v} "
                  f"(was {getattr(current, k)})" for k, v in diff.items()]
    return (wl.model_copy(update=updated) if updated else wl), lines
