"""The shipped mini-ViT as an open_clip image tower: the same function, weights copied over, no training.

A timm VisionTransformer with a class token, learned positions, pre-norm blocks and no pre-norm maps exactly
onto open_clip's `VisionTransformer` with:
  - `no_ln_pre=True` (timm's `norm_pre` is Identity), `norm_layer` = LayerNorm(eps=1e-6) (timm's eps),
    `pool_type="tok"`, `final_ln_after_pool=False` (timm norms every token, then takes the class token);
  - the patch conv's bias (open_clip's `conv1` has none) folded into the patch tokens' positions:
    conv(x) + b + pos[1:] == conv_nobias(x) + (pos[1:] + b);
  - `attn.qkv` -> `attn.in_proj_weight/bias` (q, k, v in the same order), `attn.proj` -> `attn.out_proj`,
    `mlp.fc1/fc2` -> `mlp.c_fc/c_proj`, `norm1/2` -> `ln_1/2`, `norm` -> `ln_post`;
  - `proj` = the identity (output_dim = width), so the tower returns timm's pooled features (B, width).

    .venv/bin/python recipes/vision/mini_vit_open_clip.py        # converts and prints the largest difference
"""

from __future__ import annotations

import argparse
import sys
from functools import partial
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: `recipes.kit`
from mmpreproj.data import asset_path  # noqa: E402
from recipes.kit.backbones import Backbone  # noqa: E402

__all__ = ["open_clip_backbone", "to_open_clip"]


def to_open_clip(vit: nn.Module) -> nn.Module:
    """An open_clip `VisionTransformer` computing `vit.forward_head(vit.forward_features(x), pre_logits=True)`."""
    from open_clip.transformer import LayerNorm, VisionTransformer

    if getattr(vit, "global_pool", None) != "token" or not vit.has_class_token or vit.num_prefix_tokens != 1:
        raise ValueError("to_open_clip needs a timm ViT with one class token and global_pool='token'")
    if not isinstance(vit.norm_pre, nn.Identity) or not isinstance(vit.fc_norm, nn.Identity):
        raise ValueError("to_open_clip needs norm_pre and fc_norm to be Identity (open_clip has neither)")
    width, depth = vit.embed_dim, len(vit.blocks)
    heads = vit.blocks[0].attn.num_heads
    mlp = vit.blocks[0].mlp.fc1.out_features
    img, patch = vit.patch_embed.img_size[0], vit.patch_embed.patch_size[0]
    tower = VisionTransformer(
        image_size=img,
        patch_size=patch,
        width=width,
        layers=depth,
        heads=heads,
        mlp_ratio=mlp / width,
        output_dim=width,
        no_ln_pre=True,
        pool_type="tok",
        norm_layer=partial(LayerNorm, eps=vit.norm.eps),
    )
    with torch.no_grad():
        tower.conv1.weight.copy_(vit.patch_embed.proj.weight)
        pos = vit.pos_embed[0].clone()  # (1 + N, width)
        pos[1:] += vit.patch_embed.proj.bias  # the conv bias, folded into the patch tokens
        tower.positional_embedding.copy_(pos)
        tower.class_embedding.copy_(vit.cls_token[0, 0])
        for src, dst in zip(vit.blocks, tower.transformer.resblocks):
            dst.ln_1.load_state_dict(src.norm1.state_dict())
            dst.ln_2.load_state_dict(src.norm2.state_dict())
            dst.attn.in_proj_weight.copy_(src.attn.qkv.weight)  # (3 * width, width), q k v
            dst.attn.in_proj_bias.copy_(src.attn.qkv.bias)
            dst.attn.out_proj.load_state_dict(src.attn.proj.state_dict())
            dst.mlp.c_fc.load_state_dict(src.mlp.fc1.state_dict())
            dst.mlp.c_proj.load_state_dict(src.mlp.fc2.state_dict())
        tower.ln_post.load_state_dict(vit.norm.state_dict())
        tower.proj.copy_(torch.eye(width))
    return tower


def open_clip_backbone(folder: str | Path | None = None) -> Backbone:
    """The mini-ViT checkpoint (default assets/mini-vit) as an open_clip tower, with its own normalisation."""
    import timm

    folder = Path(folder or asset_path("mini-vit"))
    vit = timm.create_model(f"local-dir:{folder}", pretrained=True, num_classes=0).eval()
    cfg = vit.pretrained_cfg
    tower = to_open_clip(vit).eval()
    return Backbone(
        tower,
        tower.output_dim,
        int(cfg["input_size"][-1]),
        tuple(cfg["mean"]),
        tuple(cfg["std"]),
        r".*\.attn",
        "open_clip",
    )


def main() -> None:
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    import timm

    folder = asset_path("mini-vit")
    vit = timm.create_model(f"local-dir:{folder}", pretrained=True, num_classes=0).eval()
    tower = open_clip_backbone(folder).model
    x = torch.randn(16, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        a, b = vit(x), tower(x)  # (16, width) each
    print(
        f"timm vs open_clip features: max |diff| {(a - b).abs().max().item():.2e} (max |feature| "
        f"{a.abs().max().item():.2f})"
    )


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: `recipes.command`
    from recipes.command import run_main  # a refusal in one line naming its flags

    run_main(main)
