"""Fused forward for transformers' `GPTNeoXAttention`: Q/K/V and the skip from one matmul.

It follows `GPTNeoXAttention.forward` line by line (transformers 5.x), using transformers' own rotary
and attention functions; `tests/test_fused.py` checks it against the plain path.
"""

from __future__ import annotations

from typing import Any

import torch

from .qkv_skip import qkv_and_skip

__all__ = ["neox_fused_forward"]


def neox_fused_forward(
    wrapper: Any,
    x_tilde: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    layer_past: Any = None,
    position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`attn(x~) + W_skip·x~` for a GPT-NeoX attention module wrapped by `PreProjAttention`."""
    from transformers.models.gpt_neox.modeling_gpt_neox import (
        ALL_ATTENTION_FUNCTIONS,
        apply_rotary_pos_emb,
        eager_attention_forward,
    )

    attn = wrapper.base_layer
    kwargs.pop("position_ids", None)
    kwargs.pop("use_cache", None)
    input_shape = x_tilde.shape[:-1]
    qkv, skip = qkv_and_skip(x_tilde, attn.query_key_value, wrapper.skip.weight, wrapper.fused_weights)
    qkv = qkv.reshape(*input_shape, -1, 3 * attn.head_size).transpose(1, 2)  # (B, H, S, 3 hd)
    q, k, v = qkv.chunk(3, dim=-1)
    cos, sin = position_embeddings
    q, k = apply_rotary_pos_emb(q, k, cos, sin)
    if layer_past is not None:
        k, v = layer_past.update(k, v, attn.layer_idx)
    interface = ALL_ATTENTION_FUNCTIONS.get_interface(attn.config._attn_implementation, eager_attention_forward)
    out, weights = interface(
        attn, q, k, v, attention_mask, scaling=attn.scaling,
        dropout=0.0 if not attn.training else attn.attention_dropout, **kwargs,
    )
    out = attn.dense(out.reshape(*input_shape, -1).contiguous())
    return out + skip.to(out.dtype), weights
