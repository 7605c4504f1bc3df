"""Move injected adapters off their init, as training would, so that a test comparing outputs can fail."""

from __future__ import annotations

import torch

import mmpreproj


def perturb_adapters(model: torch.nn.Module, seed: int, scale: float = 0.05) -> None:
    """Add `scale` x N(0, 1) noise to every weight of every loaded adapter in `model` (each slot, each name)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for w in mmpreproj.injected_modules(model):
            for slot in w.adapter_layer_names:
                for module in getattr(w, slot).values():
                    for p in module.parameters():
                        p.add_(scale * torch.randn(p.shape, generator=g))
