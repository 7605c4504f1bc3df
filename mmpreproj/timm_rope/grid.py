"""Patch-grid coordinates for 2D RoPE, and the settings that make our `RoPE2D` match a timm rotary embedding.

GridPositions()(3, 5)                       # (15, 2) float32 (row, column), row-major
GridPositions(ref_shape=(16, 16))(8, 8)     # EVA's rescaling: row * 16 / 8, column * 16 / 8
rope, positions = rope_from_timm(eva.rope)  # our RoPE2D + positions equal to timm's RotaryEmbeddingCat
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import torch
from torch import nn

from ..rope import RoPE2D, grid_positions


@dataclass(frozen=True)
class GridPositions:
    """Coordinates of an (h, w) patch grid, flattened row-major: (h*w, 2) float32.

    Args:
        ref_shape: rescale each axis so that the grid spans this reference (pretraining) shape, as EVA does
            (`coord / size * ref`); None keeps integer coordinates.
        offset: added to every coordinate before rescaling (timm `grid_offset`).
        xy: put the column first (timm `grid_indexing='xy'`, naver rope-vit); default (row, column) = 'ij'.
    """

    ref_shape: tuple[int, int] | None = None
    offset: float = 0.0
    xy: bool = False

    def __call__(self, h: int, w: int, device: torch.device | str | None = None) -> torch.Tensor:
        pos = grid_positions(h, w, device=device).to(torch.float32) + self.offset  # (h*w, 2)
        if self.ref_shape is not None:
            # the same operation order as timm's _build_grid: t / size * ref
            size = torch.tensor([h, w], dtype=torch.float32, device=pos.device)
            ref = torch.tensor(self.ref_shape, dtype=torch.float32, device=pos.device)
            pos = pos / size * ref
        return pos.flip(-1) if self.xy else pos


def rope_from_timm(timm_rope: nn.Module) -> tuple[RoPE2D, GridPositions]:
    """Our `RoPE2D` and `GridPositions` reproducing a timm `RotaryEmbeddingCat` (EVA / EVA02 'cat' RoPE).

    Supported: frequency bands from a temperature (`in_pixels=False`, grid type 'index'), 'ij' or 'xy'
    indexing, `ref_feat_shape`, `grid_offset`, interleaved or half pairing, no coordinate augmentation.
    Anything else raises ValueError naming the setting.
    """
    cat = getattr(sys.modules.get("timm.layers.pos_embed_sincos"), "RotaryEmbeddingCat", None)
    if cat is None or type(timm_rope) is not cat:
        raise ValueError(f"rope_from_timm needs a timm RotaryEmbeddingCat, got {type(timm_rope).__name__}")
    r = timm_rope
    if r.in_pixels or getattr(r, "grid_type", "index") != "index":
        raise ValueError(
            "rope_from_timm: in_pixels=True / pixel grids use pixel frequency bands that RoPE2D does not "
            "reproduce (RoPE2D uses theta^(-2k/(D/2)) per axis)"
        )
    if getattr(r, "aug_active", False):
        raise ValueError("rope_from_timm: timm coordinate augmentation (shift/jitter/rescale) is not reproduced")
    if r.grid_indexing not in ("ij", "xy"):
        raise ValueError(f"rope_from_timm: unknown grid_indexing {r.grid_indexing!r}")
    ref = tuple(int(s) for s in r.ref_feat_shape) if r.ref_feat_shape is not None else None
    pairing = "half" if getattr(r, "rotate_half", False) else "interleaved"
    rope = RoPE2D(r.dim, theta=float(r.temperature), pairing=pairing)
    # timm 'xy' swaps the reference shape with the grid, so the column is still rescaled by ref[1]
    return rope, GridPositions(ref_shape=ref, offset=float(r.grid_offset), xy=r.grid_indexing == "xy")
