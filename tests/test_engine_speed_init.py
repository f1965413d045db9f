"""The schedule's dataclasses built by :func:`offsim.schedule.fast_init.fast_init`'s ``__init__``
are the objects the dataclass's own ``__init__`` builds (issue 16: the same signature, values,
equality, hash and frozenness), checked against a twin class the ``dataclasses`` module makes
from the same fields."""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

import pytest

from offsim.core.enums import Activity, CacheId, ChoiceId, Link, MechanismId, Phase, Res, TensorKind, Tier
from offsim.schedule import ops
from offsim.schedule.fast_init import fast_init

TENSOR = ops.TensorRef(TensorKind.PARAM16, 3)
TAG = ops.Tag(Activity.PARAM_FETCH, MechanismId.PARAM_FETCH, Phase.FORWARD, 3)

#: each class fast_init is applied to, with positional arguments (some leave defaults)
CASES: list[tuple[type, tuple[Any, ...]]] = [
    (ops.TensorRef, (TensorKind.PARAM16,)),
    (ops.TensorRef, (TensorKind.PARAM16, 3, 1, ops.CUR_MB)),
    (ops.Tag, (Activity.PARAM_FETCH, MechanismId.PARAM_FETCH, Phase.FORWARD)),
    (ops.Tag, (Activity.PARAM_FETCH, MechanismId.PARAM_FETCH, Phase.FORWARD, 3, 2, "params")),
    (ops.Delay, (0.25,)),
    (ops.Delay, (0.25, 1e12)),
    (ops.Flow, (4096, ((Res.H2D, 1.0),), 1e9, (Link.H2D,))),
    (ops.Flow, (4096, ((Res.H2D, 1.0),), 1e9, (Link.H2D,), True)),
    (ops.Alloc, (Tier.GPU, 1024, TENSOR)),
    (ops.Free, (Tier.GPU, TENSOR)),
    (ops.Acquire, ("staging", 2)),
    (ops.Release, ("staging", 2)),
    (ops.Access, (CacheId.GPU_PARAMS, 3)),
    (ops.Ready, (CacheId.GPU_PARAMS, 3)),
    (ops.Prefetch, (CacheId.GPU_PARAMS, (3, 4), 1 << 20)),
    (ops.Done, (CacheId.GPU_PARAMS, 3)),
    (ops.Flush, (CacheId.GPU_PARAMS,)),
    (ops.Join, ()),
    (ops.Choose, (ChoiceId.OPTIMIZER_SPLIT,)),
    (ops.Choose, (ChoiceId.OPTIMIZER_SPLIT, "order-1")),
    (ops.Wait, ("params",)),
    (ops.Wait, ("params", CacheId.GPU_PARAMS)),
    (ops.Op, (0, ops.Join(), TAG)),
    (ops.Op, (5, ops.Delay(0.5), TAG, "compute", (1, 2), (TENSOR,), (TENSOR,), ops.Wait("params"))),
]


def _twin(cls: type) -> type:
    """A frozen, slotted dataclass of ``cls``'s fields with the ``__init__`` the module makes."""
    specs = [(f.name, f.type, dataclasses.field(default=f.default, init=f.init)) for f in dataclasses.fields(cls)]
    return dataclasses.make_dataclass(cls.__name__, specs, frozen=True, slots=True)


def _values(obj: object) -> tuple[Any, ...]:
    return tuple(getattr(obj, f.name) for f in dataclasses.fields(obj))  # type: ignore[arg-type]


@pytest.mark.parametrize(("cls", "args"), CASES, ids=lambda x: getattr(x, "__name__", ""))
def test_fast_init_builds_what_the_dataclass_init_builds(cls: type, args: tuple[Any, ...]) -> None:
    twin = _twin(cls)
    assert cls.__init__.__qualname__ == f"{cls.__qualname__}.__init__"  # fast_init's, not the module's
    assert inspect.signature(cls.__init__) == inspect.signature(twin.__init__)
    made, reference = cls(*args), twin(*args)
    assert _values(made) == _values(reference)
    names = [f.name for f in dataclasses.fields(cls) if f.init]
    by_keyword = cls(**dict(zip(names, args, strict=False)))
    assert by_keyword == made and hash(by_keyword) == hash(made)
    assert dataclasses.replace(made) == made
    for f in dataclasses.fields(cls):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(made, f.name, None)


def test_every_class_given_fast_init_is_checked() -> None:
    """A class that gains fast_init gains a case here (the check above runs on each)."""
    fast = {c for c in vars(ops).values() if isinstance(c, type) and c.__module__ == ops.__name__
            and c.__init__.__code__.co_filename.startswith("<fast_init ")}
    assert fast == {cls for cls, _ in CASES}


def test_fast_init_refuses_what_it_cannot_copy() -> None:
    """A default factory, or a ``__post_init__``, would be skipped: refused."""
    @dataclasses.dataclass(frozen=True, slots=True)
    class WithFactory:
        xs: list[int] = dataclasses.field(default_factory=list)

    @dataclasses.dataclass(frozen=True, slots=True)
    class WithPostInit:
        x: int

        def __post_init__(self) -> None:
            pass

    for cls in (WithFactory, WithPostInit):
        with pytest.raises(TypeError, match="fast_init"):
            fast_init(cls)
