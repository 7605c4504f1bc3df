"""Put the pre-projection + content skip into the decoder only (one per block, shared by every modality)."""

from __future__ import annotations

from torch import nn

from mmpreproj.method.config import PreProjConfig
from mmpreproj.method.inject import inject

__all__ = ["inject_decoder"]


def inject_decoder(model: nn.Module, config: PreProjConfig | None = None) -> nn.Module:
    """`mmpreproj.inject` on `model.decoder.host`, so a native vision tower's blocks are left alone."""
    inject(model.decoder.host, config)
    return model
