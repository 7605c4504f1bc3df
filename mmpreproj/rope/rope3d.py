"""Axial 3D RoPE for video tokens (t, h, w), each axis with its own spectrum over its own channels."""

from __future__ import annotations

from collections.abc import Sequence

from .apply import Pairing
from .base import RotaryEncoder
from .spectrum import axial_spectrum


def _default_sections(head_dim: int) -> tuple[int, int, int]:
    """diffusers' split: t = D/4, h = w = 3D/8 channels; needs D divisible by 16."""
    if head_dim <= 0 or head_dim % 16:
        raise ValueError(
            f"the default sections (t, h, w) = (D/4, 3D/8, 3D/8) need head_dim divisible by 16, "
            f"got head_dim={head_dim}; pass sections=(c_t, c_h, c_w) (even, summing to head_dim)"
        )
    return head_dim // 4, head_dim // 8 * 3, head_dim // 8 * 3


def _check_sections(sections: Sequence[int], head_dim: int) -> tuple[int, int, int]:
    s = tuple(sections)
    if len(s) != 3 or any(not isinstance(c, int) or c <= 0 or c % 2 for c in s):
        raise ValueError(f"sections must be 3 positive even channel counts (t, h, w), got {sections}")
    if sum(s) != head_dim:
        raise ValueError(f"sections must sum to head_dim={head_dim}, got {s} (sum {sum(s)})")
    return s


class RoPE3D(RotaryEncoder):
    """3D axial rotary embedding: `q2, k2 = rope(q, k, pos)`, pos (N, 3) or (B, N, 3) = (t, h, w).

    Channels are split [t | h | w] by `sections` (in channels); each axis has its own spectrum
    theta^(-2k/c_axis). The default (D/4, 3D/8, 3D/8) with interleaved pairing equals diffusers'
    `get_3d_rotary_pos_embed` + `apply_rotary_emb` (CogVideoX) on the grid from `grid_positions(t, h, w)`.

    Args:
        head_dim: D.
        theta: base of each axis' spectrum.
        pairing: "interleaved" (diffusers, default) or "half".
        sections: channels per axis (c_t, c_h, c_w), each even, summing to D; None = (D/4, 3D/8, 3D/8).
    """

    def __init__(
        self,
        head_dim: int,
        theta: float = 10000.0,
        pairing: Pairing = "interleaved",
        sections: Sequence[int] | None = None,
    ) -> None:
        if theta <= 0:
            raise ValueError(f"theta must be positive, got {theta}")
        sections = _default_sections(head_dim) if sections is None else _check_sections(sections, head_dim)
        inv_freq, pair_axis = axial_spectrum(sections, theta)
        super().__init__(head_dim, head_dim, 3, pairing, inv_freq, pair_axis)
        self.theta = theta
        self.sections = sections

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, theta={self.theta}, sections={self.sections}"
