"""Rotating channel pairs by given angles, for the two pairings ("half" and "interleaved").

Axis legend: b - batch, h - heads, n - tokens, d - head channels, r - rotary channels, f = r / 2 pairs.
"""

from __future__ import annotations

from typing import Literal

import torch
from einops import rearrange

Pairing = Literal["half", "interleaved"]
"""Which channels rotate together: `half` (x_i with x_{i+d/2}) or `interleaved` (x_2i with x_2i+1)."""
PAIRINGS: tuple[str, ...] = ("half", "interleaved")
"""The values `Pairing` allows, for checks of a string read at run time."""


def check_pairing(pairing: str) -> None:
    """Raise ValueError unless `pairing` is one of PAIRINGS."""
    if pairing not in PAIRINGS:
        raise ValueError(f"pairing must be one of {PAIRINGS}, got {pairing!r}")


def expand_pairs(f: torch.Tensor, pairing: str) -> torch.Tensor:
    """Lay out per-pair values (..., f) over the rotary channels (..., 2f).

    "half":        [f0 f1 .. | f0 f1 ..]  (cat(f, f), as GPT-NeoX / Llama / Qwen2-VL)
    "interleaved": [f0 f0 f1 f1 ..]       (repeat_interleave(f, 2), as GPT-J / timm / diffusers)
    """
    check_pairing(pairing)
    if pairing == "half":
        return torch.cat((f, f), dim=-1)
    return rearrange([f, f], "two ... f -> ... (f two)")


def _pairs_last(x: torch.Tensor) -> torch.Tensor:
    """(..., 2f) -> (..., f, 2) view that torch.view_as_complex accepts (copying only if strides forbid it)."""
    pairs = x.unflatten(-1, (-1, 2))
    if x.stride(-1) != 1 or x.storage_offset() % 2 or any(st % 2 for st in x.stride()[:-1]):
        pairs = pairs.contiguous()
    return pairs


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, pairing: str) -> torch.Tensor:
    """Rotate the first 2f channels of x by angles with the given cos/sin; the rest pass through unchanged.

    Args:
        x: (B, H, N, D) queries or keys, any float dtype.
        cos, sin: (B or 1, N, f) float32, one value per rotated pair.
        pairing: "half" pairs channel i with i + f; "interleaved" pairs 2i with 2i + 1.

    The rotation is computed in float32 and cast back to x.dtype. Per pair (a, b):
    a' = a cos - b sin, b' = b cos + a sin, rounded exactly as `x * cos + rotate(x) * sin` (transformers,
    timm, diffusers) rounds it.
    """
    check_pairing(pairing)
    r = 2 * cos.shape[-1]
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)  # (B, 1, N, f)
    x_rot = x[..., :r].float()  # (B, H, N, r)
    if pairing == "half":
        # x: [x0 x1 .. | y0 y1 ..]  partner: [y0 y1 .. | x0 x1 ..]
        # out = x * [c | c] + partner * [-s | s] = [x0 c - y0 s .. | y0 c + x0 s ..]
        a, b = x_rot.chunk(2, dim=-1)  # (B, H, N, f) each
        partner = torch.cat((b, a), dim=-1)  # (B, H, N, r)
        out = x_rot * torch.cat((cos, cos), dim=-1) + partner * torch.cat((-sin, sin), dim=-1)
    else:
        # x: [x0 y0 x1 y1 ..]  out: [x0 c - y0 s, y0 c + x0 s, x1 c - y1 s, y1 c + x1 s ..]
        # Adjacent pairs are complex numbers x + iy; the rotation is one complex product with c + is,
        # the same four products as the real form and several times faster than strided real arithmetic.
        z = torch.view_as_complex(_pairs_last(x_rot))  # (B, H, N, f) complex64
        out = torch.view_as_real(z * torch.complex(cos, sin)).flatten(-2)  # (B, H, N, r)
    out = out.to(x.dtype)  # (B, H, N, r)
    if r == x.shape[-1]:
        return out
    return torch.cat((out, x[..., r:]), dim=-1)  # (B, H, N, D), pass-through channels untouched
