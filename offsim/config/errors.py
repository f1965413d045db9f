"""Turning a Pydantic :class:`~pydantic.ValidationError` into offsim's one-line-per-problem message.

Kept apart from :mod:`offsim.config.loading` so that the loaders and the Hugging Face reader
(:mod:`offsim.config.hf`) can both use it without importing each other.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

#: Pydantic error types meaning "a mapping of fields was expected here".
_MAPPING_EXPECTED = {"model_type", "dict_type", "model_attributes_type"}


def format_validation_error(source: str, exc: ValidationError) -> str:
    """One readable message per problem: ``file: field.path: what was expected``."""
    return "\n".join(_line(source, err) for err in exc.errors())


def _line(source: str, err: Any) -> str:
    """The message of one Pydantic error."""
    loc = ".".join(str(x) for x in err["loc"]) or "(top level)"
    msg = err["msg"]
    if err["type"] == "missing":
        msg = "required field is missing"
    elif err["type"] == "extra_forbidden":
        msg = "unknown field (misspelt?)"
    elif "input" in err:
        msg = f"{msg} (got {err['input']!r})"
    hint = _mapping_hint(err)
    return f"{source}: {loc}: {msg}{'; ' + hint if hint else ''}"


def _mapping_hint(err: Any) -> str | None:
    """The accepted form when a bare word stands where a mapping is expected (``policies: lru``)."""
    if err["type"] not in _MAPPING_EXPECTED or not isinstance(err.get("input"), str):
        return None
    loc = [str(x) for x in err["loc"] if not isinstance(x, int)]
    word = err["input"]
    if loc and loc[-1] == "policies":
        from offsim.config.strategy import Policies  # lazily: the strategy schema imports the policies

        return (f"policies is a mapping of slots, each a mapping with a kind, e.g. "
                f"'policies: {{eviction: {{kind: {word}}}}}' (fields: {', '.join(Policies.model_fields)})")
    if len(loc) >= 2 and loc[-2] == "policies":
        return f"write it as '{loc[-1]}: {{kind: {word}}}' (a mapping with a kind)"
    return "expected a mapping of fields (key: value lines), not a single value"
