"""The text decoder: embeddings and (t, h, w) positions in, logits out, a stack of `mmpreproj.modules.Block`.

One call: `logits, cache = decoder(inputs_embeds, attention_mask, position_ids, cache)`, with inputs_embeds
(B, S, D), attention_mask (B, S) (0 = left padding), position_ids (B, S, 3), and a cache from
`decoder.new_cache()` (one `KVCache` per block; None for a plain forward). `decoder.embed(ids)` embeds
tokens; `decoder.host` is the module `mmpreproj.inject` wraps: ONE pre-projection + content skip per block,
shared by every modality, in front of the block's attention and therefore before the M-RoPE rotation inside it.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from mmpreproj.modules.block import Block, KVCache
from mmpreproj.rope.layouts import make_mrope

__all__ = ["NativeDecoder"]


class NativeDecoder(nn.Module):
    """Token embedding, `depth` causal pre-norm `Block`s sharing one M-RoPE, final norm, LM head.

    Args:
        vocab_size, width, depth, num_heads: the usual sizes.
        mlp_ratio: MLP width / model width.
        rotary_fraction: share of each head's channels that rotate.
        sections: frequency pairs per (t, h, w) (default `default_sections(rotary_dim, layout)`).
        theta: rotary base.
        layout: "chunked" (Qwen2-VL M-RoPE) or "interleaved" (Qwen3-VL), see `layouts`.
    """

    def __init__(self, vocab_size: int, width: int = 64, depth: int = 2, num_heads: int = 2,
                 mlp_ratio: float = 4.0, rotary_fraction: float = 1.0, sections: Sequence[int] | None = None,
                 theta: float = 10000.0, layout: str = "chunked") -> None:  # fmt: skip
        super().__init__()
        self.rope = make_mrope(width // num_heads, layout, sections, theta, rotary_fraction)
        self.embed_tokens = nn.Embedding(vocab_size, width)
        self.blocks = nn.ModuleList(
            Block(width, num_heads, mlp_ratio, rope=self.rope, causal=True) for _ in range(depth)
        )
        self.norm = nn.LayerNorm(width)
        self.lm_head = nn.Linear(width, vocab_size, bias=False)
        self.width = width

    @property
    def host(self) -> nn.Module:
        return self

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(ids)

    def new_cache(self) -> list[KVCache]:
        return [KVCache() for _ in self.blocks]

    def forward(self, inputs_embeds: torch.Tensor, attention_mask: torch.Tensor | None, position_ids: torch.Tensor,
                cache: list[KVCache] | None = None) -> tuple[torch.Tensor, list[KVCache] | None]:  # fmt: skip
        b, n, _ = inputs_embeds.shape
        past = len(cache[0]) if cache else 0
        mask = None
        if attention_mask is not None:
            if attention_mask.shape != (b, past + n):
                raise ValueError(
                    f"attention_mask must be (B, past + S) = {(b, past + n)}, got {tuple(attention_mask.shape)}"
                )
            # Keys kept by the padding mask; each query also sees itself, so a padding row is never empty
            # (older torch SDPA gives NaN for an all-masked row, which then leaks through later layers).
            self_key = (
                torch.arange(past + n, device=inputs_embeds.device)
                == past + torch.arange(n, device=inputs_embeds.device)[:, None]
            )
            mask = attention_mask.bool()[:, None, None, :] | self_key  # (B, 1, n, past + n)
        x = inputs_embeds
        for i, block in enumerate(self.blocks):
            x = block(x, pos=position_ids, attn_mask=mask, cache=cache[i] if cache else None)
        return self.lm_head(self.norm(x)), cache
