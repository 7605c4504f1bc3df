"""Token positions for the native ViT and VideoViT: a learned table, a rotary encoder, both, or none.

A position spec is a "+"-joined string: "learned", "rope2d", "learned+rope2d", "rope1d", "none", ...

- "learned": an absolute table over a reference grid, added to the patch tokens; resampled (bicubic in 2D,
  trilinear in 3D) when a different grid comes in, so other image sizes / clip lengths still run.
- "rope1d": RoPE over the flattened token index (row-major; t-major for video).
- "rope2d": axial RoPE over (row, column); "rope3d": axial RoPE over (t, row, column).
Rotary positions are computed from the grid of every call; nothing is stored between calls.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn

from ..rope import RoPE1D, RoPE2D, RoPE3D, grid_positions

ROPES = {"rope1d": 1, "rope2d": 2, "rope3d": 3}  # kind -> number of grid axes it needs (1 = any)


def parse_positions(spec: str, grid_axes: int) -> tuple[bool, str | None]:
    """("learned" in spec, the rope kind or None); ValueError for unknown or mismatched kinds."""
    parts = [p for p in spec.split("+") if p]
    allowed = {"learned", "none", "rope1d", f"rope{grid_axes}d"}
    bad = [p for p in parts if p not in allowed]
    ropes = [p for p in parts if p in ROPES]
    if not parts or bad or len(ropes) > 1 or ("none" in parts and len(parts) > 1):
        raise ValueError(
            f"positions={spec!r}: use one or two of {sorted(allowed)} joined by '+', at most one rope "
            f"(this model has a {grid_axes}D grid)"
        )
    return "learned" in parts, (ropes[0] if ropes else None)


class LearnedPositions(nn.Module):
    """An absolute table `(1, dim, *ref_grid)` of learned vectors; `forward(grid)` -> (prod(grid), dim).

    Args:
        dim: token width.
        ref_grid: the grid the table is stored for (2 or 3 axes).
        init_std: N(0, init_std) init (timm: 0.02).
    """

    def __init__(self, dim: int, ref_grid: tuple[int, ...], init_std: float = 0.02) -> None:
        super().__init__()
        if len(ref_grid) not in (2, 3):
            raise ValueError(f"ref_grid must have 2 or 3 axes, got {ref_grid}")
        self.ref_grid = tuple(int(s) for s in ref_grid)
        self.table = nn.Parameter(torch.randn(1, dim, *self.ref_grid) * init_std)

    def forward(self, grid: tuple[int, ...]) -> torch.Tensor:
        table = self.table
        if tuple(grid) != self.ref_grid:
            mode = "bicubic" if len(grid) == 2 else "trilinear"
            table = F.interpolate(table, size=tuple(grid), mode=mode, align_corners=False)
        return rearrange(table, "1 d ... -> (...) d")  # (prod(grid), dim), row-major / t-major


class TokenPositions(nn.Module):
    """Everything position-related of a native model: the optional table and the optional shared rope.

    Args:
        spec: position spec (module docstring).
        dim, num_heads: model width and heads (the rope acts on dim // num_heads channels).
        ref_grid: grid of the learned table ((h, w) or (t, h, w)); also fixes the number of grid axes.
        theta: rotary base (100 by default, as naver rope-vit; small grids need no long wavelengths).
        rope3d_sections: channels (t, h, w) of RoPE3D; None = (D/4, 3D/8, 3D/8).
    """

    def __init__(
        self,
        spec: str,
        dim: int,
        num_heads: int,
        ref_grid: tuple[int, ...],
        theta: float = 100.0,
        rope3d_sections: tuple[int, int, int] | None = None,
    ) -> None:
        super().__init__()
        learned, kind = parse_positions(spec, len(ref_grid))
        self.spec = spec
        self.kind = kind
        self.table = LearnedPositions(dim, ref_grid) if learned else None
        head_dim = dim // num_heads
        self.rope: nn.Module | None = None
        if kind == "rope1d":
            self.rope = RoPE1D(head_dim, theta=theta)
        elif kind == "rope2d":
            self.rope = RoPE2D(head_dim, theta=theta)
        elif kind == "rope3d":
            self.rope = RoPE3D(head_dim, theta=theta, sections=rope3d_sections)

    def add_table(self, tokens: torch.Tensor, grid: tuple[int, ...]) -> torch.Tensor:
        """tokens (B, prod(grid), dim) + the learned table (if any)."""
        return tokens if self.table is None else tokens + self.table(grid).to(tokens.dtype)

    def rotary(self, grid: tuple[int, ...], device: torch.device) -> torch.Tensor | None:
        """The rope's positions for the grid's tokens: (N,) for rope1d, (N, A) otherwise; None without a rope."""
        if self.kind is None:
            return None
        if self.kind == "rope1d":
            return torch.arange(math.prod(grid), device=device)
        return grid_positions(*grid, device=device)

    def extra_repr(self) -> str:
        return f"spec={self.spec!r}"
