"""timm window-attention hosts: `SwinTransformer` (row `timm_swin`) and `MaxxVit` / MaxViT (row `timm_maxvit`).

Both blocks are pre-norm, but their attention receives *windows of* the norm's output, never the norm's
output tensor itself:

    Swin SwinTransformerBlock (B, H, W, d):
        s = norm1(x)
        w = window_partition(pad(roll(s, -shift)))     (B*nW, ws*ws, d): cyclic shift, zero pad to a multiple
        a = attn(w, mask=m)                             of the window, windows; m masks the shifted windows
        x = x + drop_path1(roll(crop(window_reverse(a)), shift))
    MaxViT PartitionAttentionCl (B, H, W, d), channels last (MaxxVitBlock's `attn_block` and `attn_grid`):
        w = window_partition(norm1(x)) | grid_partition(norm1(x))   (B*nW, p, p, d): a permutation, no padding
        x = x + drop_path1(ls1(window_reverse(attn(w)) | grid_reverse(attn(w))))

Norm handling (the documented choice). The pre-projection wraps `attn`, so it runs on the windowed tensor,
and the rows name no `norm`: the identity seam check compares the attention input with the norm's output
tensor, which it never is here (`unchecked_seam`, set in code, silently, as the transformers Swin row). The
width is read from `norm1`. The `check` of each row admits only the timm classes whose forward is the
above, so what is unchecked is only that the windows are windows of `norm1(x)`, which that forward says.
The result is exact: the pre-projection and the skip act on each token alone, so pre-projecting the windows
equals windowing the pre-projected tokens (`x~ = PreProj(norm1(x))`); Swin's zero pad tokens stay exactly
zero, as the pre-projection is bias-free with act(0) = 0 (silu, gelu, relu), so the attention sees the
same zero tokens as the untouched model; the skip joins the attention output in the window layout and is
un-windowed (and its pad tokens cropped) with it, so it equals `W_skip·x~` on the token grid, inside MaxViT's
`ls1` and both rows' `drop_path1`. Positions stay inside attention: Swin's relative position bias and shift
mask, MaxViT's relative position bias / MLP.

Refused with the reason (the model is left untouched): MaxxVit models with channels-first attention
(`PartitionAttention2d`, `transformer_cfg.use_nchw_attn=True`; CoAtNet's `TransformerBlock2d`): their attention
takes (B, d, H, W) tensors and 1x1-conv projections, so a token-wise map on the last dim would mix spatial
positions; and MaxxViT-V2's `ParallelPartitionAttention` (one norm feeding two half-width attentions whose
outputs are concatenated, so no single attention output has the input's width for the skip). Nearest
supported form: the default MaxViT / MaxxViT (channels-last `PartitionAttentionCl`).

A `timm.create_model(..., features_only=True)` net of either family (`FeatureListNet`: the backbone's children,
flattened, same blocks in the same order) matches the same row and takes the full model's adapter. The blocks
are found by class (`*:SwinTransformerBlock`, `*:PartitionAttentionCl`), as stages nest them. Nothing here
imports timm: classes are looked up in `sys.modules`.
"""

from __future__ import annotations

import sys

from torch import nn

from .registry import register_host
from .spec import HostError, HostSpec
from .timm_vit import is_timm_instance, timm_part

_MAXXVIT = "timm.models.maxxvit"


def _timm_class(module: str, name: str) -> type | None:
    """timm's class `module.name` if timm has imported it, else None (a model can only be of a loaded class)."""
    return getattr(sys.modules.get(module), name, None)


# class name -> why its attention has no token-wise seam
_MAXXVIT_REFUSED = {
    "PartitionAttention2d": "channels-first attention (use_nchw_attn=True): attn takes (B, d, H, W) with 1x1-conv "
    "projections, so a map on the last dim would mix spatial positions",
    "TransformerBlock2d": "CoAtNet's channels-first transformer block: attn takes (B, d, H, W) with 1x1-conv "
    "projections, so a map on the last dim would mix spatial positions",
    "ParallelPartitionAttention": "MaxxViT-V2's parallel block: one norm feeds two half-width attentions whose "
    "outputs are concatenated, so no attention output has the input's width for the skip",
}


def _matches(model: nn.Module, module: str, name: str, blocks: tuple[str, ...]) -> bool:
    """`model` is timm's `module.name` (or its `features_only` getter), or a `features_only=True` FeatureListNet
    (the backbone's own children, flattened) that holds one of that family's attention `blocks` classes."""
    if is_timm_instance(model, module, name):
        return True
    features = _timm_class("timm.models", "FeatureListNet")
    classes = tuple(c for b in blocks if (c := _timm_class(module, b)) is not None)
    return (
        features is not None
        and bool(classes)
        and isinstance(model, features)
        and any(type(m) in classes for m in model.modules())
    )


def _check_maxvit(model: nn.Module) -> None:
    """HostError naming the first MaxxVit attention block that has no token-wise seam, and why."""
    refused = {n: c for n in _MAXXVIT_REFUSED if (c := _timm_class(_MAXXVIT, n)) is not None}
    for path, m in model.named_modules():
        for name, cls in refused.items():
            if type(m) is cls:
                raise HostError(
                    f"host 'timm_maxvit': {path} is a {name}: {_MAXXVIT_REFUSED[name]}. Only the channels-last "
                    "PartitionAttentionCl (`attn(window_partition(norm1(x)))`, the default MaxViT / MaxxViT "
                    "transformer_cfg) is supported"
                )


def _check_swin(model: nn.Module) -> None:
    cls = _timm_class("timm.models.swin_transformer", "SwinTransformerBlock")
    if cls is None or not any(type(m) is cls for m in model.modules()):
        raise HostError(f"host 'timm_swin': {type(model).__name__} has no timm SwinTransformerBlock")


TIMM_SWIN = register_host(
    HostSpec(
        name="timm_swin",
        description="timm SwinTransformer (shifted window attention; the seam is not identity-checked, see the "
        "module doc)",
        matches=lambda model: _matches(
            model, "timm.models.swin_transformer", "SwinTransformer", ("SwinTransformerBlock",)
        ),
        check=_check_swin,
        # attention receives window_partition(pad(roll(norm1(x)))) (B*nW, ws*ws, d): no identity seam check
        parts=(timm_part(blocks=("*:SwinTransformerBlock",), norm=None, unchecked_seam=True, width="norm1.weight"),),
        embeddings="patch_embed|model.patch_embed",
        lora_targets=("qkv", "proj"),
        checkpointing="timm",
    )
)

TIMM_MAXVIT = register_host(
    HostSpec(
        name="timm_maxvit",
        description="timm MaxxVit (MaxViT / MaxxViT block + grid attention, channels last; the seam is not "
        "identity-checked, see the module doc)",
        matches=lambda model: _matches(model, _MAXXVIT, "MaxxVit", ("PartitionAttentionCl", *_MAXXVIT_REFUSED)),
        check=_check_maxvit,
        # attention receives window_partition | grid_partition(norm1(x)) (B*nW, p, p, d): no identity seam check
        parts=(timm_part(blocks=("*:PartitionAttentionCl",), norm=None, unchecked_seam=True, width="norm1.weight"),),
        embeddings="stem|model.stem",
        lora_targets=("qkv", "proj"),
        checkpointing="timm",
    )
)
