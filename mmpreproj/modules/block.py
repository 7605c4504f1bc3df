"""A native pre-norm transformer block whose positional encoder is passed in.

One block class for every modality: the same attention (and, once injected, the same pre-projection and
content skip) serves text, image patches and video tubelets; only the `rope` given to the attention
differs (`RoPE1D`, `RoPE2D`, `RoPE3D`, `MultimodalRoPE`, or None for learned/absolute positions).

    x = x + attn(norm1(x), pos)          # inject() turns this into  x + attn(x~, pos) + W_skip·x~
    x = x + mlp(norm2(x))

Axis legend: b - batch, h - heads, n - tokens, d - head channels.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn


@dataclass
class KVCache:
    """Keys and values of one attention layer so far, (B, H, T, D) each; passed in, never stored on a module."""

    k: torch.Tensor | None = None
    v: torch.Tensor | None = None
    _len: int = field(default=0, repr=False)

    def __len__(self) -> int:
        return 0 if self.k is None else self.k.shape[2]

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append the new keys/values and return the whole cache."""
        self.k = k if self.k is None else torch.cat([self.k, k], dim=2)
        self.v = v if self.v is None else torch.cat([self.v, v], dim=2)
        return self.k, self.v

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.k, self.v) if t is not None)


class SelfAttention(nn.Module):
    """Multi-head self-attention with a fused qkv Linear and an optional rotary encoder.

    Args:
        dim: model width.
        num_heads: heads (dim must divide evenly).
        rope: a rotary encoder following `mmpreproj.rope`'s call convention, or None.
        causal: mask future tokens (decoders).
        qkv_bias: bias on the qkv projection.
    """

    def __init__(
        self, dim: int, num_heads: int, rope: nn.Module | None = None, causal: bool = False, qkv_bias: bool = True
    ) -> None:
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"dim={dim} must be divisible by num_heads={num_heads}")
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        rope_dim = getattr(rope, "head_dim", self.head_dim)  # an encoder of `mmpreproj.rope` says its head dim
        if rope_dim != self.head_dim:
            raise ValueError(
                f"rope has head_dim={rope_dim}, but this attention's heads have dim // num_heads = {self.head_dim}"
            )
        self.causal = causal
        self.qkv = nn.Linear(dim, 3 * dim, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)
        self.rope = rope

    def forward(
        self,
        x: torch.Tensor,
        pos: torch.Tensor | None = None,
        num_prefix_tokens: int = 0,
        attn_mask: torch.Tensor | None = None,
        cache: KVCache | None = None,
    ) -> torch.Tensor:
        """x: (B, N, dim); pos: positions of the rotated tokens; attn_mask: bool (B, Nk) keep-mask of keys
        (padding) or (B, 1|H, N, Nk); cache: keys/values of earlier tokens, extended in place."""
        q, k, v = rearrange(self.qkv(x), "b n (three h d) -> three b h n d", three=3, h=self.num_heads)
        return self.attend(q, k, v, pos, num_prefix_tokens, attn_mask, cache)

    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        pos: torch.Tensor | None = None,
        num_prefix_tokens: int = 0,
        attn_mask: torch.Tensor | None = None,
        cache: KVCache | None = None,
    ) -> torch.Tensor:
        """Everything after the qkv projection: rope, cache, mask, attention, output projection.
        q, k, v: (B, H, N, D) -> (B, N, dim)."""
        b, _, n, _ = q.shape
        if self.rope is not None:
            if pos is None:
                raise ValueError("this attention has a rope: pass pos (the token coordinates)")
            q, k = self.rope(q, k, pos, num_prefix_tokens=num_prefix_tokens)
        past = 0
        if cache is not None:
            past = len(cache)
            k, v = cache.update(k, v)
        mask = self._mask(attn_mask, b, n, past + n, past, q.device)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # (b, h, n, d)
        return self.proj(rearrange(out, "b h n d -> b n (h d)"))

    def _mask(
        self, attn_mask: torch.Tensor | None, b: int, n: int, nk: int, past: int, device: torch.device
    ) -> torch.Tensor | None:
        """A bool (B|1, 1|H, N, Nk) mask: True = attend. Query i sits at key position past + i."""
        mask = None
        if self.causal:
            qi = torch.arange(n, device=device)[:, None] + past
            mask = (torch.arange(nk, device=device)[None, :] <= qi)[None, None]  # (1, 1, n, nk)
        if attn_mask is not None:
            keep = attn_mask.bool()
            if keep.ndim == 2:  # (B, Nk) key padding
                keep = keep[:, None, None, :]
            mask = keep if mask is None else mask & keep
            # A padded query may see no key at all (softmax over nothing = NaN on older torch): let every
            # query attend to itself; padded outputs are ignored downstream, real rows are unchanged.
            own = torch.arange(nk, device=device)[None, :] == (torch.arange(n, device=device)[:, None] + past)
            mask = mask | own[None, None]
        return mask


class Mlp(nn.Module):
    """Linear -> GELU -> Linear."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class Block(nn.Module):
    """Pre-norm block `x + attn(norm1(x), pos)`, `x + mlp(norm2(x))`; the rope is passed in.

    The same class for text, image patches and video: only the `rope` (and the `pos` given to `forward`)
    differ. `mmpreproj.inject` recognises this block, alone or anywhere in a model (host row
    "mmpreproj_block"), and wraps `attn` exactly as it wraps GPT-NeoX or timm attention. Building a mixed
    text-image model from it: docs/howto-mixed-model.md.

    Args:
        dim: model width.
        num_heads: attention heads (`dim` must divide evenly).
        mlp_ratio: MLP hidden width / `dim`.
        rope: a rotary encoder from `mmpreproj.rope` (`RoPE1D`, `RoPE2D`, `RoPE3D`, `MultimodalRoPE`), shared
            by several blocks or not; None for no rotary positions (learned ones are added to the tokens).
        causal: mask future tokens (decoders).
        qkv_bias: bias on the fused qkv projection.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        mlp_ratio: float = 4.0,
        rope: nn.Module | None = None,
        causal: bool = False,
        qkv_bias: bool = True,
    ) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = SelfAttention(dim, num_heads, rope=rope, causal=causal, qkv_bias=qkv_bias)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = Mlp(dim, int(dim * mlp_ratio))

    def forward(
        self,
        x: torch.Tensor,
        pos: torch.Tensor | None = None,
        num_prefix_tokens: int = 0,
        attn_mask: torch.Tensor | None = None,
        cache: KVCache | None = None,
    ) -> torch.Tensor:
        """x: (B, N, dim) -> (B, N, dim).

        Args:
            x: the tokens.
            pos: the coordinates of the rotated tokens (all but the first `num_prefix_tokens`), (N, A) or (B, N, A)
                for a rope of A axes: token indices for `RoPE1D` ((N,) too), rows and columns for `RoPE2D`
                (`grid_positions(h, w)`), (t, h, w) for `RoPE3D` and `MultimodalRoPE` (`multimodal_positions`);
                None without a rope.
            num_prefix_tokens: leading tokens (a class token) the rope leaves as they are.
            attn_mask: bool, True = attend: (B, N) keys to keep (padding) or (B, 1 or H, N, Nk).
            cache: a `KVCache` of earlier tokens' keys and values, extended in place (decoding).
        """
        x = x + self.attn(
            self.norm1(x), pos=pos, num_prefix_tokens=num_prefix_tokens, attn_mask=attn_mask, cache=cache
        )
        return x + self.mlp(self.norm2(x))
