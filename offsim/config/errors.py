"""Turning a Pydantic :class:`~pydantic.ValidationError` into offsim's one-line-per-problem message.

Kept apart from :mod:`offsim.config.loading` so that the loaders and the Hugging Face reader
(:mod:`offsim.config.hf`) can both use it without importing each other.
"""

from __future__ import annotations

from pydantic import ValidationError


def format_validation_error(source: str, exc: ValidationError) -> str:
    """One readable message per problem: ``file: field.path: what was expected``."""
    lines = []
    for err in exc.errors():
        loc = ".".join(str(x) for x in err["loc"]) or "(top level)"
        msg = err["msg"]
        if err["type"] == "missing":
            msg = "required field is missing"
        elif "input" in err and err["type"] not in ("extra_forbidden",):
            msg = f"{msg} (got {err['input']!r})"
        if err["type"] == "extra_forbidden":
            msg = "unknown field (misspelt?)"
        lines.append(f"{source}: {loc}: {msg}")
    return "\n".join(lines)
