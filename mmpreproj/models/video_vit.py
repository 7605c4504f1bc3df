"""`VideoViT`: a video transformer over frame patches or tubelets, from the same `Block` as ViT and text."""

from __future__ import annotations

import torch
from torch import nn

from .encoder import TokenEncoder
from .patch_embed import PatchEmbed
from .positions import TokenPositions


class VideoViT(nn.Module):
    """clips (B, C, T, H, W) -> tubelets -> `TokenEncoder` -> logits (B, num_classes).

    Tokens are flattened t-major then row-major, the order of `grid_positions(t, h, w)`; with
    positions="rope3d" every block rotates q/k by (t, row, column), so clips of any length and size run
    with the same weights (no table to resample).

    Args:
        clip_size: reference (T, H, W); sets the learned table's grid ("learned" positions only).
        patch_size: (p_h, p_w) of each patch, or an int.
        tubelet: frames per token (1 = per-frame patches, Conv3d with kernel (tubelet, p_h, p_w)).
        positions: "rope3d", "rope1d" (flattened index), "learned", "none", or e.g. "learned+rope3d".
        rope3d_sections: channels (t, h, w) of each head for RoPE3D; None = (D/4, 3D/8, 3D/8), D % 16 == 0.
        class_token: prepend and pool a class token (never rotated); else mean-pool.
    """

    def __init__(
        self,
        clip_size: tuple[int, int, int] = (8, 32, 32),
        patch_size: int | tuple[int, int] = 8,
        tubelet: int = 2,
        in_chans: int = 3,
        num_classes: int = 2,
        dim: int = 64,
        depth: int = 4,
        num_heads: int = 4,
        mlp_ratio: float = 4.0,
        positions: str = "rope3d",
        rope3d_sections: tuple[int, int, int] | None = None,
        class_token: bool = False,
        theta: float = 100.0,
    ) -> None:
        super().__init__()
        ph, pw = (patch_size, patch_size) if isinstance(patch_size, int) else patch_size
        patch = (tubelet, ph, pw)
        ref_grid = tuple(s // p for s, p in zip(clip_size, patch))
        self.patch_embed = PatchEmbed(in_chans, dim, patch)
        self.encoder = TokenEncoder(
            TokenPositions(positions, dim, num_heads, ref_grid, theta=theta, rope3d_sections=rope3d_sections),
            dim,
            depth,
            num_heads,
            mlp_ratio,
            class_token=class_token,
            num_classes=num_classes,
        )

    def forward_features(self, clips: torch.Tensor) -> torch.Tensor:
        """(B, C, T, H, W) -> normed tokens `(B, P + t*h*w, dim)`."""
        tokens, grid = self.patch_embed(clips)
        return self.encoder.features(tokens, grid)

    def forward(self, clips: torch.Tensor) -> torch.Tensor:
        tokens, grid = self.patch_embed(clips)  # (B, t*h*w, dim), (t, h, w)
        return self.encoder(tokens, grid)
