"""Strict JSON text (RFC 8259): what offsim writes is always parsed by any JSON reader.

Python's :func:`json.dumps` writes ``NaN``, ``Infinity`` and ``-Infinity`` by default, which
strict parsers (JavaScript's ``JSON.parse``, ``jq``, Go, Rust) refuse. Here a non-finite
number becomes ``null`` and the text is always dumped with ``allow_nan=False``, so a value that
slips past the conversion raises instead of writing invalid JSON.
"""

from __future__ import annotations

import json
import math
from typing import Any


def finite(obj: Any) -> Any:
    """``obj`` with every non-finite float (NaN, +-inf) replaced by ``None`` (JSON ``null``).

    Dicts, lists and tuples are copied; numpy scalars and arrays become Python numbers and lists.
    """
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [finite(v) for v in obj]
    if hasattr(obj, "tolist") and not isinstance(obj, str | bytes):  # numpy scalars and arrays
        return finite(obj.tolist())
    return obj


def _default(obj: Any) -> Any:
    """What :func:`json.dumps` cannot encode itself: numpy scalars and arrays, else the text."""
    if hasattr(obj, "tolist"):  # numpy arrays and scalars
        return obj.tolist()
    return str(obj)


def dumps(obj: Any, *, indent: int | None = None, separators: tuple[str, str] | None = None) -> str:
    """``obj`` as strict JSON text; non-finite numbers are written as ``null``.

    The common case (nothing to replace) is dumped as it is; only when a non-finite number is
    met is the object copied through :func:`finite` and dumped again.
    """
    try:
        return json.dumps(obj, indent=indent, separators=separators, allow_nan=False, default=_default)
    except ValueError as exc:
        if "Out of range float" not in str(exc):
            raise
    return json.dumps(finite(obj), indent=indent, separators=separators, allow_nan=False, default=_default)
