"""Compose once per distinct composition input: a sweep's points that differ only in hardware
numbers the composition never reads share one composition (issue 16).

A point's composition (:func:`offsim.simulation.compose_run`: the state sizes, the measurement
window fit and the system's mechanisms) is a pure function of its configuration. A sweep varies
hardware numbers that some compositions never read (in the 7B grid of
``benchmarks/sweep_throughput.py``, the DRAM size: its compositions read the PCIe curves, the
NVMe drives and the CPU's rates), so composing each point anew repeats work (at 74d2174, 3.3 of
a worker's 11.8 ms a point).

Which hardware numbers a composition reads is not guessed: it is recorded. The first point of a
kind is composed with its hardware profile wrapped so that every field read is noted (its dotted
path, e.g. ``gpu.hbm_bandwidth_gb_per_s``; a read of a whole sub-model, such as hashing it for a cache
or dumping it, notes that sub-model's whole value). The composition is kept under the values of
exactly those paths, beside the whole value of everything else in the configuration (workload,
strategy, iteration counts, notes). A later point whose configuration gives the same values on
those paths gives the same composition: the function is deterministic, so it reads the same paths
in the same order and computes the same things from them. A composition after which a traced
model is still held by anything (the composition itself, or a cache that would hand it to a
later reader, untraced) is never kept: CPython frees what nothing holds at once, so reference
counts tell.

What is handed out on a hit is the kept composition with the point's own configuration
(the kept fitted configuration with the point's hardware): the machine, capacities and prices
of the point are its own. ``tests/test_sweep_reuse.py`` checks every row of a sweep equal with and
without this memo.
"""

from __future__ import annotations

import copy
import dataclasses
import operator
import sys
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any

from pydantic import BaseModel

from offsim.config.hardware import HardwareProfile
from offsim.config.run import RunConfig
from offsim.engine.reuse import RunMemo
from offsim.simulation import Composed, compose_run

#: distinct compositions a memo keeps, those used last. A worker is dealt the points that differ
#: only in hardware axes together (:func:`offsim.sweep.execute._chunks`): in the 10,000-point 7B
#: grid of benchmarks/sweep_throughput.py, 180 points a group with 36 distinct compositions (the
#: DRAM size is the only axis its compositions do not read), 36 points apart
KEPT = 128
#: compiled schedules a memo keeps with their compositions (a 7B schedule is some 3,000 ops of
#: about 250 bytes: 64 of them some 50 MB)
SCHEDULES_KEPT = 64

#: attribute names that read a whole model's value (pydantic's own methods read ``__dict__``)
_WHOLE_NAMES = frozenset({"__dict__", "model_dump", "model_dump_json", "__getstate__", "__reduce__",
                          "__reduce_ex__", "model_fields_set", "__pydantic_fields_set__", "__pydantic_extra__",
                          "__pydantic_private__"})
_SCALARS = (bool, int, float, str, Enum, type(None))

#: ``id(traced object) -> (its dotted path, the reads of the composition being traced, its class's
#: field names, its traced sub-models by field name)``
_TRACED: dict[int, tuple[str, _Reads, frozenset[str], dict[str, BaseModel]]] = {}
_TRACED_LOCK = threading.Lock()  # one traced composition at a time per process (a Dask worker has threads)
_CLASSES: dict[type, type] = {}
#: the field names of each traced class
_FIELDS: dict[type, frozenset[str]] = {}


class _Reads:
    """The dotted paths a traced composition read: leaves (compared by value) and whole
    sub-models (compared by their dumped value)."""

    def __init__(self) -> None:
        self.leaves: dict[str, None] = {}  # ordered sets
        self.whole: dict[str, None] = {}
        self.children: dict[tuple[int, str], BaseModel] = {}  # kept alive while traced


def _traced_getattribute(self: BaseModel, name: str) -> Any:
    value = object.__getattribute__(self, name)
    info = _TRACED.get(id(self))
    if info is None:
        return value
    path, reads, fields, kids = info
    if name in fields:  # the dotted path made only here: most reads are methods and pydantic's own
        if isinstance(value, BaseModel):
            child = kids.get(name)
            return _child(self, name, value, path, reads, kids) if child is None else child
        where = f"{path}.{name}" if path else name
        if isinstance(value, _SCALARS):
            reads.leaves[where] = None
        else:  # a tuple or dict of numbers, or of models: compared whole
            reads.whole[where] = None
    elif name in _WHOLE_NAMES or name in object.__getattribute__(self, "__dict__"):
        reads.whole[path] = None  # a cached value kept beside the fields stands for all of them
    return value


def _child(parent: BaseModel, name: str, value: BaseModel, path: str, reads: _Reads,
           kids: dict[str, BaseModel]) -> BaseModel:
    """The traced copy of ``parent``'s sub-model ``name`` (one per parent and field: made at the
    first read, kept in ``kids``, the parent's, and in ``reads``)."""
    where = f"{path}.{name}" if path else name
    child = kids[name] = reads.children[(id(parent), name)] = _traced_copy(value)
    _trace(child, where, reads)
    return child


def _trace(model: BaseModel, path: str, reads: _Reads) -> None:
    """Note the reads of the traced ``model`` (at ``path``) in ``reads``."""
    _TRACED[id(model)] = (path, reads, _FIELDS[type(model)], {})


def _traced_class(cls: type) -> type:
    """``cls`` with its attribute reads noted (a subclass: ``isinstance`` checks still hold)."""
    traced = _CLASSES.get(cls)
    if traced is None:
        traced = type(cls.__name__, (cls,), {"__slots__": (), "__getattribute__": _traced_getattribute,
                                             "__module__": cls.__module__})
        _CLASSES[cls] = traced
        _FIELDS[traced] = frozenset(cls.model_fields)  # type: ignore[attr-defined]
    return traced


def _traced_copy(model: BaseModel) -> BaseModel:
    twin = copy.copy(model)
    object.__setattr__(twin, "__class__", _traced_class(type(model)))
    return twin


def _whole_value(model: Any) -> Any:
    """A hashable value of a sub-model or container read whole."""
    if isinstance(model, BaseModel):
        return (type(model).__name__, model.model_dump_json())
    if isinstance(model, tuple | list):
        return tuple(_whole_value(v) for v in model)
    if isinstance(model, dict):
        return tuple((k, _whole_value(v)) for k, v in model.items())
    return model


@dataclass(frozen=True)
class _Shape:
    """The hardware paths one kind of composition reads, as a getter of their values."""

    leaves: tuple[str, ...]
    whole: tuple[str, ...]

    def values(self, hw: HardwareProfile) -> tuple[Any, ...]:
        """The values of ``hw`` on these paths (raises AttributeError where a path is absent)."""
        leaf = _getter(self.leaves)(hw) if self.leaves else ()
        whole = tuple(_whole_value(v) for v in _getter(self.whole)(hw)) if self.whole else ()
        return (tuple(leaf), whole)


_GETTERS: dict[tuple[str, ...], Callable[[Any], tuple[Any, ...]]] = {}


def _getter(paths: tuple[str, ...]) -> Callable[[Any], tuple[Any, ...]]:
    got = _GETTERS.get(paths)
    if got is None:
        whole_root = "" in paths  # the profile itself read whole
        getter = operator.attrgetter(*(p or "__class__" for p in paths))
        one = len(paths) == 1

        def got(hw: Any) -> tuple[Any, ...]:
            v = getter(hw)
            vals = (v,) if one else tuple(v)
            if whole_root:
                vals = tuple(hw if p == "" else x for p, x in zip(paths, vals, strict=True))
            return vals

        _GETTERS[paths] = got
    return got


def _rest_key(cfg: RunConfig) -> tuple[Any, ...]:
    """Everything in ``cfg`` but its hardware, by value."""
    return (type(cfg.workload).__name__, cfg.workload.model_dump_json(),  # every field: none is excluded
            type(cfg.strategy).__name__, cfg.strategy.model_dump_json(),
            cfg.iterations, cfg.warmup_iterations, cfg.tail_iterations, cfg.notes)


class ComposeMemo:
    """Compositions by their inputs: per configuration-but-hardware, the shapes of hardware reads
    seen, each with its compositions by the values read. ``hits``/``misses`` count look-ups,
    ``unkept`` the compositions that held a hardware object and were not kept."""

    def __init__(self, kept: int = KEPT) -> None:
        self.kept = kept
        self.shapes: dict[tuple[Any, ...], list[_Shape]] = {}
        self.found: OrderedDict[tuple[Any, ...], Composed] = OrderedDict()
        self.hits = self.misses = self.unkept = 0
        self._lock = threading.Lock()
        #: ``id(system) -> (system, its schedule)``: a kept composition compiled once
        self.schedules: OrderedDict[int, tuple[Any, Any]] = OrderedDict()

    def compiled(self, point: Composed) -> Composed:
        """``point.compiled()``, the schedule kept with its composition when one was compiled before
        (a hit hands out the kept composition itself, so the schedule is found by identity)."""
        if point.schedule is not None:
            return point
        with self._lock:
            kept = self.schedules.get(id(point.system))
        if kept is not None and kept[0] is point.system:
            return dataclasses.replace(point, schedule=kept[1])
        point = point.compiled()
        with self._lock:
            self.schedules[id(point.system)] = (point.system, point.schedule)
            while len(self.schedules) > SCHEDULES_KEPT:
                self.schedules.popitem(last=False)
        return point

    def compose(self, cfg: RunConfig) -> Composed:
        """:func:`~offsim.simulation.compose_run` of ``cfg``, or the kept composition of an earlier
        configuration with the same inputs, given ``cfg``'s hardware."""
        rest = _rest_key(cfg)
        with self._lock:
            shapes = list(self.shapes.get(rest, ()))
        for shape in shapes:
            try:
                key = (rest, shape, shape.values(cfg.hardware))
                with self._lock:
                    kept = self.found.get(key)
                    if kept is not None:
                        self.found.move_to_end(key)
                        self.hits += 1
            except (AttributeError, TypeError):  # a path this profile lacks (no NVMe), a model where a number was
                continue
            if kept is not None:
                return dataclasses.replace(kept, cfg=kept.cfg.model_copy(update={"hardware": cfg.hardware}))
        with self._lock:
            self.misses += 1
        return self._compose_traced(cfg, rest)

    def _compose_traced(self, cfg: RunConfig, rest: tuple[Any, ...]) -> Composed:
        """Compose ``cfg`` with its hardware's reads noted; keep the composition under them unless
        a traced model outlived the composition (something kept it: the composition, or a cache
        that would hand it to a later reader untraced)."""
        reads = _Reads()
        twin = _traced_copy(cfg.hardware)
        reads.children[(0, "")] = twin
        with _TRACED_LOCK:
            _trace(twin, "", reads)
            try:
                point = compose_run(cfg.model_copy(update={"hardware": twin}))
            finally:
                _untrace(reads)
        del twin  # what holds a traced model now is the composition, a cache, or nothing
        point = dataclasses.replace(point, cfg=point.cfg.model_copy(update={"hardware": cfg.hardware}))
        if _outlived(reads):
            self.unkept += 1
            return point
        shape = _Shape(tuple(reads.leaves), tuple(reads.whole))
        key = (rest, shape, shape.values(cfg.hardware))
        with self._lock:
            known = self.shapes.setdefault(rest, [])
            if shape not in known:
                known.append(shape)
            self.found[key] = point
            while len(self.found) > self.kept:
                self.found.popitem(last=False)
        return point


#: the memo kept beside each run memo (:mod:`offsim.engine.reuse`): a pool worker's, a Dask
#: worker's, an inline sweep's; it goes when its run memo goes
_BY_RUNS: weakref.WeakKeyDictionary[RunMemo, ComposeMemo] = weakref.WeakKeyDictionary()


def memo_for(runs: RunMemo) -> ComposeMemo:
    """The compositions kept beside the run memo ``runs`` (made on first use)."""
    with _TRACED_LOCK:
        memo = _BY_RUNS.get(runs)
        if memo is None:
            memo = _BY_RUNS[runs] = ComposeMemo()
    return memo


#: references to a traced model when only :class:`_Reads` holds it: the dict's, the loop's
#: name and :func:`sys.getrefcount`'s argument
_ONLY_READS_HOLD = 3


def _untrace(reads: _Reads) -> None:
    """Stop noting reads of ``reads``' traced models (they stay held by ``reads`` alone)."""
    for traced in reads.children.values():
        _TRACED.pop(id(traced), None)


def _outlived(reads: _Reads) -> bool:
    """True when something besides ``reads`` still holds one of its traced models once the
    composition is done (reference counts: CPython frees what nothing holds at once)."""
    return any(sys.getrefcount(traced) > _ONLY_READS_HOLD for traced in reads.children.values())
