"""`RotaryAttention`: a timm ViT / EVA attention module that applies one of our rotary encoders to q and k.

It keeps the host attention as `base_layer` and uses its weights as they are (qkv or q/k/v projections,
q_norm/k_norm, attn_drop, norm, gate, proj, proj_drop); only the rotation between `q, k` and SDPA is ours:

    q, k, v = qkv(x)  ->  q, k = q_norm(q), k_norm(k)  ->  q, k = rope(q, k, pos, num_prefix_tokens)
    ->  SDPA  ->  norm  ->  gate  ->  proj  ->  proj_drop

Positions are an explicit argument of every call (`pos=`; timm's EvaBlock passes them as `rope=`),
never kept on the module. Prefix tokens (class / register tokens) are not rotated.

Axis legend: b - batch, h - heads, n - tokens, d - head channels.
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn

from ..modules.base_wrapper import BaseLayerWrapper


def _timm_class(module: str, name: str) -> type | None:
    return getattr(sys.modules.get(module), name, None)


def supported_attention(attn: nn.Module) -> bool:
    """True for the exact timm classes `RotaryAttention` knows how to read: `Attention` and `EvaAttention`."""
    classes = (_timm_class("timm.layers.attention", "Attention"), _timm_class("timm.models.eva", "EvaAttention"))
    return type(attn) in tuple(c for c in classes if c is not None)


class RotaryAttention(BaseLayerWrapper):
    """A timm `Attention` / `EvaAttention` with our rotary encoder between q/k and SDPA.

    Args:
        base_layer: the host attention (kept whole; `get_base_layer()` gives it back).
        rope: a rotary encoder with the `mmpreproj.rope` call convention (e.g. `RoPE2D(head_dim)`).
        num_prefix_tokens: leading tokens left unrotated (class + register tokens).
    """

    def __init__(self, base_layer: nn.Module, rope: nn.Module, num_prefix_tokens: int) -> None:
        super().__init__()
        if not supported_attention(base_layer):
            raise TypeError(
                f"RotaryAttention supports timm Attention and EvaAttention, got {type(base_layer).__name__}"
            )
        if getattr(rope, "head_dim", base_layer.head_dim) != base_layer.head_dim:
            raise ValueError(f"rope has head_dim={rope.head_dim}, the attention has head_dim={base_layer.head_dim}")
        self.base_layer = base_layer
        self.rope = rope
        # not `num_prefix_tokens`: EvaAttention has an attribute of that name, and the wrapper would write it there
        self.unrotated_prefix = int(num_prefix_tokens)

    def _qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(B, N, C) -> q, k, v (B, H, N, D), exactly as the host computes them."""
        base = self.base_layer
        heads = base.num_heads
        if getattr(base, "qkv", None) is None:  # EvaAttention(qkv_fused=False)
            q, k, v = (
                rearrange(p(x), "b n (h d) -> b h n d", h=heads) for p in (base.q_proj, base.k_proj, base.v_proj)
            )
            return q, k, v
        q_bias = getattr(base, "q_bias", None)  # EvaAttention(qkv_fused=True, qkv_bias=True): no k bias
        if q_bias is None:
            qkv = base.qkv(x)
        elif base.qkv_bias_separate:
            qkv = base.qkv(x) + torch.cat((q_bias, base.k_bias, base.v_bias))
        else:
            qkv = F.linear(x, base.qkv.weight, torch.cat((q_bias, base.k_bias, base.v_bias)))
        q, k, v = rearrange(qkv, "b n (three h d) -> three b h n d", three=3, h=heads)
        return q, k, v

    def forward(
        self,
        x: torch.Tensor,
        attn_mask: torch.Tensor | None = None,
        is_causal: bool = False,
        pos: torch.Tensor | None = None,
        rope: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """x: (B, N, C); pos: (N - P, A) or (B, N - P, A) coordinates of the patch tokens.

        `rope` is the name timm's EvaBlock uses for the same argument (after `add_rope`, an Eva model's
        `rope` module returns our positions, so the block hands them down unchanged).
        """
        pos = pos if pos is not None else rope
        if pos is None:
            raise ValueError(
                "RotaryAttention needs the patch positions (pos=...): call the model itself; a timm ViT with "
                "add_rope computes them in forward_features (forward_intermediates and bare blocks do not)"
            )
        base = self.base_layer
        b, n, _ = x.shape
        gate = base.gate(x).sigmoid() if getattr(base, "gate", None) is not None else None
        q, k, v = self._qkv(x)  # (b, h, n, d) each
        q, k = base.q_norm(q), base.k_norm(k)
        q, k = self.rope(q, k, pos, num_prefix_tokens=self.unrotated_prefix)
        dropout = base.attn_drop.p if self.training else 0.0
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout, is_causal=is_causal)
        out = rearrange(out, "b h n d -> b n (h d)")
        out = getattr(base, "norm", nn.Identity())(out)
        if gate is not None:
            out = out * gate
        return base.proj_drop(base.proj(out))

    def extra_repr(self) -> str:
        return f"unrotated_prefix={self.unrotated_prefix}"
