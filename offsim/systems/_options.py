"""A system's own options: the knobs of the mechanisms only its file adds.

A system file that adds a mechanism with knobs declares them as a pydantic model named
``Options`` (a :class:`~offsim.config.base.Frozen`, so a misspelt key is an error) and reads
them with :func:`read_options`. A strategy sets them under ``system_options:``::

    system: zenflow
    system_options: {topk_ratio: 0.1, update_interval: 4}

so a new system adds no field to the shared :class:`~offsim.config.strategy.Strategy` schema.
The registry checks them when the system is composed (:func:`offsim.systems._registry.check_options`).
"""

from __future__ import annotations

from types import ModuleType
from typing import TypeVar

from pydantic import BaseModel, ValidationError

from offsim.config.strategy import Strategy
from offsim.errors import ConfigError

OptionsModel = TypeVar("OptionsModel", bound=BaseModel)


def read_options(st: Strategy, model: type[OptionsModel]) -> OptionsModel:
    """``st.system_options`` as the system's ``model``; a :class:`ConfigError` naming the strategy,
    the system and the field when a value is wrong or a key unknown."""
    try:
        return model.model_validate(st.system_options)
    except ValidationError as e:
        problems = "; ".join(f"{'.'.join(str(p) for p in err['loc']) or '(whole)'}: {err['msg']}"
                             for err in e.errors())
        known = ", ".join(model.model_fields) or "none"
        raise ConfigError(f"strategy '{st.name}': system_options of system '{st.system}': {problems} "
                          f"(its options: {known})") from None


def check_system_options(st: Strategy, module: ModuleType) -> None:
    """Refuse ``system_options`` the system's module does not declare (no ``Options``: none)."""
    model = getattr(module, "Options", None)
    if model is not None:
        read_options(st, model)
    elif st.system_options:
        raise ConfigError(f"strategy '{st.name}': system '{st.system}' has no options of its own, but "
                          f"system_options sets {', '.join(sorted(st.system_options))}; remove system_options")
