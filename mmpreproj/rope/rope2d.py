"""Axial 2D RoPE for image patches: rows and columns, each with its own spectrum over half the channels."""

from __future__ import annotations

from .apply import Pairing
from .base import RotaryEncoder
from .spectrum import axial_spectrum


class RoPE2D(RotaryEncoder):
    """2D axial rotary embedding: `q2, k2 = rope(q, k, pos)`, pos (N, 2) or (B, N, 2) = (row, column).

    Channels [0, D/2) rotate with the row, [D/2, D) with the column, each with the spectrum
    theta^(-2k/(D/2)). With the default interleaved pairing this equals timm's
    `RotaryEmbeddingCat(D, temperature=theta, in_pixels=False, grid_indexing='ij')` + `apply_rot_embed_cat`;
    swap the two position columns for timm's 'xy' (column first, as naver rope-vit axial).

    Args:
        head_dim: D, divisible by 4 (two axes, each rotating pairs).
        theta: base of each axis' spectrum.
        pairing: "interleaved" (timm, default) or "half".
    """

    def __init__(self, head_dim: int, theta: float = 10000.0, pairing: Pairing = "interleaved") -> None:
        if head_dim <= 0 or head_dim % 4:
            raise ValueError(
                f"head_dim must be a positive multiple of 4 for RoPE2D (two axes of head_dim/2 channels, "
                f"rotated in pairs), got head_dim={head_dim}"
            )
        if theta <= 0:
            raise ValueError(f"theta must be positive, got {theta}")
        inv_freq, pair_axis = axial_spectrum((head_dim // 2, head_dim // 2), theta)
        super().__init__(head_dim, head_dim, 2, pairing, inv_freq, pair_axis)
        self.theta = theta

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, theta={self.theta}"
