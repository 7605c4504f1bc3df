"""timm models that share the ViT block shape but are not `VisionTransformer`s: Beit, NaFlexVit,
VisionTransformerRelPos and VisionTransformerSAM (one row each; helpers from `timm_vit`).

Every supported block calls its attention on `norm1(x)` and adds the result to the residual stream, so the
pre-projection goes between `norm1` and attention and the skip joins the attention output, inside the
block's LayerScale and drop-path (`x~ = PreProj(norm1(x))`, as for the `timm_vit` row):

    Beit Block:        x = x + drop_path1(gamma_1 * (attn(x~, shared_rel_pos_bias=b) + W_skip·x~))
    NaFlexVit:         vision_transformer.Block `attn(x~, attn_mask=m)` or eva.EvaBlock `attn(x~, rope=r, attn_mask=m)`
    RelPosBlock:       x = x + drop_path1(ls1(attn(x~, shared_rel_pos=b) + W_skip·x~))
    SAM Block:         see below

Positions stay inside attention and are untouched: Beit's relative position bias (per block, or shared and
passed as `shared_rel_pos_bias=`), RelPos's log-coordinate bias (`shared_rel_pos=`), NaFlexVit's RoPE
(`rope=`, axial / mixed / dinov3 / mrope) and its padding mask (`attn_mask=`, built from `patch_valid`), and
SAM's decomposed relative positions or RoPE. The pre-projection acts on each token alone, so it sits ahead
of all of them; a padded NaFlex token is pre-projected like any other and stays masked.

SAM (`VisionTransformerSAM`, row `timm_vit_sam`). Its Block is

    s = norm1(x)                               (B, H, W, d)
    w = window_partition(s)                    (B*nW, ws, ws, d): zero-pads H, W to a multiple of ws, permutes
    a = drop_path1(ls1(attn(w)))               windowed blocks; global blocks (window_size 0) skip partition
    x = x + window_unpartition(a)              permutes back, crops the padding

so its attention receives `window_partition(norm1(x))`, not `norm1(x)` itself: a permutation of the normed
tokens plus zero tokens. The pre-projection wraps `attn`, so it runs on the windowed tensor:
`PreProj(window_partition(s)) == window_partition(PreProj(s))` token by token, and the zero pad tokens stay
exactly zero because the pre-projection and the skip are bias-free with act(0) = 0 (silu, gelu, relu), so
the attention sees the same zero keys/values as the untouched model. The skip is added to the attention
output in the windowed layout, inside `ls1` and `drop_path1`, and un-windowed with it; as the skip is
token-wise, `window_unpartition(attn(w~) + W_skip·w~)` equals `window_unpartition(attn(w~)) + W_skip·x~` on
the un-windowed grid (the padding is cropped, and it was zero). Chosen placement: the skip joins the
attention output before un-windowing, so that LayerScale scales it and timm's drop-path (which draws one
keep/drop per *window*, the first dim of the windowed tensor) drops it together with that window's
attention output, the same rule as every other timm row. `tests/test_host_timm.py` pins it on a padded
grid from raw weights. The row names no `norm` (the attention input is not the norm's output tensor, so the
identity seam check cannot apply); its `check` accepts only timm's SAM `Block`, whose forward is the above.

Refused with the reason (the model is left untouched): `ResPostRelPosBlock` (post-norm: attention sees the
raw residual stream; nearest: `RelPosBlock`, the default `block_fn`), and NaFlexVit / Beit / SAM stacks
built with any other `block_fn` (e.g. ParallelScalingBlock's fused qkv+mlp projection). Nothing here
imports timm: classes are looked up in `sys.modules`.
"""

from __future__ import annotations

from .registry import register_host
from .spec import HostSpec
from .timm_vit import check_blocks, is_timm_instance, timm_part

_EMBED = "patch_embed|model.patch_embed"
_QKV = ("qkv", "proj")

TIMM_BEIT = register_host(
    HostSpec(
        name="timm_beit",
        description="timm Beit (BEiT, BEiT v2) with relative position bias inside attention",
        matches=lambda model: is_timm_instance(model, "timm.models.beit", "Beit"),
        check=check_blocks(
            "timm_beit", {"timm.models.beit": ("Block",)}, "A Beit built with another block has no row."
        ),
        parts=(timm_part(),),
        embeddings=_EMBED,
        lora_targets=_QKV,
        checkpointing="timm",
    )
)

TIMM_NAFLEXVIT = register_host(
    HostSpec(
        name="timm_naflexvit",
        description="timm NaFlexVit (variable resolution / aspect, padding masks, optional RoPE)",
        matches=lambda model: is_timm_instance(model, "timm.models.naflexvit", "NaFlexVit"),
        check=check_blocks(
            "timm_naflexvit",
            {"timm.models.vision_transformer": ("Block",), "timm.models.eva": ("EvaBlock",)},
            "NaFlexVit uses Block by default and EvaBlock for RoPE / SwiGLU / GQA configs; another "
            "`block_fn` (ParallelScalingBlock, ResPostBlock) does not feed attention `norm1(x)` alone.",
        ),
        parts=(timm_part(),),
        embeddings="embeds|model.embeds",
        lora_targets=("qkv", "q_proj", "k_proj", "v_proj", "proj"),
        checkpointing="timm",
    )
)

TIMM_VIT_RELPOS = register_host(
    HostSpec(
        name="timm_vit_relpos",
        description="timm VisionTransformerRelPos (log-coordinate relative position bias) with RelPosBlocks",
        matches=lambda model: is_timm_instance(
            model, "timm.models.vision_transformer_relpos", "VisionTransformerRelPos"
        ),
        check=check_blocks(
            "timm_vit_relpos",
            {"timm.models.vision_transformer_relpos": ("RelPosBlock",)},
            "ResPostRelPosBlock is post-norm (`x + norm1(attn(x))`): its attention sees the raw residual stream, "
            "never a norm's output, so there is no seam for the pre-projection. The nearest supported form is "
            "RelPosBlock (the default block_fn) on this row.",
        ),
        parts=(timm_part(),),
        embeddings=_EMBED,
        lora_targets=_QKV,
        checkpointing="timm",
    )
)

TIMM_VIT_SAM = register_host(
    HostSpec(
        name="timm_vit_sam",
        description="timm VisionTransformerSAM (windowed + global attention, decomposed rel-pos or RoPE)",
        matches=lambda model: is_timm_instance(model, "timm.models.vision_transformer_sam", "VisionTransformerSAM"),
        check=check_blocks(
            "timm_vit_sam",
            {"timm.models.vision_transformer_sam": ("Block",)},
            "Its forward is `attn(window_partition(norm1(x)))`; another block has no row.",
        ),
        # attention receives window_partition(norm1(x)) (B*nW, ws, ws, d), a token-wise rearrangement of the
        # norm's output: no identity seam check (norm=None), the width from norm1
        parts=(timm_part(norm=None, unchecked_seam=True, width="norm1.weight"),),
        embeddings=_EMBED,
        lora_targets=_QKV,
        checkpointing="timm",
    )
)
