"""`BaseLayerWrapper`: a module that wraps another one and stands in for it (peft's `base_layer` habit)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

__all__ = ["BaseLayerWrapper"]


class BaseLayerWrapper(nn.Module):
    """Keeps the wrapped module as `self.base_layer` and stands in for it.

    Reads of attributes the wrapper lacks (`layer_idx`, `head_dim`, `config`, ...) go to the base layer, and
    writes of plain attributes the base layer already has (timm's `fused_attn`, ...) are made there, so host
    code that reads or toggles them on `block.attn` keeps working. `get_base_layer()` gives it back (unload).
    """

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
        base = self.__dict__.get("_modules", {}).get("base_layer")
        if (
            base is not None
            and name not in self.__dict__
            and not isinstance(value, (nn.Module, torch.Tensor))
            and name in base.__dict__
        ):
            setattr(base, name, value)
            return
        super().__setattr__(name, value)
