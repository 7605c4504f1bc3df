"""Paths into a model, resolved as data: plain attribute and index steps, never a call.

A path such as `model.layers.0.self_attn` comes from a host row, a user's `host={...}` description or an
adapter file someone downloaded, so it is resolved with these steps only:

- a component of letters, digits and `_` that does not start with `_` (no dunders, no private state);
- on an `nn.Module`: one of its submodules, parameters or buffers, else a plain instance attribute
  (what `vars(module)` holds, e.g. `embed_dim`);
- on any other object: a plain instance attribute (`vars(obj)`), never a property, method or class attribute;
- a run of digits on a list, tuple, `nn.ModuleList` or `nn.Sequential`: an index.

Nothing runs but torch's own lookup of registered entries (`nn.Module.__getattr__` itself, never a subclass's
override); properties, other descriptors and `__getattribute__` overrides are bypassed, so resolving a path cannot
change the model or the process. The one method the
built-in rows need, transformers' `get_input_embeddings()`, is the keyword `@input_embeddings`: the
resolver maps the keyword to that method, a string can never spell a call. A path is checked for its form
(`check_path`) before it meets a model, so a bad one is refused before anything happens.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from typing import Any

from torch import nn


class HostError(ValueError):
    """A model does not fit a host description (a path that does not resolve, a refused block type...)."""


class PathError(HostError):
    """A path that is not data: a call, a private name or dunder, an unknown keyword."""


def _input_embeddings(obj: Any) -> Any:
    method = getattr(type(obj), "get_input_embeddings", None)
    return method(obj) if callable(method) else None


INPUT_EMBEDDINGS = "@input_embeddings"
# keyword -> the one getter it stands for; the only code a path can reach, chosen by this table, not the string
PATH_KEYWORDS: dict[str, Callable[[Any], Any]] = {INPUT_EMBEDDINGS: _input_embeddings}
# what files written before the keywords spell (read as the keyword, never as a call)
LEGACY_KEYWORDS: dict[str, str] = {"get_input_embeddings()": INPUT_EMBEDDINGS}

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_]*")
_MISSING = object()


def check_path(path: object, field: str, *, keywords: bool = False) -> str:
    """`path` if it is a well-formed path ("" = the root), else PathError naming `field` and the rule.

    `keywords=True` also allows an `@keyword` as the path's first component (`PATH_KEYWORDS`)."""
    if not isinstance(path, str):
        raise PathError(f"{field} must be a path string such as 'model.layers', got {type(path).__name__}")
    path = LEGACY_KEYWORDS.get(path, path)
    if not path:
        return path
    for i, name in enumerate(path.split(".")):
        if i == 0 and keywords and name in PATH_KEYWORDS:
            continue
        if name.startswith("@"):
            allowed = sorted(PATH_KEYWORDS) if keywords else "none here"
            raise PathError(f"{field}={path!r}: unknown keyword {name!r}; allowed keywords: {allowed}")
        if not _NAME.fullmatch(name):
            why = (
                "a path never calls anything (use the keyword '@input_embeddings' for get_input_embeddings())"
                if "(" in name or ")" in name
                else "names that start with '_' (private state, dunders) are not followed"
                if name.startswith("_")
                else "each component is an attribute name or a list index"
            )
            raise PathError(
                f"{field}={path!r}: component {name!r} is not allowed; paths are data: attribute names of "
                f"letters, digits and '_' not starting with '_', or list indices ({why})"
            )
    return path


def _step(obj: Any, name: str) -> Any:
    """One plain step: index, submodule / parameter / buffer, or instance attribute; `_MISSING` otherwise."""
    if name in PATH_KEYWORDS:
        return PATH_KEYWORDS[name](obj)
    if name.isdigit() and isinstance(obj, (nn.ModuleList, nn.Sequential, list, tuple)):
        return obj[int(name)] if int(name) < len(obj) else _MISSING
    if isinstance(obj, nn.Module):
        try:  # torch's own lookup of a registered parameter, buffer or submodule: no property or override runs
            return nn.Module.__getattr__(obj, name)
        except AttributeError:
            pass
    try:
        attrs = vars(obj)
    except TypeError:  # no __dict__ (ints, tensors' C attributes...)
        return _MISSING
    return attrs.get(name, _MISSING)


def get_path(root: Any, path: str, field: str = "path") -> Any:
    """`root.a.b.0.c` for path "a.b.0.c" ("" = root), by plain steps only (see the module docstring).

    PathError for a path that is not data; HostError naming `field` and the first component that is missing
    (or None)."""
    path = check_path(path, field, keywords=True)
    obj: Any = root
    if not path:
        return obj
    done: list[str] = []
    for name in path.split("."):
        found = _step(obj, name)
        if found is _MISSING or found is None:
            where = repr(".".join(done)) if done else f"the {type(root).__name__}"
            raise HostError(f"{field} {path!r}: {where} has no {name!r}{_not_plain(obj, name)}")
        obj = found
        done.append(name)
    return obj


def _not_plain(obj: Any, name: str) -> str:
    """Why a name the object does have was not followed (a property, method or class attribute)."""
    found = inspect.getattr_static(type(obj), name, _MISSING)
    if found is _MISSING:
        return ""
    kind = "property" if isinstance(found, property) else "method" if callable(found) else "class attribute"
    return f" as a submodule, parameter, buffer or instance attribute (it is a {kind}, which a path never runs)"
