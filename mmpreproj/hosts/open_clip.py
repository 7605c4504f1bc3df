"""open_clip hosts: the `CLIP` model (both towers), its `VisionTransformer` and `TextTransformer` towers,
and a bare `Transformer` stack (the text tower of a plain `CLIP`, whose parts sit on the model itself).

open_clip's `ResidualAttentionBlock` calls `attn(ln_1(x), ln_1(x), ln_1(x), need_weights=False,
attn_mask=...)` where `attn` is `nn.MultiheadAttention` with a raw `in_proj_weight` (no Linear to wrap).
The wrapper pre-projects the query/key/value arguments (one tensor, so `x~` is computed once and the
module still sees `query is key is value`) and adds the skip to output[0]:

    x = x + ls_1(attn(x~, x~, x~)[0] + W_skip·x~) ;  x = x + ls_2(mlp(ln_2(x)))     x~ = PreProj(ln_1(x))

so LayerScale `ls_1` scales the skip and the MLP never sees `x~`.

Block order for a `CLIP` / `CustomTextCLIP`: the vision blocks, then the text blocks, so with Lv vision
blocks, index Lv + j is text block j (`PreProjConfig(layers=...)` selects a tower). The two towers usually
have different widths; one injection needs one width (the core rejects "selected blocks have different
widths"), so then either select one tower with `layers`, or inject each tower on its own:
`inject(model.visual)` (row `open_clip_vit`) and `inject(model.transformer)` (row `open_clip_transformer`,
the text stack of a plain CLIP; `inject(model.text)` for a CustomTextCLIP). A tower injected on its own
freezes only that tower's parameters, and must be unloaded / saved on its own.

Rejected with a clear error (the model is left untouched): `CustomResidualAttentionBlock` (open_clip picks
it when qk_norm, scaled_cosine_attn, scale_heads, scale_attn_inner, scale_attn or scale_fc is set, or
block_type="custom"; its own `Attention` returns a tensor, not MultiheadAttention's tuple), cross-attention
blocks (`ln_1_kv`), and CLIP models whose vision tower is not an open_clip `VisionTransformer` (TimmModel:
inject `model.visual.trunk` with the timm row; ModifiedResNet has no attention blocks) or whose text tower
is a Hugging Face model. CoCa is not matched.

Gradient checkpointing: open_clip always checkpoints with `use_reentrant=False`, which gives the injected
weights gradients even with the whole base frozen. Nothing here imports open_clip (an optional extra).
"""

from __future__ import annotations

import sys

from torch import nn

from ..modules.wrapper import AttentionCall
from .registry import register_host
from .spec import HostError, HostSpec, PartSpec

__all__ = ["OPEN_CLIP", "OPEN_CLIP_TEXT", "OPEN_CLIP_TRANSFORMER", "OPEN_CLIP_VIT"]

# attn(query, key, value, need_weights=False, attn_mask=...) -> (out, None)
_CALL = AttentionCall(inputs=((0, "query"), (1, "key"), (2, "value")), output_index=0)


def _cls(module: str, name: str) -> type | None:
    """An open_clip class if open_clip is imported (a model can only be an open_clip model if it is)."""
    return getattr(sys.modules.get(f"open_clip.{module}"), name, None)


def _isinstance(obj: object, module: str, *names: str) -> bool:
    classes = tuple(c for c in (_cls(module, n) for n in names) if c is not None)
    return bool(classes) and isinstance(obj, classes)


def _is_stack(obj: object) -> bool:
    # exact type: MultimodalTransformer (CoCa) subclasses Transformer but interleaves cross-attention
    return type(obj) is _cls("transformer", "Transformer")


def _check_stack(stack: nn.Module, host: str, tower: str) -> None:
    """Every block of a `Transformer` stack must be a self-attention ResidualAttentionBlock."""
    for i, block in enumerate(stack.resblocks):
        where = f"host {host!r}: block {i} of the {tower} tower"
        if not _isinstance(block, "transformer", "ResidualAttentionBlock"):
            raise HostError(
                f"{where} is a {type(block).__name__}; only open_clip ResidualAttentionBlock "
                "(ln_1 -> nn.MultiheadAttention) is supported. open_clip uses CustomResidualAttentionBlock when "
                "qk_norm, scaled_cosine_attn, scale_heads, scale_attn_inner, scale_attn or scale_fc is set "
                "(or block_type='custom'); its Attention returns a tensor, not MultiheadAttention's tuple."
            )
        if hasattr(block, "ln_1_kv"):
            raise HostError(f"{where} is a cross-attention block (ln_1_kv); only self-attention is supported")


def _vision_stack(visual: nn.Module, host: str) -> nn.Module:
    if _isinstance(visual, "transformer", "VisionTransformer"):
        return visual.transformer
    hint = {
        "TimmModel": "inject the timm trunk on its own: mmpreproj.inject(model.visual.trunk)",
        "ModifiedResNet": "it has no attention blocks; inject the text tower on its own",
    }.get(type(visual).__name__, "inject the text tower on its own")
    raise HostError(
        f"host {host!r}: the vision tower is a {type(visual).__name__}, not an open_clip "
        f"VisionTransformer; {hint}"
    )


def _text_stack(model: nn.Module, host: str) -> nn.Module:
    text = getattr(model, "text", None)  # CustomTextCLIP keeps its text tower whole; CLIP flattens it
    if text is None and _is_stack(getattr(model, "transformer", None)):
        return model.transformer
    if _isinstance(text, "transformer", "TextTransformer"):
        return text.transformer
    raise HostError(
        f"host {host!r}: the text tower is a {type(text).__name__}, not an open_clip "
        "TextTransformer; inject the vision tower on its own: mmpreproj.inject(model.visual)"
    )


def _check_clip(model: nn.Module) -> None:
    _check_stack(_vision_stack(model.visual, "open_clip"), "open_clip", "vision")
    _check_stack(_text_stack(model, "open_clip"), "open_clip", "text")


def _part(name: str, *blocks: str) -> PartSpec:
    """ResidualAttentionBlocks: `attn(ln_1(x), ln_1(x), ln_1(x))[0]`, width = the MHA's embed_dim."""
    return PartSpec(name, blocks=blocks, attention="attn", norm="ln_1", call=_CALL, width="attn.embed_dim")


OPEN_CLIP = register_host(
    HostSpec(
        name="open_clip",
        description="open_clip CLIP / CustomTextCLIP, both towers (vision blocks, then text blocks)",
        matches=lambda model: _isinstance(model, "model", "CLIP", "CustomTextCLIP"),
        check=_check_clip,
        parts=(
            _part("vision", "visual.transformer.resblocks"),
            _part("text", "text.transformer.resblocks", "transformer.resblocks"),
        ),
        embeddings="visual.conv1",
        lora_targets=("out_proj",),
    )
)

OPEN_CLIP_VIT = register_host(
    HostSpec(
        name="open_clip_vit",
        description="open_clip VisionTransformer (e.g. clip.visual)",
        matches=lambda model: _isinstance(model, "transformer", "VisionTransformer"),
        check=lambda model: _check_stack(model.transformer, "open_clip_vit", "vision"),
        parts=(_part("vision", "transformer.resblocks"),),
        embeddings="conv1",
        lora_targets=("out_proj",),
    )
)

OPEN_CLIP_TEXT = register_host(
    HostSpec(
        name="open_clip_text",
        description="open_clip TextTransformer (e.g. custom_text_clip.text)",
        matches=lambda model: _isinstance(model, "transformer", "TextTransformer"),
        check=lambda model: _check_stack(model.transformer, "open_clip_text", "text"),
        parts=(_part("text", "transformer.resblocks"),),
        embeddings="token_embedding",
        lora_targets=("out_proj",),
    )
)

OPEN_CLIP_TRANSFORMER = register_host(
    HostSpec(
        name="open_clip_transformer",
        description="open_clip Transformer block stack (e.g. clip.transformer, the text tower of a plain CLIP)",
        matches=_is_stack,
        check=lambda model: _check_stack(model, "open_clip_transformer", "transformer"),
        parts=(_part("blocks", "resblocks"),),
        lora_targets=("out_proj",),
    )
)
