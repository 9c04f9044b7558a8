"""The config schema (workflow/schemas/config.schema.yaml): the single source of every key, its
default and the checks a value alone must pass, and `typed`, which builds a config section's
dataclass from it.

`config` validates and resolves whole configs (snakemake.utils.validate, then the checks that
need the model); the section dataclasses (attribution/config.py, sae/config.py, ...) take their
defaults from `schema_defaults` and are built by `typed`. Both sit on this module, which imports
nothing of circuitflow's but `errors`, so any module may use it without an import cycle.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

import yaml

from circuitflow.errors import ConfigError

SCHEMA_PATH = Path(__file__).resolve().parents[2] / "workflow" / "schemas" / "config.schema.yaml"
LAYER_FORMS = "must be 'all', an index, a list of indices or a range like '0-5'"
T = TypeVar("T")


@functools.cache
def _schema(path: Path) -> dict:
    """The schema as parsed, read once per process (shared: never edit it). libyaml's safe
    loader where PyYAML was built with it: the same dict in a tenth of the time (50 ms in pure
    Python, in every job and every Snakemake start)."""
    return yaml.load(path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def load_schema(schema_path: Path = SCHEMA_PATH) -> dict:
    """The schema as a dict of the caller's own (a copy: editing it changes nothing here)."""
    return copy.deepcopy(_schema(Path(schema_path)))


def schema_node(key: str, schema_path: Path = SCHEMA_PATH) -> dict:
    """The schema of config key `key` ("" for the whole config, "sae.controller", or
    "behaviours.<name>" for an entry of a mapping whose keys the user picks)."""
    node = _schema(Path(schema_path))
    for part in filter(None, key.split(".")):
        if part in node.get("properties", {}):
            node = node["properties"][part]
        elif isinstance(node.get("additionalProperties"), dict):
            node = node["additionalProperties"]
        else:
            raise KeyError(f"the config schema has no key {key!r}")
    return node


def schema_defaults(path: str = "", schema_path: Path = SCHEMA_PATH) -> dict:
    """The schema's defaults below `path` ("" for the whole config, "sae.controller" for a
    section), nested as a config would hold them: what every unset key resolves to."""

    def walk(node: dict) -> dict:
        out = {}
        for key, sub in node.get("properties", {}).items():
            if "properties" in sub:
                out[key] = walk(sub)
            elif "default" in sub:
                out[key] = copy.deepcopy(sub["default"])
        return out

    return walk(schema_node(path, schema_path))


def key_path(error, prefix: str = "") -> str:
    """The dotted config key a jsonschema error is about (`prefix` is the key of the part of the
    config that was validated); "(top level)" for the whole config."""
    parts = [prefix] if prefix else []
    parts += [str(p) for p in error.absolute_path]
    return ".".join(parts) if parts else "(top level)"


def describe(error, prefix: str = "") -> str:
    """One line for a jsonschema error: the key, what is wrong, and what is allowed."""
    key = key_path(error, prefix)
    if error.validator == "additionalProperties":
        allowed = sorted(error.schema.get("properties", {}))
        extra = sorted(set(error.instance) - set(allowed))
        where = f"{key}." if key != "(top level)" else ""
        return f"unknown key {where}{extra[0]!s}; allowed keys: {', '.join(allowed)}"
    if error.validator == "enum":
        allowed = ", ".join(map(str, error.validator_value))
        return f"{key}: {error.instance!r} is not allowed; allowed values: {allowed}"
    if error.validator == "type":
        return f"{key}: {error.instance!r} is not of type {error.validator_value}"
    if error.validator == "required":
        return f"{key}: {error.message}"
    if error.validator == "oneOf" and key.endswith("layers"):
        return f"{key}: {error.instance!r} {LAYER_FORMS}"
    return f"{key}: {error.message}"


@functools.cache
def _validator(key: str, schema_path: Path):
    import jsonschema

    return jsonschema.Draft202012Validator(schema_node(key, schema_path))


def problem(values: Any, key: str = "", schema_path: Path = SCHEMA_PATH) -> str | None:
    """What is wrong with `values` (the config at `key`) by the schema, in one line naming the
    full key; None when nothing is. Fills no defaults."""
    import jsonschema

    errors = _validator(key, Path(schema_path)).iter_errors(_plain(values))
    error = jsonschema.exceptions.best_match(errors)
    return None if error is None else describe(error, key)


def check(values: Any, key: str = "", schema_path: Path = SCHEMA_PATH) -> None:
    """ConfigError (`problem`'s line) unless `values`, the config at `key`, fits the schema."""
    if (line := problem(values, key, schema_path)) is not None:
        raise ConfigError(line)


def typed(cls: type[T], values: Mapping[str, Any] | None, key: str, **extra: Any) -> T:
    """The dataclass `cls` of config section `key` ("attribution", "sae", "embedded", ...) from
    `values`: a resolved config's section, or a partial one (tests, benchmarks, a JSON config
    given to a stage script by hand).

    `values` is checked against the schema (an unknown key, a wrong type or value is a
    ConfigError in one line naming the full key, `sae.controller.kd`); keys it leaves out take
    the schema's defaults; a nested section (`sae.controller`, `embedded.language`) becomes its
    field's dataclass, and a list a tuple where the field is one. `extra` holds fields that are
    not in the section (the top-level `seed` and `device`): each goes to `cls` and to every
    nested dataclass that declares it.
    """
    values = dict(values or {})
    check(values, key)
    stray = set(extra) - _declared(cls)
    if stray:  # a caller's typo, not a config error
        raise TypeError(f"{cls.__name__} has no field {sorted(stray)[0]!r}, nested or not")
    return _build(cls, _merged(schema_defaults(key), values), key, extra)


def _merged(defaults: dict, values: Mapping) -> dict:
    out = dict(defaults)
    for name, value in values.items():
        if isinstance(value, Mapping) and isinstance(defaults.get(name), dict):
            out[name] = _merged(defaults[name], value)
        else:
            out[name] = value
    return out


def _build(cls: type[T], values: dict, key: str, extra: dict) -> T:
    hints = _hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    lacking = set(values) - names
    if lacking:  # the schema has a key the dataclass lacks: a bug, not a config error
        raise TypeError(f"{cls.__name__} has no field for {key}.{sorted(lacking)[0]}")
    kwargs = {name: _coerce(hints[name], v, f"{key}.{name}", extra) for name, v in values.items()}
    kwargs |= {name: v for name, v in extra.items() if name in names and name not in values}
    return cls(**kwargs)


def _coerce(hint: Any, value: Any, key: str, extra: dict) -> Any:
    """`value` as the field annotated `hint` holds it: a nested dataclass built, a list made the
    tuple (or list) the annotation names, with int or float items converted."""
    options = typing.get_args(hint) if _is_union(hint) else (hint,)
    for option in options:
        if dataclasses.is_dataclass(option) and isinstance(value, Mapping):
            return _build(option, dict(value), key, extra)
        origin = typing.get_origin(option)
        if origin in (tuple, list) and isinstance(value, (list, tuple)):
            item = (typing.get_args(option) or (None,))[0]
            return origin(item(v) if item in (int, float) else v for v in value)
    return value


def _declared(cls: type) -> set[str]:
    """The field names of dataclass `cls` and of the dataclasses nested in it."""
    names = set()
    for name, hint in _hints(cls).items():
        names.add(name)
        options = typing.get_args(hint) if _is_union(hint) else (hint,)
        for option in options:
            if dataclasses.is_dataclass(option):
                names |= _declared(option)
    return names


def _is_union(hint: Any) -> bool:
    return typing.get_origin(hint) in (typing.Union, types.UnionType)


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _plain(value: Any) -> Any:
    """Tuples as lists and mappings as dicts: what the schema's `array` and `object` accept."""
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value
