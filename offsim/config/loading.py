"""Load profiles, workloads and strategies by shipped name or by path.

A *name* is a file stem under the shipped data folders (``hardware_profiles/``, ``workloads/``,
``strategies/``; searched recursively, so ``measured/<name>`` works too); anything that looks like
a path (has a suffix or a separator, or exists) is read as a file. Errors name the file, the
field and what was expected, and are :class:`~offsim.errors.ConfigError`.
"""

from __future__ import annotations

import contextlib
import json
import re
from functools import cache
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from offsim.config.errors import format_validation_error
from offsim.config.hardware import HardwareProfile
from offsim.config.reading import Reading
from offsim.config.strategy import Strategy
from offsim.config.workload import Workload
from offsim.errors import ConfigError

__all__ = [
    "format_validation_error",  # re-exported: it lives in offsim.config.errors
    "load_profile",
    "load_strategy",
    "load_workload",
    "read_strategy",
    "read_yaml",
    "resolve_path",
    "shipped_files",
    "validate_data",
]

M = TypeVar("M", bound=BaseModel)

KIND_DIRS = {"hardware": "hardware_profiles", "workload": "workloads", "strategy": "strategies"}


#: Largest data file read, bytes (a profile or a sweep spec is a few KiB).
MAX_FILE_BYTES = 8 * 2**20
#: Most nodes a YAML document may expand to once its aliases are followed ("billion laughs").
MAX_EXPANDED_NODES = 200_000


def _refuse_duplicate_keys(loader: Any, node: yaml.MappingNode) -> None:
    """Raise on the same key twice in ``node``, naming its line (merge keys ``<<`` aside)."""
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue
        key = loader.construct_object(key_node, deep=True)
        if isinstance(key, list | dict):
            continue  # unhashable: left to the schema to refuse
        line = key_node.start_mark.line + 1
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key '{key}' (first on line {seen[key]})",
                key_node.start_mark)
        seen[key] = line


class _Constructor(yaml.constructor.SafeConstructor):
    """PyYAML's safe constructor, refusing duplicate keys."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        """A mapping; the same key twice is an error naming its line (merge keys ``<<`` aside)."""
        _refuse_duplicate_keys(self, node)
        return super().construct_mapping(node, deep=deep)


class _Resolver(yaml.resolver.Resolver):
    """PyYAML's resolver, reading ``1e9`` as a float (YAML 1.2)."""


_Resolver.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(
        r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
        |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
        |\.[0-9_]+(?:[eE][-+][0-9]+)?
        |[-+]?\.(?:inf|Inf|INF)
        |\.(?:nan|NaN|NAN))$""",
        re.X,
    ),
    list("-+0123456789."),
)


class _Loader(yaml.reader.Reader, yaml.scanner.Scanner, yaml.parser.Parser, yaml.composer.Composer,
              _Constructor, _Resolver):
    """``yaml.SafeLoader`` (the same parts, in Python) that reads ``1e9`` as a float (YAML 1.2) and
    refuses duplicate keys."""

    def __init__(self, stream: str) -> None:
        yaml.reader.Reader.__init__(self, stream)
        yaml.scanner.Scanner.__init__(self)
        yaml.parser.Parser.__init__(self)
        yaml.composer.Composer.__init__(self)
        _Constructor.__init__(self)
        _Resolver.__init__(self)


#: Deepest nesting the libyaml path composes; a deeper document is read by :class:`_Loader` alone,
#: whose recursion limit decides it as it always did (the shipped files nest at most 6 deep).
LIBYAML_MAX_DEPTH = 64


class _TooDeepError(Exception):
    """A document nested past :data:`LIBYAML_MAX_DEPTH` (left to :class:`_Loader`)."""


@cache
def _libyaml_loader() -> type | None:
    """:class:`_Loader` with libyaml's scanner and parser (PyYAML's ``CParser``), or None where
    PyYAML was built without libyaml.

    Only the events come from C: the nodes are composed by PyYAML's Python ``Composer`` and
    built by :class:`_Loader`'s own constructor and resolver, so a file gives the same values
    (issue 16: the three files of ``offsim run`` took ~8 ms to parse in Python,
    ~1 ms so). Not ``yaml.CSafeLoader`` itself: its C composer recurses without a limit, and a file
    nested 100,000 deep crashes the process where :class:`_Loader` reports a RecursionError.
    """
    if not yaml.__with_libyaml__:
        return None
    from yaml.cyaml import CParser

    class _LibyamlLoader(yaml.composer.Composer, CParser, _Constructor, _Resolver):  # type: ignore[misc]
        def __init__(self, stream: str) -> None:
            CParser.__init__(self, stream)
            yaml.composer.Composer.__init__(self)
            _Constructor.__init__(self)
            _Resolver.__init__(self)
            self.depth = 0

        def compose_node(self, parent: Any, index: Any) -> Any:
            self.depth += 1
            if self.depth > LIBYAML_MAX_DEPTH:
                raise _TooDeepError
            try:
                return super().compose_node(parent, index)
            finally:
                self.depth -= 1

    return _LibyamlLoader


def _compose(text: str) -> tuple[Any, yaml.Node | None]:
    """A loader and the node tree of ``text``'s one document.

    libyaml's parser (:func:`_libyaml_loader`) where it is sure to read the text as PyYAML's does;
    else, and on any problem, :class:`_Loader`, which raises the error it always raised. Left to
    :class:`_Loader`: a text with a tab (libyaml accepts tabs as separators where PyYAML refuses
    them, e.g. ``a:<tab>1``), a document nested past :data:`LIBYAML_MAX_DEPTH`, anything libyaml
    refuses (PyYAML's message is kept).
    """
    fast = _libyaml_loader()
    if fast is not None and "\t" not in text:
        with contextlib.suppress(Exception):  # any problem: PyYAML's own parser reports it below
            loader = fast(text)
            return loader, loader.get_single_node()
    loader = _Loader(text)
    try:
        return loader, loader.get_single_node()
    except BaseException:
        loader.dispose()
        raise


def _expanded_size(node: yaml.Node, memo: dict[int, int]) -> int:
    """Nodes in ``node`` once every alias is expanded (memoised, so linear in the graph)."""
    known = memo.get(id(node))
    if known is not None:
        return known
    memo[id(node)] = 1  # a recursive alias counts once instead of looping
    if isinstance(node, yaml.SequenceNode):
        size = 1 + sum(_expanded_size(child, memo) for child in node.value)
    elif isinstance(node, yaml.MappingNode):
        size = 1 + sum(_expanded_size(k, memo) + _expanded_size(v, memo) for k, v in node.value)
    else:
        size = 1
    memo[id(node)] = min(size, MAX_EXPANDED_NODES + 1)
    return memo[id(node)]


def _parse_yaml(text: str, path: Path) -> Any:
    """One YAML document, refused when its aliases expand past :data:`MAX_EXPANDED_NODES`."""
    loader, node = _compose(text)
    try:
        if node is None:
            return None
        if _expanded_size(node, {}) > MAX_EXPANDED_NODES:
            raise ConfigError(
                f"{path}: refused: its aliases (*name) expand to more than {MAX_EXPANDED_NODES:,} "
                "values (a YAML alias bomb?); write the values out or use fewer aliases")
        return loader.construct_document(node)
    finally:
        loader.dispose()


def _json_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object; the same key twice is an error."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key '{key}'")
        out[key] = value
    return out


def _read_text(path: Path) -> str:
    """The file's text; a folder, a binary file or an oversized one is a :class:`ConfigError`."""
    if path.is_dir():
        raise ConfigError(f"{path}: is a folder, not a YAML/JSON file")
    try:
        with path.open("rb") as fh:
            raw = fh.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read ({exc.strerror})") from exc
    if len(raw) > MAX_FILE_BYTES:
        raise ConfigError(f"{path}: larger than {MAX_FILE_BYTES // 2**20} MiB; not a data file offsim reads")
    if b"\0" in raw[:8192]:
        raise ConfigError(f"{path}: a binary file, not YAML/JSON text")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte {exc.start}); is it a binary file?") from None


def data_roots() -> list[Path]:
    """Folders that hold the shipped data: the installed copy, then a source checkout."""
    here = Path(__file__).resolve().parent.parent
    return [here / "_data", here.parent]


def data_dir(kind: str) -> Path:
    """The shipped folder for ``kind`` (``hardware``, ``workload`` or ``strategy``)."""
    sub = KIND_DIRS[kind]
    for root in data_roots():
        if (root / sub).is_dir():
            return root / sub
    raise ConfigError(f"shipped {sub}/ folder not found (looked in {[str(r) for r in data_roots()]})")


def shipped_files(kind: str) -> dict[str, Path]:
    """Shipped files of ``kind`` by name (file stem)."""
    base = data_dir(kind)
    return {p.stem: p for p in sorted(base.rglob("*.yaml"))}


def _yaml_problem(exc: yaml.MarkedYAMLError) -> str:
    """A YAML error on one line: ``line N, column M: problem (context)``."""
    mark = exc.problem_mark or exc.context_mark
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    context = f" ({exc.context})" if exc.context and exc.problem else ""
    return f"{where}{exc.problem or exc.context}{context}"


def read_yaml(path: Path) -> Any:
    """Parse a YAML or JSON data file; any problem is a :class:`ConfigError` naming the file.

    Refused: binary or non-UTF-8 files, files over :data:`MAX_FILE_BYTES`, duplicate keys, and
    YAML whose aliases expand past :data:`MAX_EXPANDED_NODES` values.
    """
    text = _read_text(path)
    try:
        if path.suffix == ".json":
            return json.loads(text, object_pairs_hook=_json_pairs)
        return _parse_yaml(text, path)
    except yaml.MarkedYAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {_yaml_problem(exc)}") from None
    except (yaml.YAMLError, ValueError) as exc:  # JSONDecodeError is a ValueError
        raise ConfigError(f"{path}: not valid YAML/JSON: {exc}") from None
    except RecursionError:
        raise ConfigError(f"{path}: nested too deeply to be a data file") from None


def validate_data(model: type[M], data: Any, source: str) -> M:
    """Validate ``data`` into ``model``; errors become a :class:`ConfigError` naming ``source``."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping of fields, got {type(data).__name__}")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(source, exc)) from None


def resolve_path(kind: str, name_or_path: str | Path) -> Path:
    """The file a name or path refers to."""
    text = str(name_or_path)
    p = Path(text)
    if p.suffix in (".yaml", ".yml", ".json") or "/" in text or p.exists():
        if not p.exists():
            raise ConfigError(f"{text}: no such file")
        return p
    files = shipped_files(kind)
    if text not in files:
        raise ConfigError(
            f"unknown {kind} '{text}'. Shipped: {', '.join(sorted(files))} (or give a path to a YAML file)"
        )
    return files[text]


def _load(kind: str, model: type[M], name_or_path: str | Path) -> M:
    path = resolve_path(kind, name_or_path)
    return _from_data(kind, model, path, read_yaml(path))


def _from_data(kind: str, model: type[M], path: Path, data: Any) -> M:
    """Validate the parsed file ``data`` of ``path`` as ``model``."""
    if kind == "workload" and path.suffix == ".json" and isinstance(data, dict) and "name" not in data:
        from offsim.config.hf import workload_from_hf_config

        return workload_from_hf_config(data, path)  # type: ignore[return-value]
    obj = validate_data(model, data, str(path))
    if path.stem != getattr(obj, "name", path.stem) and path.parent.resolve() == data_dir(kind).resolve():
        raise ConfigError(f"{path}: name: '{obj.name}' must equal the file stem '{path.stem}'")  # type: ignore[attr-defined]
    return obj


@cache
def load_profile(name_or_path: str | Path) -> HardwareProfile:
    """Load a hardware profile by shipped name or path."""
    return _load("hardware", HardwareProfile, name_or_path)


@cache
def load_workload(name_or_path: str | Path) -> Workload:
    """Load a workload by shipped name or path (a Hugging Face ``config.json`` works too)."""
    return _load("workload", Workload, name_or_path)


@cache
def load_strategy(name_or_path: str | Path) -> Strategy:
    """Load a strategy by shipped name or path.

    A DeepSpeed ds_config, an Accelerate config or a Megatron-Core option file works too
    (:func:`read_strategy`); read without a workload, an ``"auto"`` that needs the model is an
    error saying so, and batch keys apply only through :func:`~offsim.config.run.make_run_config`.
    """
    return read_strategy(name_or_path).strategy


def strategy_format(data: Any) -> str:
    """Which kind of strategy file ``data`` is: ``offsim``, ``ds_config``, ``accelerate`` or
    ``megatron`` (a mapping of Megatron-Core options, or their command-line text)."""
    if isinstance(data, dict) and "schema_version" in data:
        # an offsim file: every reader's test refuses a mapping with ``schema_version``, and
        # importing the three readers cost ~10 ms of every start-up (issue 16)
        return "offsim"
    from offsim.config.accelerate import is_accelerate_config
    from offsim.config.ds_config import is_ds_config
    from offsim.config.megatron import is_megatron_options

    if is_megatron_options(data):  # first: a Megatron mapping may hold bf16/fp16, as a ds_config does
        return "megatron"
    if is_ds_config(data):
        return "ds_config"
    if is_accelerate_config(data):
        return "accelerate"
    return "offsim"


def read_strategy(name_or_path: str | Path, workload: Workload | None = None) -> Reading:
    """Read a strategy file of any format offsim accepts, with what it understood.

    ``workload``, when known, resolves the Hugging Face ``"auto"`` values that need the model
    (the hidden size) and checks the batch keys against its data-parallel size; without it such
    an ``"auto"`` is an error naming what is missing.
    """
    path = resolve_path("strategy", name_or_path)
    data = read_yaml(path)
    fmt = strategy_format(data)
    if fmt == "offsim":
        return Reading(source=str(path), fmt=fmt, strategy=_from_data("strategy", Strategy, path, data))
    if fmt == "ds_config":
        from offsim.config.ds_config import reading_from_ds_config

        return reading_from_ds_config(data, str(path), workload)
    if fmt == "accelerate":
        from offsim.config.accelerate import reading_from_accelerate

        return reading_from_accelerate(data, path, workload, read_yaml)
    from offsim.config.megatron import reading_from_megatron

    return reading_from_megatron(data, str(path), workload)
