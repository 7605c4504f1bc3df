"""Fused forward for mmpreproj's own `SelfAttention`: Q/K/V and the skip from one matmul."""

from __future__ import annotations

from typing import Any

import torch
from einops import rearrange

from .qkv_skip import qkv_and_skip

__all__ = ["native_fused_forward"]


def native_fused_forward(
    wrapper: Any,
    x_tilde: torch.Tensor,
    pos: torch.Tensor | None = None,
    num_prefix_tokens: int = 0,
    attn_mask: torch.Tensor | None = None,
    cache: Any = None,
) -> torch.Tensor:
    """`attn(x~) + W_skip·x~` for a `SelfAttention` wrapped by `PreProjAttention`."""
    attn = wrapper.base_layer
    qkv, skip = qkv_and_skip(x_tilde, attn.qkv, wrapper.skip.weight, wrapper.fused_weights)
    q, k, v = rearrange(qkv, "b n (three h d) -> three b h n d", three=3, h=attn.num_heads)
    return attn.attend(q, k, v, pos, num_prefix_tokens, attn_mask, cache) + skip
