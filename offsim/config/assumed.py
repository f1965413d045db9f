"""Values of a hardware profile or a workload that are assumptions, with the range they may take
(issue 23 part 3).

A data file may list, under ``assumed``, the fields it did not measure, each with its range and
why::

    assumed:
      cpu.memcpy_gb_per_s: {range: [20, 60], why: "half the DRAM rate; no memcpy measured"}
      gpu.gemm_efficiency: {scale: [0.85, 1.05], why: "square-GEMM sweep; model shapes run lower"}

The key is the field's dotted path inside the file. ``range`` is ``[low, high]`` in the field's
own units and must hold the value the file gives; ``scale`` is ``[low, high]`` as factors of it
(holding 1), the only form for a curve of ``[x, y]`` points (its ``y`` values are scaled). A
whole number (a workload's ``training.seq_len``) is drawn as a factor too and rounded (at least 1).
``offsim run --samples N`` draws every such range (log-uniformly, as the shipped
``validation/assumptions.yaml``), in place of a shipped range on the same field.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator

from offsim.config.base import Frozen


class AssumedRange(Frozen):
    """The range of one assumed value: in its units (``range``) or as factors (``scale``)."""

    range: tuple[float, float] | None = Field(
        default=None, strict=False, description="[low, high] in the field's own units, holding its value")
    scale: tuple[float, float] | None = Field(
        default=None, strict=False, description="[low, high] as factors of the value (1 inside); curves: the y values")
    why: str = Field(min_length=1, description="where the range comes from")

    @model_validator(mode="after")
    def _one_form(self) -> AssumedRange:
        if (self.range is None) == (self.scale is None):
            raise ValueError("give exactly one of range and scale")
        low, high = self.range or self.scale or (0.0, 0.0)
        if not 0 < low <= high:
            raise ValueError(f"[{low}, {high}] must have 0 < low <= high")
        if self.scale is not None and not low <= 1 <= high:
            raise ValueError(f"scale [{low}, {high}] must hold 1")
        return self

    def factors(self, value: Any) -> tuple[float, float]:
        """The range as factors of ``value`` (the field as the file gives it)."""
        if self.scale is not None:
            return self.scale
        low, high = self.range or (1.0, 1.0)
        return low / float(value), high / float(value)


def field_at(model: Any, dotted: str) -> Any:
    """The value at ``dotted`` (``cpu.memcpy_gb_per_s``) inside ``model``; None when absent."""
    node = model
    for key in dotted.split("."):
        node = node.get(key) if isinstance(node, dict) else getattr(node, key, None)
        if node is None:
            return None
    return node


def check_assumed(model: Any, assumed: dict[str, AssumedRange]) -> None:
    """Each key names a number (or, with ``scale``, a curve) of ``model`` and a ``range`` holds it."""
    for path, r in assumed.items():
        value = field_at(model, path)
        if isinstance(value, list) and r.scale is not None:
            continue
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"assumed.{path}: not a number of this file"
                             + (" (a curve takes scale, not range)" if isinstance(value, list) else ""))
        if r.range is not None and not r.range[0] <= value <= r.range[1]:
            raise ValueError(f"assumed.{path}: range {list(r.range)} does not hold the value {value}")
