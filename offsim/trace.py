"""Records the engine emits: spans (something busy on a resource) and memory level samples.

The engine writes to a :class:`Recorder`; sweeps that need only metrics still use one (spans are
how the metrics are computed) but skip the DataFrame conversion.
"""

from __future__ import annotations

from array import array
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pandas is imported where a frame is built, not by every run (issue 16)
    import pandas as pd

SPAN_COLUMNS = ["iteration", "phase", "resource", "kind", "name", "layer", "start_s", "end_s", "bytes"]
LEVEL_COLUMNS = ["t_s", "tier", "bytes"]


@dataclass(frozen=True, slots=True)
class Span:
    """One interval of activity.

    Attributes:
        iteration: optimizer step it belongs to.
        phase: ``forward``, ``backward`` or ``optimizer``.
        resource: the track it lies on (``gpu``, ``h2d``, ``d2h``, ``nvme_read``, ``nvme_write``,
            ``cpu``, ``dram_copy``, ``gpu_link``, ``gpu_stall``).
        kind: what it is (``compute``, ``recompute``, ``param_fetch``, ``grad_offload``, ...).
        name: a readable label, e.g. ``block3 params``.
        layer: layer index, or -1 when not tied to one layer (optimizer sub-groups use -1).
        bytes: bytes moved (0 for compute).
    """

    iteration: int
    phase: str
    resource: str
    kind: str
    name: str
    layer: int
    start_s: float
    end_s: float
    bytes: float = 0.0


@dataclass(frozen=True, slots=True)
class LevelSample:
    """Bytes resident in ``tier`` from ``t_s`` on (per GPU for gpu; per node for host and nvme)."""

    t_s: float
    tier: str
    bytes: float


@dataclass(frozen=True, slots=True)
class CacheEvent:
    """One event of a policy-managed cache (``gpu_params``, ``dram_optimizer``).

    Attributes:
        iteration: optimizer step it belongs to.
        cache: the cache.
        kind: ``hit``, ``miss`` (fetched), ``evict`` (dropped for room), ``release`` (dropped
            after use), ``writeback`` (a dirty victim written to the tier below), ``stall``
            (the consumer waited for this cache's data).
        tensor: layer or sub-group index (-1 for a stall).
        bytes: the tensor's bytes (hit, miss, evict, release, writeback).
        seconds: the wait (stall).
    """

    iteration: int
    cache: str
    kind: str
    tensor: int
    bytes: float = 0.0
    seconds: float = 0.0


@dataclass
class Recorder:
    """Collects spans, level samples and iteration boundaries.

    Level samples are kept as three columns (time in s, tier index, bytes; 17 bytes a sample
    rather than a Python object of ~100) and read back as :class:`LevelSample` by :attr:`levels`.
    """

    spans: list[Span] = field(default_factory=list)
    iteration_starts_s: list[float] = field(default_factory=list)
    phases: list[tuple[int, str, float, float]] = field(default_factory=list)
    end_s: float = 0.0
    cache_events: list[CacheEvent] = field(default_factory=list)
    cache_info: dict[str, dict] = field(default_factory=dict)
    level_t_s: array = field(default_factory=lambda: array("d"), repr=False)
    level_tier: array = field(default_factory=lambda: array("B"), repr=False)
    level_bytes: array = field(default_factory=lambda: array("d"), repr=False)
    tier_names: list[str] = field(default_factory=list, repr=False)

    @property
    def levels(self) -> list[LevelSample]:
        """The level samples in the order recorded (built on each call: read it once)."""
        names = self.tier_names
        return [LevelSample(t, names[i], b) for t, i, b in zip(self.level_t_s, self.level_tier, self.level_bytes,
                                                                strict=True)]

    def cache(self, event: CacheEvent) -> None:
        """Record one cache event."""
        self.cache_events.append(event)

    def phase(self, iteration: int, name: str, start_s: float, end_s: float) -> None:
        """Record that the main process spent ``[start_s, end_s]`` of ``iteration`` in phase ``name``."""
        self.phases.append((iteration, name, start_s, end_s))

    def span(self, span: Span) -> None:
        """Record one span."""
        self.spans.append(span)

    def level(self, t_s: float, tier: str, nbytes: float) -> None:
        """Record that ``tier`` holds ``nbytes`` from ``t_s`` (seconds) on."""
        names = self.tier_names
        try:
            index = names.index(tier)
        except ValueError:  # a tier's first sample
            index = len(names)
            names.append(tier)
        self.level_t_s.append(t_s)
        self.level_tier.append(index)
        self.level_bytes.append(nbytes)

    def spans_frame(self) -> pd.DataFrame:
        """Spans as a DataFrame with :data:`SPAN_COLUMNS`."""
        import pandas as pd

        return pd.DataFrame([asdict(s) for s in self.spans], columns=SPAN_COLUMNS)

    def levels_frame(self) -> pd.DataFrame:
        """Level samples as a DataFrame with :data:`LEVEL_COLUMNS`."""
        import pandas as pd

        names = self.tier_names
        return pd.DataFrame({"t_s": list(self.level_t_s), "tier": [names[i] for i in self.level_tier],
                             "bytes": list(self.level_bytes)}, columns=LEVEL_COLUMNS)
