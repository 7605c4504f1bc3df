"""Vision features -> decoder tokens: an optional 2x2 merge of neighbouring patches and a small MLP.

(B, h, w, C) -LN-> merge m x m -> (B, h/m, w/m, m*m*C) -> Linear -> GELU -> Linear -> (B, h/m, w/m, D)
"""

from __future__ import annotations

import torch
from einops import rearrange
from torch import nn

__all__ = ["VisionProjector"]


class VisionProjector(nn.Module):
    """LLaVA-style MLP projector after a Qwen2-VL-style spatial merge.

    Args:
        vision_width: C, tower feature width.
        decoder_width: D, the decoder's embedding width.
        merge: m, patches merged per side (1 = no merge, 2 = 2x2).
        hidden: MLP hidden width (default D).
    """

    def __init__(self, vision_width: int, decoder_width: int, merge: int = 2, hidden: int | None = None) -> None:
        super().__init__()
        if merge < 1:
            raise ValueError(f"merge must be >= 1, got {merge}")
        self.merge = merge
        self.norm = nn.LayerNorm(vision_width)
        hidden = hidden or decoder_width
        self.mlp = nn.Sequential(nn.Linear(merge * merge * vision_width, hidden), nn.GELU(),
                                 nn.Linear(hidden, decoder_width))  # fmt: skip

    def forward(self, feats: torch.Tensor) -> torch.Tensor:
        """feats (..., h, w, C) -> (..., h/m, w/m, D)."""
        h, w = feats.shape[-3:-1]
        m = self.merge
        if h % m or w % m:
            raise ValueError(f"a {h}x{w} patch grid cannot be merged {m}x{m}: both sides must be multiples of {m}")
        x = rearrange(self.norm(feats), "... (h m1) (w m2) c -> ... h w (m1 m2 c)", m1=m, m2=m)
        return self.mlp(x)
