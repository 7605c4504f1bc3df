"""Multimodal positions in a transformers Llama-family decoder: its `rotary_emb` swapped for our M-RoPE.

    rotary = use_multimodal_rope(lm)              # lm: LlamaForCausalLM (SmolLM2, Llama, Mistral, Qwen2, ...)
    pos, delta = multimodal_positions([("text", 5), ("image", (4, 4)), ("text", 9)])   # (N, 3)
    out = lm(inputs_embeds=x, position_ids=pos.T[:, None], attention_mask=mask)     # ids (3, B, N), Qwen2-VL's
    remove_multimodal_rope(lm)                    # the original module back

The decoder's own forward runs unchanged: it hands `position_ids` to its rotary module, which returns the
(cos, sin) its attention layers apply. Ours reads Qwen2-VL position ids (3, B, N) = (t, h, w), or plain (B, N)
/ (N,) text positions, and returns `MultimodalRoPE(head_dim, sections, theta).cos_sin(...)` in the input's
dtype. Text tokens (t = h = w) get exactly the decoder's own 1D tables, bit for bit: confirmed on the model
before anything changes, else refused.

`create_causal_mask` also reads `position_ids`, to find packed sequences, when no attention mask and no cache
are given; 3-row ids would be misread there, so while installed a pre-hook on the decoder passes an all-ones
attention mask in that one case (the causal mask it gives is the same).

`generate()` is not covered: it makes 1D ids for the new tokens, without the prompt's delta (new token k of an
N-token prompt sits at N + k + delta on all three axes); decode with the KV cache by passing those ids.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from .base import RotaryEncoder
from .layouts import MROPE_LAYOUTS, make_mrope

_ROPE_KEYS = {"rope_type", "rope_theta"}  # the rope_parameters our tables reproduce (rope_type "default")


class MultimodalRotaryEmbedding(nn.Module):
    """A transformers decoder's `rotary_emb` over M-RoPE: `cos, sin = rotary(x, position_ids)`, each
    (B, N, head_dim) in x.dtype, for ids (3, B, N) (t, h, w), (B, N) or (N,) (text: the same on all three).

    Holds no parameters or buffers (the tables are float32 plain attributes of `rope`), so the model's state
    dict is unchanged. `original` is the module it replaced, kept outside the module tree.
    """

    def __init__(self, rope: RotaryEncoder, original: nn.Module | None = None) -> None:
        super().__init__()
        if rope.num_axes != 3:
            raise ValueError(f"rope must take (t, h, w) positions (num_axes=3), got num_axes={rope.num_axes}")
        self.rope = rope
        self.__dict__["original"] = original  # not a submodule: named_modules() and .to() stay as the base's
        # the decoder pre-hook's handle (see module docstring); a deep copy of the model gets a handle on its own
        # copy's hook tables (torch's `RemovableHandle` is copied by state, the tables before the submodules)
        self.__dict__["hook"] = None

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        cos, sin = self.rope.cos_sin(thw_positions(position_ids), device=x.device)  # (B, N, r) float32
        return cos.to(x.dtype), sin.to(x.dtype)


def thw_positions(position_ids: torch.Tensor) -> torch.Tensor:
    """(B, N, 3) from Qwen2-VL ids (3, B, N), or from text ids (B, N) / (N,) (the same on the three axes)."""
    if not isinstance(position_ids, torch.Tensor):
        raise TypeError(f"position_ids must be a torch.Tensor, got {type(position_ids).__name__}")
    if position_ids.is_floating_point() or position_ids.is_complex() or position_ids.dtype == torch.bool:
        raise ValueError(f"position_ids must be integers, got {position_ids.dtype}")
    if position_ids.ndim == 3 and position_ids.shape[0] == 3:
        return position_ids.permute(1, 2, 0)  # (3, B, N) -> (B, N, 3)
    if position_ids.ndim in (1, 2):
        ids = position_ids if position_ids.ndim == 2 else position_ids[None]  # (B, N)
        return ids[..., None].expand(*ids.shape, 3)  # (B, N, 3)
    raise ValueError(
        "position_ids must be (3, B, N) (t, h, w, as Qwen2-VL's), (B, N) or (N,) (text), "
        f"got shape {tuple(position_ids.shape)}"
    )


def _rotary_site(model: nn.Module) -> tuple[nn.Module, str, nn.Module]:
    """(the module holding it, its attribute name, the rotary module): the one module named `rotary_emb`."""
    found = [(name, m) for name, m in model.named_modules() if name.rsplit(".", 1)[-1] == "rotary_emb"]
    if len(found) != 1:
        names = [n for n, _ in found]
        raise ValueError(
            f"expected one module named 'rotary_emb' (a transformers decoder's, e.g. model.model.rotary_emb), "
            f"found {len(found)}: {names}"
        )
    path, rotary = found[0]
    parent_path, _, attr = path.rpartition(".")
    return model.get_submodule(parent_path), attr, rotary


def _rope_settings(config: Any) -> tuple[float, int]:
    """(theta, head_dim) of a config whose rotary tables we reproduce; else ValueError naming the field."""
    params = getattr(config, "rope_parameters", None)
    if isinstance(params, dict) and params:
        if params.get("rope_type", "default") != "default":
            raise ValueError(
                f"config.rope_parameters['rope_type'] = {params['rope_type']!r}: only 'default' RoPE is "
                "reproduced (no scaling)"
            )
        extra = sorted(set(params) - _ROPE_KEYS)
        if extra:
            raise ValueError(f"config.rope_parameters has {extra}: not reproduced (only rope_theta, no scaling)")
        theta = params.get("rope_theta")
    else:  # transformers < 5 layout
        if getattr(config, "rope_scaling", None):
            raise ValueError(f"config.rope_scaling = {config.rope_scaling!r}: RoPE scaling is not reproduced")
        theta = getattr(config, "rope_theta", None)
    if not isinstance(theta, (int, float)) or theta <= 0:
        raise ValueError(f"config has no positive rope_theta (got {theta!r})")
    if getattr(config, "partial_rotary_factor", 1.0) not in (None, 1.0):
        raise ValueError(f"config.partial_rotary_factor = {config.partial_rotary_factor}: not reproduced")
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return float(theta), int(head_dim)


def _mask_for_thw_ids(module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
    """Decoder pre-hook: with (3, B, N) ids, no mask and no cache, pass an all-ones (B, N) attention mask."""
    pos = kwargs.get("position_ids")
    if not (isinstance(pos, torch.Tensor) and pos.ndim == 3) or kwargs.get("attention_mask") is not None:
        return None
    if any(kwargs.get(k) is not None for k in ("cache", "past_key_values")):
        return None
    x = kwargs.get("inputs_embeds")
    x = x if x is not None else kwargs.get("input_ids", args[0] if args else None)
    if x is None:
        return None
    mask = torch.ones(x.shape[:2], dtype=torch.long, device=x.device)  # (B, N)
    return args, {**kwargs, "attention_mask": mask}


def use_multimodal_rope(
    model: nn.Module, sections: Sequence[int] | None = None, layout: str = "chunked"
) -> MultimodalRotaryEmbedding:
    """Swap the decoder's `rotary_emb` for M-RoPE over the same spectrum; returns the new module.

    Args:
        model: a transformers decoder with one `rotary_emb` module of the Llama kind (`forward(x, position_ids)`
            -> (cos, sin), split-half): `LlamaForCausalLM` (SmolLM2), its `LlamaModel`, or a peft model around
            them. theta and head_dim come from its config.
        sections: frequency pairs per (t, h, w), summing to head_dim / 2; None = `default_sections`
            (Qwen2-VL's 1/4, 3/8, 3/8 for "chunked": (8, 12, 12) at head_dim 64).
        layout: "chunked" (Qwen2-VL) or "interleaved" (Qwen3-VL; every axis gets fast and slow pairs).

    Refused before anything changes (ValueError naming the reason): RoPE scaling or a partial rotary factor in
    the config, a rotary module already swapped, or one whose text tables ours do not equal bit for bit.
    """
    if layout not in MROPE_LAYOUTS:
        raise ValueError(f"layout must be one of {MROPE_LAYOUTS}, got {layout!r}")
    parent, attr, rotary = _rotary_site(model)
    if isinstance(rotary, MultimodalRotaryEmbedding):
        raise ValueError("the rotary module is already multimodal; remove_multimodal_rope(model) first")
    config = getattr(rotary, "config", None) or getattr(parent, "config", None)
    if config is None:
        raise ValueError(f"{type(rotary).__name__} has no config to read rope_theta and head_dim from")
    theta, head_dim = _rope_settings(config)
    new = MultimodalRotaryEmbedding(make_mrope(head_dim, layout, sections, theta), original=rotary)
    _check_text_tables(rotary, new)
    new.__dict__["hook"] = parent.register_forward_pre_hook(_mask_for_thw_ids, with_kwargs=True)
    setattr(parent, attr, new)
    return new


@torch.no_grad()
def _check_text_tables(rotary: nn.Module, new: MultimodalRotaryEmbedding) -> None:
    """Refuse unless `new` gives `rotary`'s own (cos, sin) for text positions, bit for bit."""
    ref = next((b for b in rotary.buffers()), None)
    device = ref.device if ref is not None and ref.device.type != "meta" else torch.device("cpu")
    x = torch.zeros(1, 1, 1, device=device)
    pos = torch.cat([torch.arange(64), torch.tensor([257, 1000, 4095, 32767])]).to(device)[None]  # (1, N)
    try:
        want = rotary(x, pos)
    except Exception as err:  # a rotary module of another kind (a different signature)
        raise ValueError(f"{type(rotary).__name__}(x, position_ids) failed: {err}") from err
    got = new(x, pos)
    same = len(want) == 2 and all(a.shape == b.shape and torch.equal(a, b) for a, b in zip(want, got))
    if not same:
        low = sorted({str(b.dtype) for b in rotary.buffers() if b.is_floating_point() and b.dtype != torch.float32})
        hint = (
            f" (its buffers are {', '.join(low)}: a decoder cast after it was built, e.g. .to(torch.bfloat16), keeps "
            "inv_freq in that dtype; build it in the dtype instead, from_pretrained(..., dtype=...))"
            if low
            else ""
        )
        raise ValueError(
            f"{type(rotary).__name__} gives other (cos, sin) tables for text positions than M-RoPE with "
            f"theta={new.rope.theta}, head_dim={new.rope.head_dim}; not swapped{hint}"
        )


def remove_multimodal_rope(model: nn.Module) -> nn.Module:
    """Put the original rotary module back (and drop the decoder pre-hook); returns it."""
    parent, attr, rotary = _rotary_site(model)
    if not isinstance(rotary, MultimodalRotaryEmbedding) or rotary.original is None:
        raise ValueError(f"the rotary module is {type(rotary).__name__}, not one use_multimodal_rope installed")
    rotary.hook.remove()  # on a deep copy, the copy's own hook
    setattr(parent, attr, rotary.original)
    return rotary.original
