"""`ViT`: a small native vision transformer built from `mmpreproj.modules.Block`, positions of your choice."""

from __future__ import annotations

import torch
from torch import nn

from .encoder import TokenEncoder
from .patch_embed import PatchEmbed
from .positions import TokenPositions


def _pair(x: int | tuple[int, int]) -> tuple[int, int]:
    return (x, x) if isinstance(x, int) else (int(x[0]), int(x[1]))


class ViT(nn.Module):
    """images (B, C, H, W) -> patches -> `TokenEncoder` -> logits (B, num_classes).

    Args:
        img_size: the reference size (H, W); it sets the learned table's grid. Any other size runs too:
            the table is resampled, rotary positions follow the grid.
        patch_size: square or (p_h, p_w) patches.
        positions: "learned", "rope2d", "rope1d" (flattened index), "none", or "learned+rope2d" etc.
        class_token: prepend (and pool) a class token, never rotated; else mean-pool the patch tokens.
        theta: rotary base.
    """

    def __init__(
        self,
        img_size: int | tuple[int, int] = 32,
        patch_size: int | tuple[int, int] = 4,
        in_chans: int = 3,
        num_classes: int = 10,
        dim: int = 96,
        depth: int = 4,
        num_heads: int = 4,
        mlp_ratio: float = 4.0,
        positions: str = "learned",
        class_token: bool = True,
        theta: float = 100.0,
    ) -> None:
        super().__init__()
        img, patch = _pair(img_size), _pair(patch_size)
        ref_grid = (img[0] // patch[0], img[1] // patch[1])
        self.patch_embed = PatchEmbed(in_chans, dim, patch)
        self.encoder = TokenEncoder(
            TokenPositions(positions, dim, num_heads, ref_grid, theta=theta),
            dim,
            depth,
            num_heads,
            mlp_ratio,
            class_token=class_token,
            num_classes=num_classes,
        )

    def forward_features(self, images: torch.Tensor) -> torch.Tensor:
        """(B, C, H, W) -> normed tokens `(B, P + h*w, dim)`."""
        tokens, grid = self.patch_embed(images)
        return self.encoder.features(tokens, grid)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        tokens, grid = self.patch_embed(images)  # (B, h*w, dim), (h, w)
        return self.encoder(tokens, grid)
