"""Shared Pydantic base for every input model: frozen, strict, unknown fields refused."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class Frozen(BaseModel):
    """Base of all offsim input models.

    ``strict=True`` refuses a string or a bool where a number is expected; ``extra='forbid'``
    turns a misspelt field into an error instead of a silently ignored key;
    ``allow_inf_nan=False`` refuses ``.inf`` and ``.nan`` in every float field of every schema
    (bandwidths, latencies, capacities, efficiencies, rates, curve points), so no non-finite
    number reaches the engine or the JSON it writes.

    ``defer_build=True`` builds a model's validator when it first validates, not when its class is
    defined (issue 16: ``offsim run`` defines 47 input models, and built each at import; 32 of
    them never validate on their own there: the policies its strategy does not name, and a
    profile's or workload's parts, which their parent's validator covers). Fields, errors and JSON
    Schemas are the same.
    """

    model_config = ConfigDict(frozen=True, strict=True, extra="forbid", allow_inf_nan=False, defer_build=True)


class Provenance(Frozen):
    """Where the numbers of a data file come from.

    Attributes:
        kind: ``datasheet`` (vendor figures), ``paper`` (a publication's testbed),
            ``measured`` (taken by ``offsim calibrate`` or another tool on a real machine),
            ``derived`` (arithmetic on cited numbers), or ``synthetic`` (round test numbers).
        source: citations, one per figure where they differ.
        date: when the numbers were gathered (ISO date).
        tool: the tool and version that measured them, when measured.
        host: the machine measured, when measured.
        notes: anything a reader must know (assumptions, conflicts between sources).
    """

    kind: Literal["datasheet", "paper", "measured", "derived", "synthetic", "mixed"]
    source: str = Field(min_length=1)
    date: str = Field(min_length=4)
    tool: str | None = None
    host: str | None = None
    notes: str | None = None
