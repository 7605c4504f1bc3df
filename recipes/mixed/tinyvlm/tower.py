"""The vision tower: images (B, 3, H, W) -> patch features on their grid (B, H/p, W/p, C), any resolution.

`PatchTower` is a small encoder from `Block`s with 2D RoPE (`rope=True`) or none at all (`depth=0`: a
per-patch MLP that carries no position, so every spatial cue must come from the decoder's positions).
`MixedModel` needs of a tower only `forward`, `patch_size` and `width` (C).
"""

from __future__ import annotations

import torch
from einops import rearrange
from torch import nn

from mmpreproj.modules.block import Block
from mmpreproj.rope import RoPE2D, grid_positions

__all__ = ["PatchTower", "check_image_size"]


def check_image_size(shape: torch.Size | tuple[int, ...], multiple: int, what: str = "image") -> None:
    """Raise unless the last two dims (H, W) are positive multiples of `multiple`."""
    h, w = shape[-2], shape[-1]
    if h <= 0 or w <= 0 or h % multiple or w % multiple:
        raise ValueError(f"{what} of size {h}x{w}: height and width must be multiples of {multiple} "
                         "(patch size x merge)")  # fmt: skip


class PatchTower(nn.Module):
    """Conv patch embedding, then `depth` pre-norm `Block`s with axial 2D RoPE (or none), then a LayerNorm.

    Args:
        patch_size: p, pixels per patch side.
        width: C, feature width.
        depth: transformer blocks (0: a position-free per-patch MLP instead).
        num_heads: heads per block.
        rope: rotate by (row, column) inside the tower; False leaves the tower position-free.
    """

    def __init__(self, patch_size: int = 4, width: int = 64, depth: int = 2, num_heads: int = 2,
                 rope: bool = True) -> None:  # fmt: skip
        super().__init__()
        self.patch_size = patch_size
        self.width = width
        self.embed = nn.Conv2d(3, width, patch_size, stride=patch_size)
        self.rope = RoPE2D(width // num_heads) if rope and depth else None
        self.blocks = nn.ModuleList(Block(width, num_heads, rope=self.rope) for _ in range(depth))
        self.mlp = nn.Sequential(nn.GELU(), nn.Linear(width, width)) if depth == 0 else None
        self.norm = nn.LayerNorm(width)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        check_image_size(images.shape, self.patch_size)
        x = self.embed(images)  # (B, C, h, w)
        h, w = x.shape[-2:]
        x = rearrange(x, "b c h w -> b (h w) c")
        if self.mlp is not None:
            x = x + self.mlp(x)
        pos = grid_positions(h, w, device=x.device) if self.rope is not None else None  # (h*w, 2)
        for block in self.blocks:
            x = block(x, pos=pos)
        return rearrange(self.norm(x), "b (h w) c -> b h w c", h=h)
