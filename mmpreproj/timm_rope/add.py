"""Give a timm ViT (or EVA) our 2D rotary positions on its patch tokens, and take them away again.

    model = timm.create_model("vit_small_patch16_224", pretrained=False, dynamic_img_size=True)
    add_rope(model, RoPE2D(model.blocks[0].attn.head_dim, theta=100.0), keep_abs_pos=False)
    mmpreproj.inject(model)                # the pre-projection goes in front of the rotary attention
    remove_rope(model)                     # back to the exact original modules (also under an injection)

How the positions reach the attention (nothing is stashed on a module between calls):
- `VisionTransformer`: its `Block` calls `attn(norm1(x), attn_mask=..., is_causal=...)` and has no slot
  for positions, so `add_rope` gives the model its own `forward_features` (an instance attribute; the
  class is untouched) that reads the (h, w) grid of the current input from the patch embedding, builds
  the positions and runs each block's two residual branches itself, passing `pos=` to the attention:
      x = x + drop_path1(ls1(attn(norm1(x), pos=pos)))      x = x + drop_path2(ls2(mlp(norm2(x))))
  The blocks, their attribute names and `model.blocks` stay timm's, so the `timm_vit` host row of
  `mmpreproj.inject` applies unchanged (the wrapper forwards `pos=` to the rotary attention).
- `Eva`: its blocks already hand `rope=model.rope.get_embed(shape)` to the attention, so `add_rope`
  swaps `model.rope` for a module whose `get_embed` returns our positions and keeps Eva's own forward.
  (timm's `VisionTransformer` `Block` has no such `rope=` argument, as of timm 1.0.31, hence the
  `forward_features` above; it is replaced by Eva's way once timm's ViT blocks take a rope.)

In both cases each block's attention becomes a `RotaryAttention` around the original module.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from ..modules import BaseLayerWrapper
from ..rope import RoPE2D
from .attention import RotaryAttention, supported_attention
from .grid import GridPositions

Positions = Callable[..., torch.Tensor]  # positions(h, w, device=...) -> (h*w, A)


@dataclass
class RopeState:
    """What `add_rope` changed, kept on the model as `model.mmpreproj_rope` so `remove_rope` can undo it."""

    kind: str  # "vit" or "eva"
    rope: nn.Module
    positions: Positions
    num_prefix_tokens: int
    pos_embed: nn.Parameter | None = field(default=None, repr=False)  # removed absolute table, if any
    host_rope: nn.Module | None = field(default=None, repr=False)  # Eva's own rope module, if any


class EvaPositions(nn.Module):
    """Stands in for Eva's `model.rope`: `get_embed(shape)` returns our (h*w, 2) positions, not sin/cos."""

    def __init__(self, positions: Positions) -> None:
        super().__init__()
        self.positions = positions

    def get_embed(self, shape: tuple[int, int] | None = None, dtype: torch.dtype | None = None) -> torch.Tensor:
        if shape is None:
            raise ValueError("EvaPositions.get_embed needs the grid shape (h, w)")
        return self.positions(int(shape[0]), int(shape[1]))  # (h*w, A) on CPU; the rope moves it


def _timm_class(module: str, name: str) -> type | None:
    return getattr(sys.modules.get(module), name, None)


def _kind(model: nn.Module) -> str:
    vit = _timm_class("timm.models.vision_transformer", "VisionTransformer")
    eva = _timm_class("timm.models.eva", "Eva")
    if vit is not None and isinstance(model, vit):
        return "vit"
    if eva is not None and isinstance(model, eva):
        return "eva"
    raise TypeError(f"add_rope supports timm VisionTransformer and Eva models, got {type(model).__name__}")


def _attn_slot(block: nn.Module) -> tuple[nn.Module, str]:
    """(parent, attribute) holding the host attention of a block, looking through a pre-projection wrapper."""
    attn = block.attn
    if isinstance(attn, BaseLayerWrapper) and not isinstance(attn, RotaryAttention):  # the pre-projection wrapper
        return attn, "base_layer"
    return block, "attn"


def has_rope(model: nn.Module) -> bool:
    """Whether `add_rope` put rotary positions into `model` (and `remove_rope` has not taken them out)."""
    return hasattr(model, "mmpreproj_rope")


def _check(model: nn.Module, kind: str, rope: nn.Module | None) -> None:
    """Every reason to refuse, before anything is changed."""
    if has_rope(model):
        raise RuntimeError("this model already has add_rope positions; call remove_rope(model) first")
    if len(model.blocks) == 0:
        raise ValueError("add_rope: the model has no blocks")
    block_cls = {"vit": ("timm.models.vision_transformer", "Block"), "eva": ("timm.models.eva", "EvaBlock")}[kind]
    for i, block in enumerate(model.blocks):
        if type(block) is not _timm_class(*block_cls):
            raise ValueError(f"add_rope: block {i} is a {type(block).__name__}, only timm {block_cls[1]} is supported")
        parent, name = _attn_slot(block)
        attn = getattr(parent, name)
        if not supported_attention(attn):
            raise ValueError(
                f"add_rope: block {i} attention is a {type(attn).__name__}; only timm Attention / "
                "EvaAttention (no DiffAttention, no grouped-query AttentionRope) is supported"
            )
        if rope is not None and getattr(rope, "head_dim", attn.head_dim) != attn.head_dim:
            raise ValueError(f"add_rope: rope head_dim={rope.head_dim}, block {i} has head_dim={attn.head_dim}")
    patch_drop = getattr(model, "patch_drop", None)
    if patch_drop is not None and not isinstance(patch_drop, nn.Identity):
        raise ValueError("add_rope: patch dropout (patch_drop_rate > 0) reorders tokens; build the model without it")
    if kind == "eva" and getattr(model, "rope_mixed", False):
        raise ValueError("add_rope: Eva rope_type='mixed' passes a different embedding to every block; not supported")


def add_rope(
    model: nn.Module,
    rope: nn.Module | None = None,
    *,
    positions: Positions | None = None,
    keep_abs_pos: bool = True,
    theta: float = 100.0,
) -> nn.Module:
    """Rotate the patch tokens' q/k in every block of a timm `VisionTransformer` or `Eva` (in place).

    Args:
        model: the timm model (with `dynamic_img_size=True` it accepts any image size; positions always
            follow the grid of the current input).
        rope: the rotary encoder, shared by all blocks (default `RoPE2D(head_dim, theta)`); any encoder
            with the `mmpreproj.rope` call convention whose `num_axes` matches `positions`.
        positions: `positions(h, w, device=...) -> (h*w, A)` (default `GridPositions()`: (row, column)).
        keep_abs_pos: keep the model's learned absolute position table (False removes it until `remove_rope`).
        theta: base of the default RoPE2D's spectrum (100, as naver rope-vit).

    Class and register tokens are never rotated. Returns the same model object.
    """
    kind = _kind(model)
    _check(model, kind, rope)
    rope = rope if rope is not None else RoPE2D(model.blocks[0].attn.head_dim, theta=theta)
    positions = positions if positions is not None else GridPositions()
    axes = positions(1, 1).shape[-1]  # (1, A): the axes of one patch's position
    if getattr(rope, "num_axes", axes) != axes:
        raise ValueError(
            f"add_rope: rope {type(rope).__name__} has num_axes={rope.num_axes}, but positions "
            f"({type(positions).__name__}) give {axes} per patch; pass an encoder with num_axes={axes} (RoPE2D for "
            "the default (row, column) grid) or positions of its axes (nothing was changed)"
        )
    npt = int(model.num_prefix_tokens)
    state = RopeState(kind, rope, positions, npt)
    for block in model.blocks:
        parent, name = _attn_slot(block)
        host = getattr(parent, name)
        prefix = host.num_prefix_tokens if kind == "eva" else npt
        setattr(parent, name, RotaryAttention(host, rope, prefix))
    if not keep_abs_pos and model.pos_embed is not None:
        state.pos_embed = model.pos_embed
        model.pos_embed = None
    if kind == "eva":
        state.host_rope = model.rope
        model.rope = EvaPositions(positions)
    else:
        model.forward_features = partial(_rotary_forward_features, model)  # pickles, unlike a bound method
    model.mmpreproj_rope = state
    return model


def remove_rope(model: nn.Module) -> nn.Module:
    """Undo `add_rope`: the original attention modules, absolute table, Eva rope and forward come back."""
    state: RopeState | None = getattr(model, "mmpreproj_rope", None)
    if state is None:
        raise RuntimeError("this model has no add_rope positions to remove")
    for block in model.blocks:
        parent, name = _attn_slot(block)
        attn = getattr(parent, name)
        if isinstance(attn, RotaryAttention):
            setattr(parent, name, attn.get_base_layer())
    if state.pos_embed is not None:
        table, device = state.pos_embed, model.patch_embed.proj.weight.device
        if table.device != device:  # the model moved while the table was out of it
            table.data = table.data.to(device)
        model.pos_embed = table
    if state.kind == "eva":
        model.rope = state.host_rope
    else:
        del model.forward_features
    del model.mmpreproj_rope
    return model


def _grid(model: nn.Module, tokens: torch.Tensor, image_hw: tuple[int, int]) -> tuple[int, int]:
    """The (h, w) patch grid of the current input."""
    if tokens.ndim == 4:  # dynamic_img_size: patch_embed returns (B, h, w, C)
        return int(tokens.shape[1]), int(tokens.shape[2])
    h, w = model.patch_embed.dynamic_feat_size(image_hw)
    if h * w != tokens.shape[1]:
        raise RuntimeError(f"add_rope: {tokens.shape[1]} patch tokens do not form the expected {h}x{w} grid")
    return h, w


def _block(block: nn.Module, x: torch.Tensor, pos: torch.Tensor, attn_mask, is_causal: bool) -> torch.Tensor:
    """One timm `Block`, with positions handed to its attention."""
    a = block.attn(block.norm1(x), attn_mask=attn_mask, is_causal=is_causal, pos=pos)
    x = x + block.drop_path1(block.ls1(a))
    return x + block.drop_path2(block.ls2(block.mlp(block.norm2(x))))


def _rotary_forward_features(
    self: nn.Module, x: torch.Tensor, attn_mask: torch.Tensor | None = None, is_causal: bool = False
) -> torch.Tensor:
    """timm `VisionTransformer.forward_features` with the grid's positions passed to every attention."""
    state: RopeState = self.mmpreproj_rope
    image_hw = (int(x.shape[-2]), int(x.shape[-1]))
    x = self.patch_embed(x)  # (B, h, w, C) or (B, h*w, C)
    h, w = _grid(self, x, image_hw)
    pos = state.positions(h, w, device=x.device)  # (h*w, A)
    x = self._pos_embed(x)  # (B, P + h*w, C): class/register tokens first
    x = self.patch_drop(x)
    x = self.norm_pre(x)
    for block in self.blocks:
        if self.grad_checkpointing and torch.is_grad_enabled():
            x = checkpoint(_block, block, x, pos, attn_mask, is_causal, use_reentrant=False)
        else:
            x = _block(block, x, pos, attn_mask, is_causal)
    return self.norm(x)
