"""The architecture table: one `HostSpec` row per host model family (see `spec.py` for the row's form).

Adding a host architecture is adding one row with `register_host`; a model no row claims by type is
matched by its structure (`structure.py`: the one row whose layout it has); one that fits no row can be
described in data (`HostSpec.from_dict`) and passed as `inject(model, host=...)`.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from .spec import HostError, HostSpec
from .structure import StructureMatch, _is_attention, match_structure, resolve_row, shared_prefix, written_by
from .trace import _is_attention as _is_traced_attention

HOSTS: dict[str, HostSpec] = {}
"""Every registered host row by name (`register_host` adds one; `find_host` picks one for a model)."""

DESCRIBE_HINT = (
    "describe it yourself: mmpreproj.inject(model, host={'name': ..., 'parts': [{'name': 'language', "
    "'blocks': 'model.layers', 'attention': 'self_attn', 'norm': 'input_layernorm'}]}); "
    "mmpreproj.method.trace_seams(model, example_input) finds the description from one forward"
)


def register_host(spec: HostSpec) -> HostSpec:
    """Add a row to the architecture table (a later row with the same name replaces the earlier)."""
    HOSTS[spec.name] = spec
    return spec


def supported() -> str:
    return ", ".join(sorted(HOSTS))


def get_host(name: str) -> HostSpec:
    """The host row registered as `name`; ValueError naming the rows there are."""
    if name not in HOSTS:
        raise ValueError(f"unknown host {name!r}; supported: {supported()}")
    return HOSTS[name]


def find_host(model: nn.Module) -> HostSpec:
    """The row for `model`: the one whose `model_types` (or `matches`) claim it, else the one row whose layout
    it has (`structure.py`, resolved on the model); ValueError naming the rows that fit, the nearest row that
    injects when forced, and how to describe one."""
    for spec in HOSTS.values():
        if spec.matches_model(model):
            return spec
    refuse_no_attention(model)
    found = match_structure(model, HOSTS.values())
    if found.spec is not None:
        return found.spec
    raise ValueError(_no_row(model, found))


def refuse_no_attention(model: nn.Module) -> None:
    """ValueError in one line when `model` has no module that either search takes for an attention: by class
    (`structure.py`, what a row's sites must be) or by name (`trace.py`, what the trace hooks). Said first, instead
    of the list of rows none of which can fit a model without attention."""
    if any(_is_attention(m) or _is_traced_attention(n, m) for n, m in model.named_modules() if n):
        return
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    what = type(model).__name__ + (f" (model_type {model_type!r})" if model_type else "")
    raise ValueError(
        f"mmpreproj found no attention layer in {what}: searched its modules for nn.MultiheadAttention, a class "
        "named *Attention*/*Attn*, and a module named *attn*/*attention* holding weight matrices; the "
        "pre-projection goes in front of an attention, so there is nothing to inject into (an attention named "
        "otherwise: describe it with host={...}, see mmpreproj.hosts.spec)"
    )


def _no_row(model: nn.Module, found: StructureMatch) -> str:
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    what = type(model).__name__ + (f" (model_type {model_type!r})" if model_type else "")
    if len(found.fitting) > 1:
        groups = "; ".join(" = ".join(g) for g in found.fitting)
        hint = (
            f" By structure it fits rows that inject differently ({groups}): force one with host=<row name>"
            " after checking which layout the model has."
        )
    elif found.forceable:
        key = str(model_type or type(model).__name__).lower()
        near = max(found.forceable, key=lambda n: (shared_prefix(n, key), -list(found.forceable).index(n)))
        hint = f" The nearest row is {near!r}: host={near!r} injects its blocks, but it {found.forceable[near]}."
    else:
        hint = ""
    return f"mmpreproj has no host row for {what}; supported rows: {supported()}.{hint} Or {DESCRIBE_HINT}"


def host_for_adapter(model: nn.Module, name: Any, description: Any) -> str | HostSpec:
    """The host an adapter saved for row `name` with the resolved `description` is loaded with on `model`.

    With a description: the row `name` when the description is what that row writes (its parts' paths and
    call; a block path as the row has it, or under a base model), loaded as `host=name` forces it, so a
    forced row and one matched by structure reload too; else the saved description itself (a described
    host, also one whose name equals a row's). Without one (files from before descriptions were saved):
    the row `name`, if it claims the model; else HostError."""
    if isinstance(description, dict) and description.get("parts"):
        if name in HOSTS and written_by(HOSTS[name], description):
            return name
        return HostSpec.from_dict(description)
    if name in HOSTS and HOSTS[name].matches_model(model):
        return name
    try:
        have = find_host(model).name
    except ValueError:
        have = type(model).__name__
    raise HostError(f"saved for host {name!r}, this model is {have!r}")


def as_host(model: nn.Module, host: str | dict | HostSpec | None) -> HostSpec:
    """The row for `model`: detected (None), a row name, a `HostSpec`, or a JSON-able description."""
    if host is None:
        return find_host(model)
    if isinstance(host, HostSpec):
        return host
    if isinstance(host, str):
        return resolve_row(model, get_host(host))
    if isinstance(host, dict):
        return HostSpec.from_dict(host)
    raise TypeError(f"host must be None, a row name, a HostSpec or a description dict, got {type(host).__name__}")


def forced_mismatch(model: nn.Module, spec: HostSpec, error: Exception) -> HostError:
    """The error for a forced row that does not fit `model`."""
    return HostError(f"host {spec.name!r} does not fit {type(model).__name__}: {error}. Or {DESCRIBE_HINT}")
