"""Fused forward for mmpreproj's own `SelfAttention`: Q/K/V and the skip from one matmul."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
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
    b, n, _ = x_tilde.shape
    qkv, skip = qkv_and_skip(x_tilde, attn.qkv, wrapper.skip.weight, wrapper.fused_weights)
    q, k, v = rearrange(qkv, "b n (three h d) -> three b h n d", three=3, h=attn.num_heads)
    if attn.rope is not None:
        if pos is None:
            raise ValueError("this attention has a rope: pass pos (the token coordinates)")
        q, k = attn.rope(q, k, pos, num_prefix_tokens=num_prefix_tokens)
    past = 0
    if cache is not None:
        past = len(cache)
        k, v = cache.update(k, v)
    mask = attn._mask(attn_mask, b, n, past + n, past, x_tilde.device)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    return attn.proj(rearrange(out, "b h n d -> b n (h d)")) + skip
