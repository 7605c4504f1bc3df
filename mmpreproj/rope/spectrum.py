"""Rotary frequency spectra and which position axis drives each rotated pair."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch


def inv_frequencies(rotary_dim: int, theta: float) -> torch.Tensor:
    """theta^(-2k/r) for k < r/2, with r = rotary_dim (not head_dim); (r/2,) float32 on CPU.

    Computed exactly as transformers, timm and diffusers do, so angles match them bit for bit. ValueError for a
    `theta` that is not a finite number > 0 (NaN or inf would give NaN or constant angles without a word).
    """
    ok = isinstance(theta, (int, float)) and not isinstance(theta, bool) and math.isfinite(theta) and theta > 0
    if not ok:
        raise ValueError(f"theta={theta!r}; must be a finite number > 0 (the base of the rotary spectrum)")
    return 1.0 / (theta ** (torch.arange(0, rotary_dim, 2, dtype=torch.float32) / rotary_dim))


def rotary_dim_from_fraction(head_dim: int, rotary_fraction: float) -> int:
    """int(head_dim * rotary_fraction), checked to be even and positive."""
    if not 0.0 < rotary_fraction <= 1.0:
        raise ValueError(f"rotary_fraction must be in (0, 1], got {rotary_fraction}")
    rotary_dim = int(head_dim * rotary_fraction)
    if rotary_dim <= 0 or rotary_dim % 2:
        raise ValueError(
            f"rotary_dim = int(head_dim * rotary_fraction) = int({head_dim} * {rotary_fraction}) = {rotary_dim} "
            "must be even and positive (channels rotate in pairs)"
        )
    return rotary_dim


def axial_spectrum(channels: Sequence[int], theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """One spectrum per axis over its own channels, axes concatenated in order.

    Args:
        channels: rotated channels per axis, each even.
        theta: base of every axis' spectrum.

    Returns:
        inv_freq (sum(channels)/2,) float32 and pair_axis (sum(channels)/2,) int64, the axis of each pair.
    """
    inv_freq = torch.cat([inv_frequencies(c, theta) for c in channels])  # (f,)
    pair_axis = torch.repeat_interleave(torch.arange(len(channels)), torch.tensor(channels) // 2)  # (f,)
    return inv_freq, pair_axis


def shared_spectrum(rotary_dim: int, pairs: Sequence[int], theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """ONE spectrum over rotary_dim, split into consecutive chunks of `pairs` frequencies, chunk i -> axis i.

    This is Qwen2-VL's M-RoPE layout (`mrope_section`); sum(pairs) must be rotary_dim / 2.
    """
    inv_freq = inv_frequencies(rotary_dim, theta)  # (f,)
    pair_axis = torch.repeat_interleave(torch.arange(len(pairs)), torch.tensor(pairs))  # (f,)
    return inv_freq, pair_axis
