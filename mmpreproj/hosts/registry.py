"""The architecture table: one `HostSpec` row per host model family (see `spec.py` for the row's form).

Adding a host architecture is adding one row with `register_host`; a model no row knows can be described
in data (`HostSpec.from_dict`) and passed as `inject(model, host=...)`.
"""

from __future__ import annotations

from torch import nn

from .spec import HostError, HostSpec

__all__ = ["HOSTS", "HostSpec", "as_host", "find_host", "get_host", "register_host", "supported"]

HOSTS: dict[str, HostSpec] = {}

DESCRIBE_HINT = (
    "describe it yourself: mmpreproj.inject(model, host={'name': ..., 'parts': [{'name': 'language', "
    "'blocks': 'model.layers', 'attention': 'self_attn', 'norm': 'input_layernorm'}]}); "
    "mmpreproj.hosts.trace_seams(model, example_input) finds the description from one forward"
)


def register_host(spec: HostSpec) -> HostSpec:
    """Add a row to the architecture table (a later row with the same name replaces the earlier)."""
    HOSTS[spec.name] = spec
    return spec


def supported() -> str:
    return ", ".join(sorted(HOSTS))


def get_host(name: str) -> HostSpec:
    if name not in HOSTS:
        raise ValueError(f"unknown host {name!r}; supported: {supported()}")
    return HOSTS[name]


def _nearest(model: nn.Module) -> str | None:
    """The row whose name or model types share the most with the model's type/model_type (for hints)."""
    keys = {type(model).__name__.lower(), str(getattr(getattr(model, "config", None), "model_type", "")).lower()}
    best, score = None, 0
    for row in HOSTS.values():
        names = {row.name, *row.model_types}
        for k in keys:
            for n in names:
                s = len(n) if n and (n in k or k.startswith(n.split("_")[0])) else 0
                if s > score:
                    best, score = row.name, s
    return best


def find_host(model: nn.Module) -> HostSpec:
    """The table row that matches `model`; ValueError naming the supported rows and how to describe one."""
    for spec in HOSTS.values():
        if spec.matches_model(model):
            return spec
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    what = type(model).__name__ + (f" (model_type {model_type!r})" if model_type else "")
    near = _nearest(model)
    hint = f" The nearest row is {near!r}: force it with host={near!r} if the blocks have the same shape." if near else ""
    raise ValueError(f"mmpreproj has no host row for {what}; supported rows: {supported()}.{hint} Or {DESCRIBE_HINT}")


def as_host(model: nn.Module, host: str | dict | HostSpec | None) -> HostSpec:
    """The row for `model`: detected (None), a row name, a `HostSpec`, or a JSON-able description."""
    if host is None:
        return find_host(model)
    if isinstance(host, HostSpec):
        return host
    if isinstance(host, str):
        return get_host(host)
    if isinstance(host, dict):
        return HostSpec.from_dict(host)
    raise TypeError(f"host must be None, a row name, a HostSpec or a description dict, got {type(host).__name__}")


def forced_mismatch(model: nn.Module, spec: HostSpec, error: Exception) -> HostError:
    """The error for a forced row that does not fit `model`."""
    return HostError(f"host {spec.name!r} does not fit {type(model).__name__}: {error}. Or {DESCRIBE_HINT}")
