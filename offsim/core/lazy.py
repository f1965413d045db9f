"""Package names imported on first use (PEP 562 module ``__getattr__``/``__dir__``), so importing a
package's submodule does not import everything the package exports (issue 16: start-up)."""

from __future__ import annotations

from collections.abc import Callable
from importlib import import_module
from typing import Any


def lazy_names(package: str, homes: dict[str, str],
               namespace: dict[str, Any]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of ``package`` whose public names live in the modules
    ``homes`` gives (name -> module); a name is imported on first use, then kept in ``namespace``
    (the package's ``globals()``)."""

    def getattr_(name: str) -> Any:
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(import_module(home), name)
        namespace[name] = value
        return value

    def dir_() -> list[str]:
        return sorted({*namespace, *homes})

    return getattr_, dir_
