"""open_clip hosts: the `CLIP` model (both towers), `CoCa` (both towers and its multimodal text decoder),
the `VisionTransformer` and `TextTransformer` towers, and bare block stacks (`Transformer` / `CustomTransformer`,
the text tower of a plain `CLIP`; `MultimodalTransformer`, CoCa's decoder).

Two block types, one call convention. open_clip's `ResidualAttentionBlock` calls `attn(ln_1(x), ln_1(x),
ln_1(x), need_weights=False, attn_mask=...)` where `attn` is `nn.MultiheadAttention` with a raw
`in_proj_weight` (no Linear to wrap) and returns `(out, None)`. `CustomResidualAttentionBlock` (chosen by
open_clip when qk_norm, scaled_cosine_attn, scale_heads, scale_attn_inner, scale_attn or scale_fc is set,
or block_type="custom") calls its own `Attention` as `attn(ln_1(x), attn_mask=...)` and gets a tensor. The
row's call names slots 0/1/2 (query, key, value) and output 0: the custom block fills slot 0 only, and a
tensor result takes the skip as it is. The wrapper pre-projects the query/key/value arguments (one tensor,
so `x~` is computed once and MultiheadAttention still sees `query is key is value`) and adds the skip:

    ResidualAttentionBlock:        x = x + ls_1(attn(x~, x~, x~)[0] + W_skip·x~)
    CustomResidualAttentionBlock:  x = x + ls_1(ln_attn(attn(x~) + W_skip·x~))       x~ = PreProj(ln_1(x))

then `x = x + ls_2(mlp(ln_2(x)))`, so LayerScale `ls_1` scales the skip and the MLP never sees `x~`.
`ln_attn` (scale_attn=True, a norm on the attention output, NormFormer-style) normalises the attention
output *with* the skip: the skip joins the attention output, as in every row (the same choice as Gemma2's
post-attention norm), so at identity init (W_skip = 0) the block is unchanged, and the residual stream only
ever receives normed branch outputs, as the host intends. Qk-norm (`ln_q` / `ln_k` on the heads) and scaled
cosine attention act on Q/K projected from `x~` and are untouched (scaled cosine attention is not tested:
open_clip 3.3's own forward fails on it, `torch.bmm` on 4D heads).

Block order for a `CLIP` / `CustomTextCLIP`: the vision blocks, then the text blocks, so with Lv vision
blocks, index Lv + j is text block j (`PreProjConfig(layers=...)` or `parts=` selects a tower). The towers
may have different widths; each module takes its block's width. A tower can also be injected on its own:
`inject(model.visual)` (row `open_clip_vit`) and `inject(model.transformer)` (row `open_clip_transformer`,
the text stack of a plain CLIP; `inject(model.text)` for a CustomTextCLIP). A tower injected on its own
freezes only that tower's parameters, and must be unloaded / saved on its own.

CoCa (row `open_clip_coca`): parts "vision" (`visual.transformer.resblocks`), "text"
(`text.transformer.resblocks`, the unimodal text encoder) and "decoder" (`text_decoder.resblocks`, the
multimodal decoder's causal self-attention blocks), in that block order; default: all three. Not injected:
the decoder's `cross_attn` blocks, which call `attn(ln_1(text), ln_1_kv(image), ln_1_kv(image))`: their
keys/values are the image embeddings, so they are not a norm -> self-attention seam (a pre-projection of
the query alone would be a different module than the paper's, which is shared by Q, K and V), and the
vision tower's attentional pooler (learned queries over the image tokens, not a block). Those modules, the
embeddings and heads stay frozen with the rest of the base.

Rejected with a clear error (the model is left untouched): cross-attention blocks (`ln_1_kv`) inside a
stack that should be self-attention, and models whose vision tower is not an open_clip `VisionTransformer`
(TimmModel: inject `model.visual.trunk` with the timm row; ModifiedResNet has no attention blocks) or whose
text tower is a Hugging Face model (CoCa's roberta variants included).

Gradient checkpointing: open_clip checkpoints with `use_reentrant=False`, which gives the injected weights
gradients even with the whole base frozen. open_clip 3.3 cannot checkpoint CustomResidualAttentionBlocks
at all (`checkpoint(block, x, None, None, attn_mask)` passes 4 arguments to a 2-argument forward), with or
without mmpreproj. Nothing here imports open_clip (an optional extra).
"""

from __future__ import annotations

import sys

from torch import nn

from .registry import register_host
from .spec import AttentionCall, HostError, HostSpec, PartSpec

# ResidualAttentionBlock: attn(query, key, value, need_weights=False, attn_mask=...) -> (out, None)
# CustomResidualAttentionBlock: attn(x, attn_mask=...) -> out (slot 0 only; a tensor result takes the skip as is)
_CALL = AttentionCall(inputs=((0, "query"), (1, "key"), (2, "value")), output_index=0)


def _cls(module: str, name: str) -> type | None:
    """An open_clip class if open_clip is imported (a model can only be an open_clip model if it is)."""
    return getattr(sys.modules.get(f"open_clip.{module}"), name, None)


def _isinstance(obj: object, module: str, *names: str) -> bool:
    classes = tuple(c for c in (_cls(module, n) for n in names) if c is not None)
    return bool(classes) and isinstance(obj, classes)


def _is_stack(obj: object) -> bool:
    # exact types: MultimodalTransformer (CoCa) subclasses Transformer but interleaves cross-attention
    return type(obj) in (_cls("transformer", "Transformer"), _cls("transformer", "CustomTransformer"))


def _check_stack(stack: nn.Module, host: str, tower: str) -> None:
    """Every block of a block stack must be a self-attention (Custom)ResidualAttentionBlock."""
    for i, block in enumerate(stack.resblocks):
        where = f"host {host!r}: block {i} of the {tower} tower"
        if not _isinstance(block, "transformer", "ResidualAttentionBlock", "CustomResidualAttentionBlock"):
            raise HostError(
                f"{where} is a {type(block).__name__}; only open_clip ResidualAttentionBlock "
                "(ln_1 -> nn.MultiheadAttention) and CustomResidualAttentionBlock (ln_1 -> Attention) are supported"
            )
        if hasattr(block, "ln_1_kv"):
            raise HostError(
                f"{where} is a cross-attention block (ln_1_kv: keys/values come from another input); only "
                "self-attention blocks are a norm -> attention seam"
            )


def _vision_stack(visual: nn.Module | None, host: str) -> nn.Module:
    if visual is None:
        raise HostError(f"host {host!r}: the model has no vision tower 'visual': it is not an open_clip CLIP")
    if _isinstance(visual, "transformer", "VisionTransformer"):
        return visual.transformer
    hint = {
        "TimmModel": "inject the timm trunk on its own: mmpreproj.inject(model.visual.trunk)",
        "ModifiedResNet": "it has no attention blocks; inject the text tower on its own",
    }.get(type(visual).__name__, "inject the text tower on its own")
    raise HostError(
        f"host {host!r}: the vision tower is a {type(visual).__name__}, not an open_clip VisionTransformer; {hint}"
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
    _check_stack(_vision_stack(getattr(model, "visual", None), "open_clip"), "open_clip", "vision")
    _check_stack(_text_stack(model, "open_clip"), "open_clip", "text")


def _check_coca(model: nn.Module) -> None:
    _check_stack(_vision_stack(getattr(model, "visual", None), "open_clip_coca"), "open_clip_coca", "vision")
    _check_stack(_text_stack(model, "open_clip_coca"), "open_clip_coca", "text")
    decoder = getattr(model, "text_decoder", None)
    if decoder is None:
        raise HostError("host 'open_clip_coca': the model has no 'text_decoder': it is not an open_clip CoCa")
    _check_stack(decoder, "open_clip_coca", "decoder")


def _part(name: str, *blocks: str) -> PartSpec:
    """(Custom)ResidualAttentionBlocks: `attn(ln_1(x), ...)`, width = ln_1's weight (both block types)."""
    return PartSpec(name, blocks=blocks, attention="attn", norm="ln_1", call=_CALL)


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
        checkpointing="open_clip",
    )
)

OPEN_CLIP_COCA = register_host(
    HostSpec(
        name="open_clip_coca",
        description="open_clip CoCa: vision tower, text encoder and the decoder's self-attention blocks",
        matches=lambda model: _isinstance(model, "coca_model", "CoCa"),
        check=_check_coca,
        parts=(
            _part("vision", "visual.transformer.resblocks"),
            _part("text", "text.transformer.resblocks"),
            _part("decoder", "text_decoder.resblocks"),
        ),
        embeddings="visual.conv1",
        lora_targets=("out_proj",),
        checkpointing="open_clip",
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
        checkpointing="open_clip",
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
        checkpointing="open_clip",
    )
)

OPEN_CLIP_TRANSFORMER = register_host(
    HostSpec(
        name="open_clip_transformer",
        description="open_clip Transformer / CustomTransformer block stack "
        "(e.g. clip.transformer, a plain CLIP's text tower)",
        matches=_is_stack,
        check=lambda model: _check_stack(model, "open_clip_transformer", "transformer"),
        parts=(_part("blocks", "resblocks"),),
        lora_targets=("out_proj",),
        checkpointing="open_clip",
    )
)

OPEN_CLIP_MULTIMODAL = register_host(
    HostSpec(
        name="open_clip_multimodal",
        description="open_clip MultimodalTransformer (CoCa's text decoder alone): its self-attention blocks",
        matches=lambda model: type(model) is _cls("transformer", "MultimodalTransformer"),
        check=lambda model: _check_stack(model, "open_clip_multimodal", "decoder"),
        parts=(_part("decoder", "resblocks"),),
        lora_targets=("out_proj",),
        checkpointing="open_clip",
    )
)
