"""Typed configs: nested dataclasses from YAML files plus dotted ``key=value`` overrides.

Generic over any dataclass schema (fields with ``metadata={"help": ...}``). Pipeline:
``YAML file (+ its defaults: files) -> merged over base -> overrides -> from_dict(cls)``.

Decisions, each against a trap that can silently cost a training run:
- An unknown key is an error with a difflib suggestion: a typo never falls back to a default.
  A key a schema has renamed (its ``RENAMED_KEYS``) is an error naming the new key.
- YAML 1.2 scalars: ``1e-6`` is a float (PyYAML's YAML 1.1 reads a string) and only true/false
  are booleans, so ``yes/no/on/off`` stay strings: a bool field given ``yes`` is an error and
  ``country: no`` stays "no".
- Lossless coercion only: int -> float, integral float -> int (``steps=1e3``), numeric string ->
  float, str -> Path, list -> tuple. Anything else is an error naming key, value and type.
- Overrides assign (a list or dict is replaced whole); YAML layers (defaults, base) merge dicts
  deeply. ``lora.rank=8`` on a None or absent section creates it from its defaults.
"""

from __future__ import annotations

import difflib
import re
import types
from collections.abc import Mapping, Sequence
from dataclasses import MISSING, fields, is_dataclass
from pathlib import Path, PurePath
from typing import Any, Literal, TypeVar, Union, get_args, get_origin, get_type_hints

import yaml

from spa.io import atomic_write_text

T = TypeVar("T")
_FLOAT_TAG, _BOOL_TAG = "tag:yaml.org,2002:float", "tag:yaml.org,2002:bool"
# YAML 1.2 floats that YAML 1.1 misses: an exponent without a dot, or without a sign (1.0e6).
_FLOAT_RE = re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$")


class ConfigError(ValueError):
    """A config that cannot be loaded: bad key, bad value, bad override or bad file."""


class _Loader(yaml.SafeLoader):  # YAML 1.2 booleans (true/false only) and exponent floats
    pass


_Loader.yaml_implicit_resolvers = {  # copy without the YAML 1.1 yes/no/on/off boolean rule
    first: [(tag, rx) for tag, rx in rules if tag != _BOOL_TAG]
    for first, rules in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver(_BOOL_TAG, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"),
                              list("tTfF"))
_Loader.add_implicit_resolver(_FLOAT_TAG, _FLOAT_RE, list("-+0123456789"))


class _Dumper(yaml.SafeDumper):  # quotes "1e-6" (a float to _Loader); keeps 1.1 rules: "yes" too
    pass


_Dumper.add_implicit_resolver(_FLOAT_TAG, _FLOAT_RE, list("-+0123456789"))


def _join(path: str, key: Any) -> str:
    return f"{path}.{key}" if path else str(key)


def _did_you_mean(word: Any, options: Sequence[Any], path: str = "") -> str:
    close = difflib.get_close_matches(str(word), [str(o) for o in options], n=1)
    return f"; did you mean {_join(path, close[0])!r}?" if close else ""


def _type_name(tp: Any) -> str:
    """``int | None``, ``list[str]``, ``Literal['a', 'b']``: short names, no module prefixes."""
    origin, args = get_origin(tp), get_args(tp)
    if origin is Literal:
        return f"Literal[{', '.join(map(repr, args))}]"
    if origin in (Union, types.UnionType):
        return " | ".join(_type_name(a) for a in args)
    if args:
        return f"{_type_name(origin)}[{', '.join(_type_name(a) for a in args)}]"
    if tp is type(None) or tp is Ellipsis:
        return "None" if tp is type(None) else "..."
    return getattr(tp, "__name__", None) or repr(tp).replace("typing.", "")


def _type_error(key: str, tp: Any, value: Any) -> ConfigError:
    hint = " (use true or false)" if tp is bool else ""
    hint = " (quote it to make it a string)" if tp is str and value is not None else hint
    return ConfigError(f"{key}: expected {_type_name(tp)}, got {value!r} "
                       f"({type(value).__name__}){hint}")


def _convert(tp: Any, value: Any, key: str) -> Any:
    """Check ``value`` against the annotation ``tp``, coercing only where nothing is lost."""
    origin, args = get_origin(tp), get_args(tp)
    if tp is Any or tp is object:
        return value
    if origin is Literal:
        # `type(...) is` so that True does not pass for Literal[1], nor 1 for Literal[1.0].
        if any(value == a and type(value) is type(a) for a in args):
            return value
        allowed = ", ".join(map(repr, args))
        raise ConfigError(f"{key}: {value!r} is not one of {allowed}{_did_you_mean(value, args)}")
    if origin in (Union, types.UnionType):
        options = [a for a in args if a is not type(None)]
        if value is None and len(options) < len(args):
            return None
        if len(options) == 1:  # Optional[X]: X's own error message is the useful one
            return _convert(options[0], value, key)
        if type(value) in options:  # exact match first, so `int | float` keeps an int an int
            return value
        for option in options:
            try:
                return _convert(option, value, key)
            except ConfigError:
                pass
        raise _type_error(key, tp, value)
    if is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if isinstance(value, Mapping):
            return from_dict(tp, value, path=key)
        raise _type_error(key, tp, value)
    container = origin or tp
    if container in (list, tuple, Sequence):
        if not isinstance(value, (list, tuple)):
            raise _type_error(key, tp, value)
        if container is tuple and args and args[-1] is not Ellipsis:  # fixed-length tuple
            if len(value) != len(args):
                raise ConfigError(f"{key}: expected {len(args)} items, got {len(value)}: {value!r}")
            items = [_convert(a, v, f"{key}[{i}]") for i, (a, v) in enumerate(zip(args, value))]
        else:
            item = args[0] if args else Any
            items = [_convert(item, v, f"{key}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if container is tuple else items
    if container in (dict, Mapping):
        if not isinstance(value, Mapping):
            raise _type_error(key, tp, value)
        key_tp, value_tp = args or (Any, Any)
        return {_convert(key_tp, k, f"{key}.{k}"): _convert(value_tp, v, _join(key, k))
                for k, v in value.items()}
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if tp is float and isinstance(value, str):  # "1e-6" from a plain yaml.safe_load mapping
        try:
            value, number = float(value), True
        except ValueError:
            pass
    if (tp is bool and isinstance(value, bool)) or (tp is str and isinstance(value, str)):
        return value
    if (tp is float and number) or (tp is int and number and float(value).is_integer()):
        return tp(value)
    if isinstance(tp, type) and tp not in (bool, int, float, str):  # other classes: as they are
        if isinstance(value, tp):
            return value
        if issubclass(tp, PurePath) and isinstance(value, str):
            return tp(value)
    raise _type_error(key, tp, value)


def from_dict(cls: type[T], data: Mapping, *, path: str = "") -> T:
    """Build dataclass ``cls`` from a nested mapping, checking every key and value.

    ``path`` is the dotted location of ``data`` (for error messages). Unknown keys, missing
    required keys and badly typed values raise ConfigError; a ValueError from the dataclass's
    ``__post_init__`` is re-raised as ConfigError prefixed with the section's path.
    """
    if not (isinstance(cls, type) and is_dataclass(cls)):
        raise TypeError(f"from_dict needs a dataclass type, got {cls!r}")
    if not isinstance(data, Mapping):
        raise _type_error(path or cls.__name__, cls, data)
    known = {f.name: f for f in fields(cls) if f.init}  # init=False fields cannot be set
    renamed = getattr(cls, "RENAMED_KEYS", {})  # old key -> (new key, how to translate a value)
    for key in data:
        if key in renamed and key not in known:
            new, how = renamed[key]
            raise ConfigError(f"key {_join(path, key)!r} was replaced by {_join(path, new)!r}: {how}")
        if key not in known:
            raise ConfigError(f"unknown key {_join(path, key)!r} in {cls.__name__}; valid keys: "
                              f"{', '.join(known)}{_did_you_mean(key, list(known), path)}")
    for name, f in known.items():
        if name not in data and f.default is MISSING and f.default_factory is MISSING:
            raise ConfigError(f"missing required key {_join(path, name)!r} in {cls.__name__}")
    hints = get_type_hints(cls)  # resolves string annotations (from __future__ import annotations)
    kwargs = {k: _convert(hints[k], v, _join(path, k)) for k, v in data.items()}
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except ValueError as error:
        raise ConfigError(f"{path or cls.__name__}: {error}") from error


def parse_override(text: str) -> tuple[list[str], Any]:
    """``"ppo.lr=1e-6"`` -> ``(["ppo", "lr"], 1e-06)``; the value is YAML (see module doc).

    An empty value is the empty string (null is spelled ``null``); the first ``=`` splits.
    """
    key, sep, raw = text.partition("=")
    keys = [k.strip() for k in key.split(".")]
    if not sep or not all(keys):
        raise ConfigError(f"malformed override {text!r}: expected key.path=value, e.g. ppo.lr=1e-6")
    if not raw.strip():
        return keys, ""
    try:
        return keys, yaml.load(raw, Loader=_Loader)  # noqa: S506 (_Loader is a SafeLoader)
    except yaml.YAMLError as error:
        raise ConfigError(f"override {text!r}: the value is not valid YAML "
                          f"(quote strings with special characters): {error}") from None


def _plain(value: Any) -> Any:
    """A deep copy with every mapping turned into a plain dict (so overrides can write into it)."""
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    return [_plain(v) for v in value] if isinstance(value, list) else value


def _merge(base: Mapping, over: Mapping) -> dict:
    """Deep merge: mappings merge key by key, anything else (lists included) is replaced."""
    out = _plain(base)
    for key, value in over.items():
        both = isinstance(out.get(key), dict) and isinstance(value, Mapping)
        out[key] = _merge(out[key], value) if both else _plain(value)
    return out


def apply_overrides(data: Mapping, overrides: Sequence[str]) -> dict:
    """Return a copy of the plain nested ``data`` with each ``dotted.key=value`` assigned.

    Missing or null sections on the way are created, which is how ``lora.rank=8`` turns on an
    Optional section that defaults to None.
    """
    out = _plain(data)
    for text in [overrides] if isinstance(overrides, str) else overrides:
        keys, value = parse_override(text)
        node = out
        for depth, key in enumerate(keys[:-1]):
            if node.get(key) is None:
                node[key] = {}
            elif not isinstance(node[key], dict):
                where = ".".join(keys[: depth + 1])
                raise ConfigError(f"override {text!r}: {where!r} is a {type(node[key]).__name__}, "
                                  "not a section; override it whole")
            node = node[key]
        node[keys[-1]] = value
    return out


def read_yaml(path: str | Path, chain: tuple[Path, ...] = (), parent: Path | None = None) -> dict:
    """Read one YAML file with its ``defaults:`` files (relative to it) merged underneath."""
    path = Path(path)
    if not path.is_file():
        where = f" (listed in 'defaults' of {parent})" if parent else ""
        raise ConfigError(f"config file not found: {path}{where}")
    resolved = path.resolve()
    if resolved in chain:
        raise ConfigError(f"'defaults' cycle: {' -> '.join(map(str, chain + (resolved,)))}")
    try:
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=_Loader)  # noqa: S506
    except yaml.YAMLError as error:
        raise ConfigError(f"{path}: invalid YAML: {error}") from None
    data = {} if data is None else data
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping, got {type(data).__name__}")
    parents = data.pop("defaults", [])  # reserved at a file's top level
    parents = [parents] if isinstance(parents, str) else parents
    if not isinstance(parents, list) or not all(isinstance(p, str) for p in parents):
        raise ConfigError(f"{path}: 'defaults' must be a list of YAML file paths")
    merged: dict = {}
    for name in parents:  # in order, so a later preset wins over an earlier one
        merged = _merge(merged, read_yaml(path.parent / name, chain + (resolved,), path))
    return _merge(merged, data)  # the file's own keys last


def load(cls: type[T], source: str | Path | Mapping | None = None, overrides: Sequence[str] = (),
         *, base: Mapping | Any | None = None) -> T:
    """YAML file or mapping -> deep-merged over ``base`` -> ``overrides`` -> ``from_dict(cls)``.

    ``base`` may also be a config instance (e.g. a recipe's preset object). A mapping source
    gets no ``defaults:`` processing; only files do, with paths relative to the file.
    """
    data = to_dict(base) if is_dataclass(base) else _plain(base or {})
    if isinstance(source, (str, PurePath)):
        data = _merge(data, read_yaml(Path(source)))
    elif isinstance(source, Mapping):
        data = _merge(data, source)
    elif source is not None:
        raise TypeError(f"config source must be a path, mapping or None, not {source!r}")
    return from_dict(cls, apply_overrides(data, overrides))


def to_dict(config: Any) -> dict:
    """Plain YAML-safe data: like ``dataclasses.asdict``, but tuples become lists, paths strings,
    and ``init=False`` fields are left out (they cannot be loaded back)."""
    if is_dataclass(config) and not isinstance(config, type):
        return {f.name: to_dict(getattr(config, f.name)) for f in fields(config) if f.init}
    if isinstance(config, Mapping):
        return {k: to_dict(v) for k, v in config.items()}
    if isinstance(config, (list, tuple)):
        return [to_dict(v) for v in config]
    return str(config) if isinstance(config, PurePath) else config


def with_defaults(cls: type, data: Mapping) -> dict:
    """Plain ``data`` (a saved config) deep-merged over ``cls()``'s defaults, not validated: a
    key ``data`` lacks, as in a file saved before the key existed, reads as its default (a
    new key's default keeps the behaviour from before it)."""
    return _merge(to_dict(cls()), data)


def save(config: Any, path: str | Path) -> Path:
    """Write ``config`` as YAML atomically (temp file beside it, then os.replace).

    The YAML is built before the file is touched, so an unrepresentable value leaves the old
    file as it was; ``load(type(config), path) == config``.
    """
    text = yaml.dump(to_dict(config), Dumper=_Dumper, sort_keys=False, allow_unicode=True)
    return atomic_write_text(path, text)


def _nested_dataclass(tp: Any) -> type | None:
    """The dataclass in ``tp`` or ``Optional[tp]``, else None."""
    if get_origin(tp) in (Union, types.UnionType):
        options = [a for a in get_args(tp) if a is not type(None)]
        tp = options[0] if len(options) == 1 else None
    return tp if isinstance(tp, type) and is_dataclass(tp) else None


def describe(cls: type, *, _prefix: str = "", _defaults: Any = None,
             ) -> list[tuple[str, str, Any, str]]:
    """``(dotted key, type name, default, help)`` for every leaf field, for a config listing.

    Required fields show ``dataclasses.MISSING``. Nested sections show the defaults of the
    parent's default instance. An Optional section also gets a row of its own (its default,
    usually None, is what turns it off), followed by its fields with the section's defaults.
    """
    rows = []
    hints = get_type_hints(cls)
    for f in fields(cls):
        if not f.init:
            continue
        key, tp = _join(_prefix, f.name), hints[f.name]
        default = (getattr(_defaults, f.name) if _defaults is not None
                   else f.default if f.default_factory is MISSING else f.default_factory())
        nested = _nested_dataclass(tp)
        if nested is None or nested is not tp:  # a leaf, or an Optional section's own row
            rows.append((key, _type_name(tp), default, f.metadata.get("help", "")))
        if nested is not None:
            inner = default if isinstance(default, nested) else None
            rows += describe(nested, _prefix=key, _defaults=inner)
    return rows
