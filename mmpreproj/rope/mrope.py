"""Qwen2-VL multimodal RoPE (M-RoPE): one shared spectrum, split into (t, h, w) chunks of frequency pairs."""

from __future__ import annotations

from collections.abc import Sequence

from .base import RotaryEncoder
from .spectrum import rotary_dim_from_fraction, shared_spectrum


class MultimodalRoPE(RotaryEncoder):
    """M-RoPE: `q2, k2 = rope(q, k, pos)`, pos (N, 3) or (B, N, 3) = (t, h, w), e.g. from `multimodal_positions`.

    The spectrum theta^(-2k/r) over the r rotary channels is split into consecutive chunks of
    `sections` frequency pairs driven by t, h and w (Qwen2-VL's `mrope_section`), split-half pairing.
    Equals transformers' `Qwen2VLRotaryEmbedding` + qwen2_vl `apply_rotary_pos_emb` in float32; text tokens
    (t = h = w) get exactly `RoPE1D(head_dim, rotary_fraction, theta)`. In bf16 / fp16 the two differ by rounding:
    this rotates in float32 and rounds once, transformers rounds cos / sin to the input's dtype first.

    Args:
        head_dim: D.
        sections: frequency pairs per axis (t, h, w), summing to r / 2 (e.g. (16, 24, 24) for r = 128).
        theta: base of the shared spectrum.
        rotary_fraction: r = int(D * rotary_fraction) (GPT-NeoX hosts); channels past r pass through.
    """

    def __init__(
        self,
        head_dim: int,
        sections: Sequence[int],
        theta: float = 10000.0,
        rotary_fraction: float = 1.0,
    ) -> None:
        if theta <= 0:
            raise ValueError(f"theta must be positive, got {theta}")
        rotary_dim = rotary_dim_from_fraction(head_dim, rotary_fraction)
        s = tuple(sections)
        if len(s) != 3 or any(not isinstance(c, int) or c <= 0 for c in s):
            raise ValueError(f"sections must be 3 positive frequency-pair counts (t, h, w), got {sections}")
        if sum(s) != rotary_dim // 2:
            raise ValueError(
                f"sections must sum to rotary_dim / 2 = {rotary_dim // 2} (frequency pairs; rotary_dim = "
                f"int({head_dim} * {rotary_fraction}) = {rotary_dim}), got {s} (sum {sum(s)})"
            )
        inv_freq, pair_axis = shared_spectrum(rotary_dim, s, theta)
        super().__init__(head_dim, rotary_dim, 3, "half", inv_freq, pair_axis)
        self.sections = s
        self.theta = theta
        self.rotary_fraction = rotary_fraction

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, theta={self.theta}, sections={self.sections}"
