"""Patch embeddings: image patches (Conv2d) or video tubelets (Conv3d), flattened row-major / t-major."""

from __future__ import annotations

import torch
from einops import rearrange
from torch import nn


class PatchEmbed(nn.Module):
    """Cut the input into non-overlapping patches and project each to `dim`.

    Args:
        in_chans: input channels.
        dim: token width.
        patch: (p_h, p_w) for images (Conv2d) or (p_t, p_h, p_w) for video tubelets (Conv3d);
            p_t = 1 embeds every frame on its own.

    `forward(x)` takes (B, C, H, W) or (B, C, T, H, W) and returns tokens (B, N, dim) with the grid
    (h, w) or (t, h, w) they came from; N = prod(grid), flattened t-major then row-major, the order of
    `mmpreproj.rope.grid_positions(*grid)`. Trailing pixels that do not fill a patch are dropped.
    """

    def __init__(self, in_chans: int, dim: int, patch: tuple[int, ...]) -> None:
        super().__init__()
        if len(patch) not in (2, 3) or any(p <= 0 for p in patch):
            raise ValueError(f"patch must be (p_h, p_w) or (p_t, p_h, p_w) of positive ints, got {patch}")
        conv = nn.Conv2d if len(patch) == 2 else nn.Conv3d
        self.patch = tuple(patch)
        self.proj = conv(in_chans, dim, kernel_size=self.patch, stride=self.patch)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, tuple[int, ...]]:
        if x.ndim != len(self.patch) + 2:
            raise ValueError(
                f"expected a {len(self.patch) + 2}-D input (B, C, {'T, ' * (len(self.patch) == 3)}H, W), "
                f"got shape {tuple(x.shape)}"
            )
        small = [s for s, p in zip(x.shape[2:], self.patch) if s < p]
        if small:
            raise ValueError(f"input {tuple(x.shape[2:])} is smaller than one patch {self.patch}")
        x = self.proj(x)  # (B, dim, [t,] h, w)
        grid = tuple(int(s) for s in x.shape[2:])
        return rearrange(x, "b d ... -> b (...) d"), grid
