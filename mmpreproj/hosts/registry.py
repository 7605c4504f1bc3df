"""The architecture table: one `HostSpec` row per host model family.

A row says how to recognise the model, where its attention blocks are, which attribute of a block is
the attention module fed by the pre-attention norm, how that module is called, and the model width.
Adding a host architecture is adding one row with `register_host`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from ..modules.wrapper import AttentionCall

__all__ = ["HostSpec", "HOSTS", "register_host", "find_host", "get_host"]


@dataclass(frozen=True)
class HostSpec:
    """One host architecture.

    Args:
        name: short id, saved in adapter configs ("gpt_neox", "timm_vit", ...).
        description: what models this row covers (shown in errors).
        matches: True if a model belongs to this family.
        blocks: the model's attention blocks, in depth order.
        attention: attribute of a block holding the attention module that receives the normed input.
        hidden_size: the width d seen by the attention module of a block: `hidden_size(model, block)`.
        call: how the block calls that attention module.
        input_embeddings: the module whose output starts the residual stream (used so gradient
            checkpointing still yields gradients when the whole base is frozen), or None.
        fused_forward: optional fast path `f(wrapper, x~, *args, **kwargs)` that computes Q/K/V and the
            content skip in one matmul (see `mmpreproj.fused`); None if the host has none.
    """

    name: str
    description: str
    matches: Callable[[nn.Module], bool]
    blocks: Callable[[nn.Module], list[nn.Module]]
    attention: str
    hidden_size: Callable[[nn.Module, nn.Module], int]
    call: AttentionCall = field(default_factory=AttentionCall)
    input_embeddings: Callable[[nn.Module], nn.Module | None] = lambda model: None
    fused_forward: Callable[..., Any] | None = None


HOSTS: dict[str, HostSpec] = {}


def register_host(spec: HostSpec) -> HostSpec:
    """Add a row to the architecture table (a later row with the same name replaces the earlier)."""
    HOSTS[spec.name] = spec
    return spec


def supported() -> str:
    return ", ".join(f"{s.name} ({s.description})" for s in HOSTS.values())


def get_host(name: str) -> HostSpec:
    if name not in HOSTS:
        raise ValueError(f"unknown host {name!r}; supported: {sorted(HOSTS)}")
    return HOSTS[name]


def find_host(model: nn.Module) -> HostSpec:
    """The table row that matches `model`; ValueError naming the supported architectures otherwise."""
    for spec in HOSTS.values():
        if spec.matches(model):
            return spec
    raise ValueError(
        f"mmpreproj does not support {type(model).__name__}; supported architectures: {supported()}"
    )
