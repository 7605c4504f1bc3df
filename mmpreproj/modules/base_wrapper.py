"""`BaseLayerWrapper`: a module that wraps another one and stands in for it (peft's `base_layer` habit)."""

from __future__ import annotations

from typing import Any, ClassVar

from torch import nn


class BaseLayerWrapper(nn.Module):
    """Keeps the wrapped module as `self.base_layer` and stands in for it.

    Reads of attributes the wrapper lacks (`layer_idx`, `head_dim`, `config`, ...) go to the base layer, so
    host code that reads them on `block.attn` keeps working. Writes stay on the wrapper, except for the
    attribute names in `forwarded_writes`: host switches that users toggle on `block.attn` and the base
    layer reads in its own forward (timm's `fused_attn`). Those are written to the base layer only (the
    wrapper keeps no copy, so reads see the base's value). `get_base_layer()` gives the base back (unload).
    """

    # Host attributes written through a wrapper; every other write lands on the wrapper itself.
    # timm `Attention`/`EvaAttention`/attention-pool classes: `attn.fused_attn = False` selects the manual path.
    forwarded_writes: ClassVar[frozenset[str]] = frozenset({"fused_attn"})

    def get_base_layer(self) -> nn.Module:
        return self.base_layer

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            if name == "base_layer":
                raise
            return getattr(self.base_layer, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in self.forwarded_writes:
            try:
                base = self.base_layer
            except AttributeError:  # not yet set (inside __init__)
                base = None
            if base is not None:
                setattr(base, name, value)
                return
        super().__setattr__(name, value)
