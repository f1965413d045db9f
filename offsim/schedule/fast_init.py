"""A faster ``__init__`` for the schedule's frozen, slotted dataclasses (issue 16).

The ``__init__`` that ``dataclasses`` generates for a frozen class sets each field with
``object.__setattr__(self, name, value)`` (its own ``__setattr__`` refuses), a name lookup and a
generic call per field (``dataclasses.py::_field_assign`` with ``frozen=True``). A slotted class
has a member descriptor per field; calling its ``__set__`` directly does the same store without
the lookup. :func:`fast_init` replaces the generated ``__init__`` by one that does that, with the
same parameters, defaults and values (``init=False`` fields take their default). Compiling one
GPT-3 175B schedule builds ~13,600 :class:`~offsim.schedule.ops.Op` s, ~9,000 tags and ~13,000
bodies and tensor names, and its run ~12,000 :class:`~offsim.trace.Span` s and ~5,600 level
samples (an ``Op`` 2.9 -> 1.8 us on this machine); ``tests/test_engine_speed_init.py`` checks
every class of the schedule given it against the dataclass's own ``__init__``, and
``tests/test_engine_speed.py`` the records'.
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

C = TypeVar("C", bound=type)


def fast_init(cls: C) -> C:
    """``cls`` (a frozen dataclass with slots and no ``__post_init__``, no default factory) with
    its ``__init__`` setting the slots through their descriptors; returns ``cls``."""
    if not (dataclasses.is_dataclass(cls) and "__slots__" in cls.__dict__) or hasattr(cls, "__post_init__"):
        raise TypeError(f"fast_init: {cls.__qualname__} is not a slotted dataclass without __post_init__")
    namespace: dict[str, Any] = {}
    args, body = ["self"], []
    for k, f in enumerate(dataclasses.fields(cls)):
        if f.default_factory is not dataclasses.MISSING:
            raise TypeError(f"fast_init: {cls.__qualname__}.{f.name} has a default factory")
        namespace[f"_set{k}"] = getattr(cls, f.name).__set__
        if f.default is not dataclasses.MISSING:
            namespace[f"_default{k}"] = f.default
        if not f.init:
            body.append(f"_set{k}(self, _default{k})")
            continue
        args.append(f.name if f.default is dataclasses.MISSING else f"{f.name}=_default{k}")
        body.append(f"_set{k}(self, {f.name})")
    source = f"def __init__({', '.join(args)}):\n    " + "\n    ".join(body or ["pass"]) + "\n"
    exec(compile(source, f"<fast_init {cls.__qualname__}>", "exec"), namespace)  # the source: its own fields
    init = namespace["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__doc__, init.__annotations__ = cls.__init__.__doc__, dict(cls.__init__.__annotations__)
    cls.__init__ = init  # type: ignore[method-assign]
    return cls
