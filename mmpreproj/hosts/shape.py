"""A host's (width d, attention blocks L): what the rank rules and the budget sizing count with."""

from __future__ import annotations

from torch import nn

from .lora import lora_sites
from .registry import find_host
from .spec import HostError


def host_shape(model: nn.Module) -> tuple[int, int]:
    """(width d, blocks L) for the rank rules: the host row's sites (default parts), else `model.config`.
    A model no row knows (by type or structure) is the registry's error, which says how to describe it."""
    spec = find_host(model)
    try:
        sites = lora_sites(model, spec)
    except HostError:
        sites = []
    if sites:
        widths = {s.part: s.width for s in sites}
        if len(set(widths.values())) > 1:
            raise ValueError(
                f"the LoRA rank rules need one width, but the parts of {type(model).__name__} differ ({widths}); "
                "pass lora_r"
            )
        return sites[0].width, len(sites)
    cfg = getattr(model, "config", None)
    if cfg is None or not hasattr(cfg, "hidden_size") or not hasattr(cfg, "num_hidden_layers"):
        raise ValueError(f"{type(model).__name__} has no config.hidden_size / num_hidden_layers (LoRA rank rule)")
    return int(cfg.hidden_size), int(cfg.num_hidden_layers)
