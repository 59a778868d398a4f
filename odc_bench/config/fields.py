"""Building a typed config section from plain values, checking every field against its type.

Each section of the run's config is a frozen dataclass; `build` turns the composed config's
plain values into one, checking each value against the field's annotation (int, float, bool,
str, Literal choices, optionals, tuples of numbers, nested sections, free-form mappings) and
naming the key in a one-line ConfigError. Range checks that need the value live in each
section's __post_init__, which raises ConfigError with the same kind of message.

Why not OmegaConf structured configs: frozen dataclasses become read-only config nodes there,
so Hydra could not apply the command line's overrides to them. The YAML groups stay Hydra's
interface, and this module is the one door from their composed result into typed objects.
"""

from __future__ import annotations

import dataclasses
import math
import reprlib
import types
import typing
from collections.abc import Mapping
from typing import Any, Literal, TypeVar, Union, cast, get_args, get_origin

from odc_bench.errors import ConfigError

T = TypeVar("T")


def require(condition: bool, message: str) -> None:
    if not condition:
        raise ConfigError(message)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return (_is_int(value) or isinstance(value, float)) and math.isfinite(value)  # type: ignore[arg-type]


def _kind(tp: type) -> str:
    """How a message names what a scalar field takes."""
    if tp is bool:
        return "true or false"
    if tp is int:
        return "an integer"
    if tp is float:
        return "a number"
    return "a string"


def _text_hint(key: str, value: Any) -> str:
    """Where a text setting (a file, a folder, a field's name) got a number or true/false: how to
    give the text, which Hydra's grammar read so on the command line and YAML reads so in a file."""
    if not isinstance(value, bool | int | float):
        return ""
    # An integer's or a boolean's text comes back from its value; a float's (1e3, 1.50) may not.
    said = str(value).lower() if isinstance(value, bool) else str(value) if isinstance(value, int) else "TEXT"
    kind = "a boolean" if isinstance(value, bool) else "a number"
    return (f"; Hydra reads it as {kind}: to give it as text, quote it for Hydra inside the shell's quotes "
            f"('{key}=\"{said}\"'), or give a file or folder of that name as ./{said}")


def convert(value: Any, tp: Any, key: str) -> Any:
    """`value` as the annotation `tp` asks, or ConfigError naming `key`."""
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        options = [a for a in get_args(tp) if a is not type(None)]
        if value is None:
            require(len(options) < len(get_args(tp)), f"{key} must not be null")
            return None
        if len(options) == 1:
            if options[0] not in (bool, int, float, str):
                return convert(value, options[0], key)  # its own message names the key inside
            try:
                return convert(value, options[0], key)
            except _BlankText:
                raise
            except ConfigError:
                hint = _text_hint(key, value) if options[0] is str else ""
                raise ConfigError(f"{key} must be {_kind(options[0])} or null, got {value!r}{hint}") from None
        return value  # a union of sections: its loader built the right one
    if origin is Literal:
        choices = get_args(tp)
        require(value in choices, f"{key} must be one of {', '.join(map(str, choices))}, got {value!r}")
        return value
    if origin is tuple:
        require(isinstance(value, list | tuple), f"{key} must be a list, got {value!r}")
        items = get_args(tp)
        if len(items) == 2 and items[1] is Ellipsis:
            return tuple(convert(v, items[0], f"{key}[{i}]") for i, v in enumerate(value))
        require(len(value) == len(items), f"{key} must have {len(items)} values, got {value!r}")
        return tuple(convert(v, t, f"{key}[{i}]") for i, (v, t) in enumerate(zip(value, items, strict=True)))
    if origin in (dict, Mapping) or tp in (dict, Mapping):
        require(isinstance(value, Mapping), f"{key} must be a mapping of keys to values, got {value!r}")
        return dict(value)
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):  # type: ignore[arg-type]
            return value  # built by its own section's loader
        require(isinstance(value, Mapping), f"{key} must be a section of keys, got {value!r}")
        return build(tp, value, f"{key}.")  # type: ignore[arg-type]
    if tp is bool:
        require(isinstance(value, bool), f"{key} must be true or false, got {value!r}")
    elif tp is int:
        require(_is_int(value), f"{key} must be an integer, got {value!r}")
    elif tp is float:
        require(_is_number(value), f"{key} must be a number, got {value!r}")
    elif tp is str:
        require(isinstance(value, str), f"{key} must be a string, got {value!r}{_text_hint(key, value)}")
        if not value.strip():
            raise _BlankText(f"{key} is {'empty' if not value else f'blank ({value!r})'}; give it a value, or leave "
                             f"it out where it has a default")
    return value


class _BlankText(ConfigError):
    """A text setting given as '' or spaces: a file, folder or name that is none (results_dir='' wrote
    the table into the working folder, balancer.calibration='' was keyed apart and read nothing)."""


# Each section class's field types, resolved once: its annotations are strings (postponed
# evaluation), and a command builds and records the sections of many runs.
_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]


def section(values: object, key: str) -> Mapping[str, Any]:
    """`values` as the section `key` of the config, or ConfigError where it is not one: a group
    option's file (a profile or model of the user's own) that holds a list or a single value."""
    require(isinstance(values, Mapping), f"{key} must be a section of keys, got {reprlib.repr(values)}; the file "
                                         f"that sets it must hold settings by name (key: value)")
    return cast(Mapping[str, Any], values)


def build(cls: type[T], values: Mapping[str, Any], prefix: str = "") -> T:
    """An instance of the dataclass `cls` from `values`: every key a field, every value checked.

    Missing keys take the field's default; a key the section does not have is refused."""
    values = section(values, prefix.rstrip(".") or "the config")
    hints = _hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = [k for k in values if k not in fields]
    if unknown:
        raise ConfigError(f"unknown config key {prefix + str(unknown[0])!r}; the keys there are: "
                          f"{', '.join(prefix + name for name in fields) or 'none'}")
    kwargs = {}
    for name, f in fields.items():
        if name in values:
            kwargs[name] = convert(values[name], hints[name], prefix + name)
        else:
            no_default = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
            require(not no_default, f"{prefix + name} is missing; set {prefix + name}=VALUE")
    try:
        return cls(**kwargs)
    except ValueError as e:  # the section's own checks (ConfigError is one)
        raise ConfigError(str(e)) from None


def _optional_section(tp: Any) -> bool:
    """Whether an annotation is a section that may be absent (`Section | None`)."""
    options = [a for a in get_args(tp) if a is not type(None)] if get_origin(tp) in (Union, types.UnionType) else []
    return len(options) == 1 and len(get_args(tp)) == 2 and dataclasses.is_dataclass(options[0])


def as_dict(section: Any) -> dict[str, Any]:
    """A section as plain values, nested sections included (tuples become lists, as in YAML).

    An optional nested section that is absent is left out, so that adding one (dataset.grpo)
    leaves every other run's record, and with it its key, as it was."""
    out = {}
    hints = _hints(type(section))
    for f in dataclasses.fields(section):
        value = getattr(section, f.name)
        if value is None and _optional_section(hints[f.name]):
            continue
        if dataclasses.is_dataclass(value):
            value = as_dict(value)
        elif isinstance(value, tuple):
            value = list(value)
        out[f.name] = value
    return out
