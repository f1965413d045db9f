"""RunResult: a self-describing result (config, metrics, trace, runtime)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from offsim.config.run import RunConfig
from offsim.core import strict_json
from offsim.core._version import __version__
from offsim.metrics import RunMetrics
from offsim.trace import Recorder

if TYPE_CHECKING:  # frames are built by the Recorder, which imports pandas then
    import pandas as pd


@dataclass
class RunResult:
    """What :func:`offsim.simulate` returns.

    Attributes:
        config: the resolved configuration.
        metrics: headline metrics (``feasible`` false with a reason when it does not fit).
        recorder: spans and memory level samples (empty when infeasible before simulating).
        footprint_bytes: the planner's per-tier estimate (``need`` and ``capacity``).
        events: SimPy events processed.
        wall_time_s: seconds the simulation took.
    """

    config: RunConfig
    metrics: RunMetrics
    recorder: Recorder = field(default_factory=Recorder)
    footprint_bytes: dict[str, dict[str, float]] = field(default_factory=dict)
    events: int = 0
    wall_time_s: float = 0.0

    @property
    def feasible(self) -> bool:
        """True when the configuration fits and was simulated."""
        return self.metrics.feasible

    def spans(self, window: bool = False) -> pd.DataFrame:
        """Per-op spans (compute, transfers, stalls) as a DataFrame. Every span of the run;
        ``window``: only the repetitions simulated (a run the steady-state shortcut took holds
        the others as copies: a trace of them stays the size of what was simulated)."""
        return self.recorder.spans_frame(window)

    def levels(self, window: bool = False) -> pd.DataFrame:
        """Memory level per tier over time as a DataFrame (``window`` as for :meth:`spans`)."""
        return self.recorder.levels_frame(window)

    def to_dict(self) -> dict[str, Any]:
        """Metrics plus what produced them, JSON-serialisable. ``params_total`` and
        ``params_active`` are the model's parameters stored and updated, and those one token uses
        (equal without mixture-of-experts; :class:`~offsim.config.workload.ModelShape`)."""
        model = self.config.workload.model
        return {
            **self.metrics.model_dump(),
            "hardware": self.config.hardware.name,
            "workload": self.config.workload.name,
            "strategy": self.config.strategy.name,
            "params_total": model.total_params,
            "params_active": model.active_params,
            "iterations": self.config.iterations,
            "warmup_iterations": self.config.warmup_iterations,
            "footprint_bytes": self.footprint_bytes,
            "events": self.events,
            "wall_time_s": self.wall_time_s,
            "offsim_version": __version__,
        }

    def to_json(self, indent: int | None = 2) -> str:
        """:meth:`to_dict` as strict JSON text: a NaN or infinite number is written as ``null``."""
        return strict_json.dumps(self.to_dict(), indent=indent)
