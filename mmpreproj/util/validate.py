"""Typed field checks for the dataclass configs: every bad value is refused with its field, value and rule.

    check_field_types(self)        # first line of a config's __post_init__

A `bool` field takes only a bool, an `int` field only an int (not a bool), a `float` field an int or a
finite float (stored as float), a `str` field a str; `X | None` also takes None, `list[int]` a list or
tuple of ints (stored as a list), `tuple[float, float]` two floats (stored as a tuple).
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from functools import cache
from typing import Any


class ConfigTypeError(TypeError, ValueError):
    """A config field holds a value of the wrong type (also a ValueError, so either `except` catches it)."""


def check_choice(owner: str, name: str, value: Any, allowed: Any) -> None:
    """Refuse `value` unless it is one of `allowed`."""
    if not isinstance(value, str) or value not in allowed:
        raise ValueError(f"{owner}.{name}={value!r}; allowed values: {list(allowed)}")


def check_flags(owner: str, **flags: Any) -> None:
    """Refuse each keyword that is not a bool (None allowed where the flag has a "not given" default): a call's
    switches, where a str such as "no" would otherwise read as True."""
    for name, value in flags.items():
        if value is not None and not isinstance(value, bool):
            raise TypeError(f"{owner}({name}={value!r:.40}): must be True or False")


def check_rule(ok: bool, owner: str, name: str, value: Any, rule: str) -> None:
    """Refuse `value` unless `ok`, saying what the field must be."""
    if not ok:
        raise ValueError(f"{owner}.{name}={value!r}; must be {rule}")


@cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def check_field_types(obj: Any, skip: tuple[str, ...] = ()) -> None:
    """Check (and normalise) every annotated dataclass field of `obj` against its type hint (except `skip`:
    fields a base class checks itself, or that the caller checks by hand)."""
    owner = type(obj).__name__
    hints = _hints(type(obj))
    for f in dataclasses.fields(obj):
        if f.name in skip:
            continue
        value = getattr(obj, f.name)
        ok, converted, rule = _convert(hints[f.name], value)
        if not ok:
            raise ConfigTypeError(f"{owner}.{f.name}={value!r} ({type(value).__name__}); must be {rule}")
        if converted is not value:
            setattr(obj, f.name, converted)


def _convert(hint: Any, value: Any) -> tuple[bool, Any, str]:
    """(accepted, normalised value, rule in words) for `value` against `hint`."""
    args = typing.get_args(hint)
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        inner = [a for a in args if a is not type(None)]
        if value is None:
            return True, None, ""
        rules = []
        for alternative in inner:
            ok, out, rule = _convert(alternative, value)
            if ok:
                return ok, out, rule
            rules.append(rule)
        return False, value, " or ".join(["None", *rules] if type(None) in args else rules)
    if hint is bool:
        return type(value) is bool, value, "a bool (true/false)"
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool), value, "an int"
    if hint is float:
        return _as_float(value)
    if hint is str:
        return isinstance(value, str), value, "a string"
    origin = typing.get_origin(hint)
    if origin is list and args == (int,):
        ok = isinstance(value, (list, tuple)) and all(isinstance(i, int) and not isinstance(i, bool) for i in value)
        return ok, list(value) if ok and not isinstance(value, list) else value, "a list of ints"
    if origin is list and args == (str,):
        ok = isinstance(value, (list, tuple)) and all(isinstance(i, str) for i in value)
        return ok, list(value) if ok and not isinstance(value, list) else value, "a list of strings"
    if origin is dict and len(args) == 2 and args[0] is str:
        if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
            return False, value, "an object with string keys"
        items = {k: _convert(args[1], v) for k, v in value.items()}
        ok = all(ok for ok, _, _ in items.values())
        return ok, {k: v for k, (_, v, _) in items.items()} if ok else value, "an object with string keys"
    if origin is tuple and all(a is float for a in args):
        rule = f"{len(args)} finite numbers"
        if not isinstance(value, (list, tuple)) or len(value) != len(args):
            return False, value, rule
        items = [_as_float(v) for v in value]
        return all(ok for ok, _, _ in items), tuple(v for _, v, _ in items), rule
    # A programming error (a field type this module does not know), not a user input.
    raise TypeError(f"check_field_types: unsupported type hint {hint!r}")


def _as_float(value: Any) -> tuple[bool, Any, str]:
    rule = "a finite number"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False, value, rule
    try:
        out = float(value)
    except OverflowError:
        return False, value, rule
    return math.isfinite(out), out if type(value) is not float else value, rule
