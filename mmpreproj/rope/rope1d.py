"""RoPE over one axis (token index), as GPT-NeoX (partial, split-half), Llama and GPT-J (interleaved)."""

from __future__ import annotations

import torch

from .apply import Pairing
from .base import RotaryEncoder
from .spectrum import inv_frequencies, rotary_dim_from_fraction


class RoPE1D(RotaryEncoder):
    """1D rotary embedding: `q2, k2 = rope(q, k, pos)`, pos (N,), (B, N), (N, 1) or (B, N, 1).

    Args:
        head_dim: D, channels per head.
        rotary_fraction: the first r = int(D * rotary_fraction) channels rotate (GPT-NeoX `rotary_pct`),
            the rest pass through bit-identical.
        theta: base of the spectrum theta^(-2k/r), r the ROTARY dim.
        pairing: "half" (rotate_half; GPT-NeoX, Llama) or "interleaved" (GPT-J).
    """

    def __init__(
        self,
        head_dim: int,
        rotary_fraction: float = 1.0,
        theta: float = 10000.0,
        pairing: Pairing = "half",
    ) -> None:
        if theta <= 0:
            raise ValueError(f"theta must be positive, got {theta}")
        rotary_dim = rotary_dim_from_fraction(head_dim, rotary_fraction)
        super().__init__(
            head_dim=head_dim,
            rotary_dim=rotary_dim,
            num_axes=1,
            pairing=pairing,
            inv_freq=inv_frequencies(rotary_dim, theta),
            pair_axis=torch.zeros(rotary_dim // 2, dtype=torch.long),
        )
        self.rotary_fraction = rotary_fraction
        self.theta = theta

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, theta={self.theta}"
