"""YAML configs as dataclasses: load, apply `a.b.c=value` overrides, validate with one clear error.

A wrong field name or a value of the wrong type raises ConfigError naming the dotted path, e.g.
`learner.lr: expected float, got 'fast'` or `rollout.max_lagg: unknown field (did you mean max_lag?)`.

Renamed fields: a dataclass lists its old field names in ``RENAMED_FIELDS`` (a class attribute,
``{old name: new dotted path from that class}``, e.g. ``{"num_slots": "max_running"}`` or a whole section
``{"placement": "actors"}``). A config (file or override) that uses an old name still loads for one release:
the value moves to the new name, with a one-line deprecation warning naming it (``rename_fields``); giving
both the old and the new name is an error.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import types
import typing
from pathlib import Path
from typing import Any, TypeVar, Union

import yaml

from rz_agents.deprecation import warn_deprecated

T = TypeVar("T")


class ConfigError(ValueError):
    """A config that does not match its dataclass schema."""


# A number in exponent notation without a dot (3e-4, 1E5): YAML 1.1 (PyYAML) reads it as a string.
_YAML11_MISSED_FLOAT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+")


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _convert(value: Any, tp: Any, path: str) -> Any:
    """Check/convert one value against a type hint; raise ConfigError naming `path`."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any:
        return value
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _convert(value, arg, path)
            except ConfigError:
                continue
        raise ConfigError(f"{path}: expected {' or '.join(_type_name(a) for a in args)}, got {value!r}")
    if origin is typing.Literal:
        if value not in args:
            raise ConfigError(f"{path}: expected one of {list(args)}, got {value!r}")
        return value
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if not isinstance(value, dict):
            raise ConfigError(f"{path}: expected a mapping for {tp.__name__}, got {value!r}")
        return from_dict(tp, value, path)
    if origin in (list, tuple) or tp in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{path}: expected a list, got {value!r}")
        item = args[0] if args else Any
        items = [_convert(v, item, f"{path}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if (origin is tuple or tp is tuple) else items
    if origin is dict or tp is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{path}: expected a mapping, got {value!r}")
        if len(args) == 2:
            return {k: _convert(v, args[1], f"{path}.{k}") for k, v in value.items()}
        return dict(value)
    if tp is float:
        if isinstance(value, str) and _YAML11_MISSED_FLOAT.fullmatch(value.strip()):
            return float(value)  # YAML 1.1 reads 3e-4 (no dot) as a string; it is the float users wrote
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{path}: expected float, got {value!r}")
        return float(value)
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{path}: expected int, got {value!r}")
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{path}: expected true/false, got {value!r}")
        return value
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{path}: expected a string, got {value!r}")
        return value
    return value


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _rename_here(cls: type, data: dict[str, Any], path: str) -> dict[str, Any]:
    """``data`` (a mapping for dataclass ``cls`` at ``path``) with the old names of ``cls.RENAMED_FIELDS``
    moved to their new paths (a copy; each move warned once)."""
    renamed: dict[str, str] = getattr(cls, "RENAMED_FIELDS", {})
    if not any(old in data for old in renamed):
        return data
    data = dict(data)
    for old, new in renamed.items():
        if old not in data:
            continue
        value = data.pop(old)
        *parents, last = new.split(".")
        node = data
        for part in parents:  # (copies along the way: the caller's mapping is not changed)
            child = node.get(part, {})
            if not isinstance(child, dict):
                raise ConfigError(
                    f"{_join(path, part)}: expected a mapping for the renamed {_join(path, old)}"
                )
            node[part] = node = dict(child)
        if last in node:
            raise ConfigError(
                f"{_join(path, old)}: renamed to {_join(path, new)}, which is set too; "
                f"keep only {_join(path, new)}"
            )
        node[last] = value
        warn_deprecated(
            f"config key {_join(path, old)} is renamed {_join(path, new)}; the old name is accepted for one "
            f"release",
            stacklevel=5,
        )
    return data


def _dataclass_in(tp: Any) -> type | None:
    """The dataclass a field of type ``tp`` holds (``X`` or ``X | None``), else None."""
    if dataclasses.is_dataclass(tp):
        return tp
    if typing.get_origin(tp) in (Union, types.UnionType):
        found = [a for a in typing.get_args(tp) if dataclasses.is_dataclass(a)]
        return found[0] if len(found) == 1 else None
    return None


def rename_fields(cls: type, data: dict[str, Any], path: str = "") -> dict[str, Any]:
    """A copy of the raw config mapping ``data`` (for dataclass ``cls``) with every old field name, at any
    depth, moved to its new one (see the module docstring); used where raw configs are compared (a resume
    against the run's config.yaml), so that old and new spellings of one config agree."""
    data = _rename_here(cls, data, path)
    hints = typing.get_type_hints(cls)
    out = {}
    for key, value in data.items():
        inner = _dataclass_in(hints.get(key, None))
        out[key] = (
            rename_fields(inner, value, _join(path, key)) if inner and isinstance(value, dict) else value
        )
    return out


def from_dict(cls: type[T], data: dict[str, Any], path: str = "") -> T:
    """Build dataclass `cls` from a nested dict, checking every field name and type (old names of renamed
    fields are accepted with a deprecation warning)."""
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls) if f.init}
    data = _rename_here(cls, data, path)
    kwargs = {}
    for key, value in data.items():
        where = f"{path}.{key}" if path else str(key)
        if key not in names:
            close = difflib.get_close_matches(str(key), sorted(names), n=1)
            hint = f" (did you mean {close[0]}?)" if close else f" (fields: {', '.join(sorted(names))})"
            raise ConfigError(f"{where}: unknown field{hint}")
        kwargs[key] = _convert(value, hints[key], where)
    try:
        obj = cls(**kwargs)
    except ConfigError:
        raise
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{path or cls.__name__}: {exc}") from None
    return obj


def to_dict(obj: Any) -> Any:
    """Dataclass tree -> plain dict (for writing the run's config copy)."""
    if dataclasses.is_dataclass(obj):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [to_dict(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_dict(v) for k, v in obj.items()}
    return obj


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply `a.b.c=value` strings (value parsed as YAML) to a nested dict, in place."""
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r}: expected key.path=value")
        key, _, raw = item.partition("=")
        node = data
        parts = key.strip().split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {item!r}: {part} is not a mapping")
        node[parts[-1]] = yaml.safe_load(raw)
    return data


def _renamed_key(cls: type, key: str) -> str:
    """The dotted override key ``key`` for dataclass ``cls`` with each old field name on its way replaced by
    the new path (warned like a renamed field in a file)."""
    parts, done, node = key.strip().split("."), [], cls
    while parts:
        part = parts.pop(0)
        new = getattr(node, "RENAMED_FIELDS", {}).get(part) if node is not None else None
        if new is not None:
            here = ".".join(done)
            warn_deprecated(
                f"config key {_join(here, part)} is renamed {_join(here, new)}; the old name is accepted for "
                "one release",
                stacklevel=5,
            )
            *parents, part = new.split(".")
            for parent in parents:
                done.append(parent)
                node = _dataclass_in(typing.get_type_hints(node).get(parent)) if node is not None else None
        done.append(part)
        node = _dataclass_in(typing.get_type_hints(node).get(part)) if node is not None else None
    return ".".join(done)


def override_config(cls: type, data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """The raw config ``data`` for dataclass ``cls`` under its current field names, with ``overrides``
    (``a.b=v``) applied: an override with an old name sets the field's new name (so a config file with the
    new names and an old command line agree; of two overrides of one field the later wins, as always)."""
    data = rename_fields(cls, data)
    for item in overrides:
        key, sep, raw = item.partition("=")
        apply_overrides(data, [f"{_renamed_key(cls, key)}{sep}{raw}" if sep else item])
    return data


def read_yaml_mapping(path: str | Path) -> dict[str, Any]:
    """The top-level mapping of a YAML file; ConfigError if missing, invalid, or not a mapping."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"{path}: no such config file")
    try:
        data = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: top level must be a mapping")
    return data


DATA_SUFFIXES = (".jsonl", ".json", ".parquet", ".csv", ".txt")


def paths_beside(value: Any, base: Path) -> Any:
    """``value`` (a YAML config as plain data) with each relative data-file path that does not exist from
    the working directory but does beside the YAML file (under ``base``) made absolute: a config and the
    files it names travel together (a packaged config's demos, a config copied with its data), from any
    working directory. A path that exists from the working directory keeps its meaning."""
    if isinstance(value, dict):
        return {k: paths_beside(v, base) for k, v in value.items()}
    if isinstance(value, list):
        return [paths_beside(v, base) for v in value]
    if isinstance(value, str) and value.endswith(DATA_SUFFIXES) and not Path(value).is_absolute():
        if "://" not in value and not Path(value).exists() and (base / value).is_file():
            return str((base / value).resolve())
    return value


def load_config(
    cls: type[T], path: str | Path | None, overrides: list[str] | None = None, validate: bool = True
) -> T:
    """Load YAML at `path` (or defaults when None), apply overrides, return a `cls` (validated unless
    ``validate`` is False: types and field names are checked either way)."""
    data: dict[str, Any] = read_yaml_mapping(path) if path is not None else {}
    if path is not None:
        data = paths_beside(data, Path(path).parent)
    obj = from_dict(cls, override_config(cls, data, overrides or []))
    check = getattr(obj, "validate", None)
    if validate and callable(check):
        try:
            check()
        except ConfigError:
            raise
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    return obj
