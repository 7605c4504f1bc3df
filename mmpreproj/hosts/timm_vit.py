"""timm ViT-family hosts: `VisionTransformer` (and its subclasses: DeiT, hybrids, register/class-token-free
variants) and `Eva` (EVA, EVA02 and other Eva-built models with their own 2D RoPE).

Both use pre-norm blocks whose attention receives `norm1(x)`; the pre-projection sits between `norm1`
and attention, and the skip joins the attention output, i.e. inside the residual branch:

    timm Block:  x = x + drop_path1(ls1(attn(x~) + W_skip·x~)) ;  x = x + drop_path2(ls2(mlp(norm2(x))))
    EvaBlock:    x = x + drop_path1(gamma_1 * (attn(x~, rope=rope) + W_skip·x~)) ;  (MLP branch as above)

with `x~ = PreProj(norm1(x))`. So LayerScale (`ls1` / `gamma_1`) scales the skip and drop-path drops it
together with the attention output; the MLP never sees `x~`. Eva's RoPE is applied inside its attention
to the Q/K projected from `x~` (it is passed as the `rope=` keyword and left untouched). Blocks are called
as `attn(x, attn_mask=..., is_causal=...)` (plus `rope=...` for Eva): `x` is the only positional input and
the attention returns a tensor.

Rejected with a clear error (the model is left untouched): blocks whose attention is not fed by `norm1`
or that have no separate attention module, i.e. `ResPostBlock` and `EvaBlockPostNorm` (post-norm: attention
sees the raw residual stream), `ParallelScalingBlock` / `DiffParallelScalingBlock` (one fused qkv+mlp
projection) and `ParallelThingsBlock` (parallel attentions under `attns[i].attn`).

A `timm.create_model(..., features_only=True)` wrapper (`FeatureGetterNet`) around either model matches the
same row. Nothing here imports timm: a model can only be a timm model if timm is already imported.
"""

from __future__ import annotations

import sys

from torch import nn

from .registry import register_host
from .spec import AttentionCall, HostError, HostSpec, PartSpec

# attn(x, attn_mask=..., is_causal=...[, rope=...]) -> tensor (B, N, d)
_CALL = AttentionCall(inputs=((0, "x"),), output_index=None)


def _timm_class(module: str, name: str) -> type | None:
    return getattr(sys.modules.get(module), name, None)


def _unwrap(model: nn.Module) -> nn.Module:
    """The backbone inside a `features_only=True` wrapper, else the model itself."""
    getter = _timm_class("timm.models._features", "FeatureGetterNet")
    return model.model if getter is not None and isinstance(model, getter) else model


def is_timm_instance(model: nn.Module, module: str, name: str) -> bool:
    """True if `model` (or the backbone of its `features_only` wrapper) is timm's `module.name`."""
    cls = _timm_class(module, name)
    return cls is not None and isinstance(_unwrap(model), cls)


def check_blocks(host: str, supported: dict[str, tuple[str, ...]], hint: str):
    """A row `check`: every block must be one of the timm classes `supported` ({module: (class, ...)});
    HostError naming the first block that is not, the supported classes and `hint` (why / what to use)."""
    names = [f"{m.rsplit('.', 1)[-1]}.{n}" for m, ns in supported.items() for n in ns]  # "eva.EvaBlock"

    def check(model: nn.Module) -> None:
        classes = tuple(c for m, ns in supported.items() for c in (_timm_class(m, n) for n in ns) if c is not None)
        blocks = getattr(_unwrap(model), "blocks", None)
        if blocks is None:
            raise HostError(f"host {host!r}: {type(model).__name__} has no `blocks`")
        for i, block in enumerate(blocks):
            if not classes or not isinstance(block, classes):
                raise HostError(
                    f"host {host!r}: block {i} is a {type(block).__name__}; only timm {' / '.join(names)} "
                    f"(pre-norm, `attn(norm1(x))`) is supported. {hint}"
                )

    return check


def timm_part(
    name: str = "blocks", blocks: tuple[str, ...] = ("blocks", "model.blocks"), norm: str | None = "norm1", **kw
) -> PartSpec:
    """A timm pre-norm block stack: `x + attn(norm1(x))`, attention returns a tensor."""
    return PartSpec(name, blocks=blocks, attention="attn", norm=norm, call=_CALL, **kw)


_VIT_HINT = (
    "ResPostBlock feeds attention the un-normed residual stream, ParallelScalingBlock fuses qkv and mlp "
    "into one projection, ParallelThingsBlock keeps its attentions under `attns[i].attn`."
)

TIMM_VIT = register_host(
    HostSpec(
        name="timm_vit",
        description="timm VisionTransformer and subclasses (DeiT, hybrid, registers) with pre-norm Blocks",
        matches=lambda model: is_timm_instance(model, "timm.models.vision_transformer", "VisionTransformer"),
        check=check_blocks("timm_vit", {"timm.models.vision_transformer": ("Block",)}, _VIT_HINT),
        parts=(timm_part(),),
        embeddings="patch_embed|model.patch_embed",
        lora_targets=("qkv", "proj"),
        checkpointing="timm",
    )
)

TIMM_EVA = register_host(
    HostSpec(
        name="timm_eva",
        description="timm Eva / EVA02 (attention with its own RoPE) with pre-norm EvaBlocks",
        matches=lambda model: is_timm_instance(model, "timm.models.eva", "Eva"),
        check=check_blocks(
            "timm_eva",
            {"timm.models.eva": ("EvaBlock",)},
            "EvaBlockPostNorm (use_post_norm=True) feeds attention the un-normed residual stream.",
        ),
        parts=(timm_part(),),
        embeddings="patch_embed|model.patch_embed",
        lora_targets=("qkv", "q_proj", "k_proj", "v_proj", "proj"),
        checkpointing="timm",
    )
)
