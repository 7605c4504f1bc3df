"""A drop-in for transformers' GPT-NeoX rotary module that reads 3-axis (t, h, w) position ids.

`GPTNeoXModel.forward` computes `position_embeddings = self.rotary_emb(hidden_states, position_ids)` once and
passes (cos, sin) to every layer. Replacing `model.gpt_neox.rotary_emb` by `MultimodalRotaryEmbedding` makes
every layer rotate by M-RoPE: position ids (B, S, 3) from `multimodal_positions`; plain (B, S) ids (text, the
host's own default `arange(S) + past`) give the host's cos/sin bit for bit.

    original = swap_rotary(lm, sections=(2, 3, 3))   # Pythia-160m: 8 rotary pairs per head (rotary_pct 0.25)
    ...
    restore_rotary(lm, original)
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from ..rope import RotaryEncoder
from ..rope.layouts import make_mrope

__all__ = ["MultimodalRotaryEmbedding", "restore_rotary", "swap_rotary"]


class MultimodalRotaryEmbedding(nn.Module):
    """`(cos, sin) = module(x, position_ids)` with GPT-NeoX's output layout: (B, S, r) each, cast to x.dtype.

    Args:
        rope: a 3-axis split-half rotary encoder (`MultimodalRoPE` or `InterleavedMultimodalRoPE`) whose
            rotary_dim equals the host's rotary channels.

    position_ids: (B, S) text positions (all three axes equal) or (B, S, 3) = (t, h, w).
    """

    def __init__(self, rope: RotaryEncoder) -> None:
        super().__init__()
        if not isinstance(rope, RotaryEncoder) or rope.num_axes != 3 or rope.pairing != "half":
            raise TypeError(f"rope must be a 3-axis split-half RotaryEncoder (M-RoPE), got {rope!r}")
        self.rope = rope

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if position_ids.ndim == 2:
            position_ids = position_ids[..., None].expand(-1, -1, 3)  # (B, S) -> (B, S, 3)
        if position_ids.ndim != 3 or position_ids.shape[-1] != 3:
            raise ValueError(
                f"position_ids must be (B, S) or (B, S, 3) = (t, h, w), got {tuple(position_ids.shape)}"
            )
        cos, sin = self.rope.cos_sin(position_ids, device=x.device)  # (B, S, r) float32
        return cos.to(x.dtype), sin.to(x.dtype)


def _neox_base(lm: nn.Module) -> nn.Module:
    base = getattr(lm, "gpt_neox", lm)
    if getattr(getattr(lm, "config", None), "model_type", None) != "gpt_neox" or not hasattr(
        base, "rotary_emb"
    ):
        raise TypeError(f"expected a transformers GPT-NeoX model with .rotary_emb, got {type(lm).__name__}")
    return base


def swap_rotary(lm: nn.Module, sections: Sequence[int] | None = None, layout: str = "chunked") -> nn.Module:
    """Replace a GPT-NeoX model's rotary module by `MultimodalRotaryEmbedding`; returns the original module.

    Args:
        lm: `GPTNeoXForCausalLM` or `GPTNeoXModel`.
        sections: frequency pairs per (t, h, w) over the host's rotary channels (default `default_sections`).
        layout: "chunked" (Qwen2-VL) or "interleaved" (Qwen3-VL), see `layouts`.
    """
    base = _neox_base(lm)
    cfg = lm.config
    original = base.rotary_emb
    if isinstance(original, MultimodalRotaryEmbedding):
        raise RuntimeError("this model's rotary module is already a MultimodalRotaryEmbedding")
    params = getattr(cfg, "rope_parameters", None) or {}
    if params.get("rope_type", "default") != "default":
        raise ValueError(
            f"only the default rope_type is supported, this model has {params.get('rope_type')!r}"
        )
    theta = params.get("rope_theta", getattr(cfg, "rotary_emb_base", 10000.0))
    fraction = params.get("partial_rotary_factor", getattr(cfg, "rotary_pct", 1.0))
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    rope = make_mrope(head_dim, layout, sections, theta=theta, rotary_fraction=fraction)
    if rope.rotary_dim != original.inv_freq.numel() * 2:
        raise ValueError(
            f"M-RoPE rotary_dim {rope.rotary_dim} != host rotary channels {original.inv_freq.numel() * 2}"
        )
    base.rotary_emb = MultimodalRotaryEmbedding(rope)
    return original


def restore_rotary(lm: nn.Module, original: nn.Module) -> None:
    """Put back the module `swap_rotary` returned."""
    _neox_base(lm).rotary_emb = original
