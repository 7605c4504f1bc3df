"""Which (t, h, w) axis drives each rotary frequency pair: Qwen2-VL's chunks or Qwen3-VL's interleaving.

One shared spectrum theta^(-2k/r), k < r/2 (k = 0 is the fastest pair), split over the three axes:

    "chunked"      (Qwen2-VL `mrope_section`)   k: t t t t h h h h h h w w w w w w   (sections (4, 6, 6))
    "interleaved"  (Qwen3-VL)                   k: t h w t h w t h w t h w t h w t   (sections (6, 5, 5))

With "chunked", the w axis gets only the slowest pairs: over a grid a few tokens wide they barely turn, so
columns are hard to tell apart. "interleaved" gives every axis fast and slow pairs.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .base import RotaryEncoder
from .mrope import MultimodalRoPE
from .spectrum import inv_frequencies, rotary_dim_from_fraction

MROPE_LAYOUTS = ("chunked", "interleaved")
"""How M-RoPE lays its three axes over the channels: Qwen2-VL's chunks or Qwen3-VL's interleave."""


def default_sections(rotary_dim: int, layout: str = "chunked") -> tuple[int, int, int]:
    """Frequency pairs per (t, h, w): chunked h = w = 3/8 of the pairs ([16, 24, 24] at r = 128, Qwen2-VL);
    interleaved h = w = 1/3 of the pairs, t the rest."""
    if layout not in MROPE_LAYOUTS:
        raise ValueError(f"layout must be one of {MROPE_LAYOUTS}, got {layout!r}")
    if rotary_dim <= 0 or rotary_dim % 2:
        raise ValueError(f"rotary_dim must be even and positive, got {rotary_dim}")
    pairs = rotary_dim // 2
    hw = (3 * pairs) // 8 if layout == "chunked" else pairs // 3
    if hw == 0 or pairs - 2 * hw <= 0:
        raise ValueError(f"rotary_dim={rotary_dim} has too few frequency pairs ({pairs}) to split over t, h, w")
    return pairs - 2 * hw, hw, hw


class InterleavedMultimodalRoPE(RotaryEncoder):
    """Qwen3-VL's interleaved M-RoPE: `q2, k2 = rope(q, k, pos)`, pos (N, 3) or (B, N, 3) = (t, h, w).

    Pair k turns with h when k % 3 == 1 and k < 3 * sections[1], with w when k % 3 == 2 and
    k < 3 * sections[2], otherwise with t (transformers `Qwen3VLTextRotaryEmbedding`), split-half pairing.
    Text tokens (t = h = w) get exactly 1D RoPE.

    Args:
        head_dim: D.
        sections: frequency pairs per axis (t, h, w), summing to r / 2 (Qwen3-VL: (24, 20, 20) at r = 128).
        theta: base of the shared spectrum.
        rotary_fraction: r = int(D * rotary_fraction); channels past r pass through.
    """

    def __init__(
        self, head_dim: int, sections: Sequence[int], theta: float = 10000.0, rotary_fraction: float = 1.0
    ) -> None:
        if theta <= 0:
            raise ValueError(f"theta must be positive, got {theta}")
        rotary_dim = rotary_dim_from_fraction(head_dim, rotary_fraction)
        pairs = rotary_dim // 2
        s = tuple(sections)
        if len(s) != 3 or any(not isinstance(c, int) or c <= 0 for c in s) or sum(s) != pairs:
            raise ValueError(
                f"sections must be 3 positive ints (t, h, w) summing to rotary_dim / 2 = {pairs}, got {s}"
            )
        pair_axis = torch.zeros(pairs, dtype=torch.long)  # (f,): t unless claimed by h or w
        for axis in (1, 2):
            pair_axis[axis : 3 * s[axis] : 3] = axis
        if (pair_axis == 1).sum() != s[1] or (pair_axis == 2).sum() != s[2]:
            raise ValueError(f"sections {s}: h and w need 3 * their pairs - 1 <= {pairs} to interleave")
        super().__init__(head_dim, rotary_dim, 3, "half", inv_frequencies(rotary_dim, theta), pair_axis)
        self.sections = s
        self.theta = theta
        self.rotary_fraction = rotary_fraction

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, theta={self.theta}, sections={self.sections}, layout='interleaved'"


def make_mrope(
    head_dim: int,
    layout: str = "chunked",
    sections: Sequence[int] | None = None,
    theta: float = 10000.0,
    rotary_fraction: float = 1.0,
) -> RotaryEncoder:
    """A 3-axis M-RoPE of the given layout (`MultimodalRoPE` for "chunked")."""
    sections = tuple(sections or default_sections(rotary_dim_from_fraction(head_dim, rotary_fraction), layout))
    if layout == "chunked":
        return MultimodalRoPE(head_dim, sections, theta, rotary_fraction)
    if layout == "interleaved":
        return InterleavedMultimodalRoPE(head_dim, sections, theta, rotary_fraction)
    raise ValueError(f"layout must be one of {MROPE_LAYOUTS}, got {layout!r}")
