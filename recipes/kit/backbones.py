"""Vision backbones for frozen probes: pretrained timm / open_clip towers, or tiny random ones for offline runs.

    backbone = load_backbone("timm:vit_small_patch16_224")                 # pretrained, or BackboneUnavailable
    backbone = load_backbone("timm:vit_small_patch16_224", checkpoint="vit_s.safetensors")   # a local file
    backbone = load_backbone("timm:vit_tiny_patch16_224", checkpoint="assets/mini-vit")    # + its config.json
    backbone = load_backbone("open_clip:ViT-B-32:openai")
    backbone = load_backbone("random-tiny")                                # offline smoke: tiny timm ViT
    backbone = load_backbone("random-tiny-clip")                           # offline smoke: tiny open_clip tower

`backbone.model(images)` returns pooled features (B, backbone.dim). Nothing is downloaded when the Hub is
unreachable: then only a local checkpoint or the Hugging Face cache is used, and a missing one fails at once
with a one-line `BackboneUnavailable`.

Recipe code, so it may do what the library never does: `_offline_if_unreachable` sets `HF_HUB_OFFLINE` (and
huggingface_hub's constant) for the rest of the process, and open_clip's own multi-line error log is muted
(`logging.disable`) while one model is created.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import torch
from torch import nn

from mmpreproj.data.hub import hub_offline, hub_reachable

__all__ = ["Backbone", "BackboneUnavailable", "BACKBONE_HINT", "load_backbone"]

BACKBONE_HINT = "pass --checkpoint PATH or run with --backbone random-tiny"
IMAGENET = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
CLIP = ((0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711))


class BackboneUnavailable(RuntimeError):
    """Pretrained weights cannot be had (no network, no cache, no checkpoint); the message is one line."""


@dataclass
class Backbone:
    """A feature extractor and what a probe needs to know about it.

    Args:
        model: images (B, 3, S, S) -> features (B, dim).
        dim: feature width.
        img_size: the input side S it expects.
        mean, std: per-channel input normalisation.
        lora_targets: peft `target_modules` regex for attention-only LoRA (timm: qkv + proj Linears; open_clip:
            the nn.MultiheadAttention modules, which peft wraps as a whole).
        family: "timm" or "open_clip".
    """

    model: nn.Module
    dim: int
    img_size: int
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    lora_targets: str
    family: str


def _offline_if_unreachable() -> None:
    """No network: let huggingface_hub read its cache only, instead of retrying for a minute."""
    if not hub_offline() and not hub_reachable():
        os.environ["HF_HUB_OFFLINE"] = "1"
        import huggingface_hub.constants as hf_constants

        hf_constants.HF_HUB_OFFLINE = True  # read at import time; the library may be imported already


def _saved_timm_config(name: str, checkpoint: str) -> tuple[str, dict, dict]:
    """(weights file, model_args, pretrained_cfg fields) of a checkpoint saved in timm's Hub format.

    `checkpoint` is a folder holding model.safetensors + config.json (`timm.models.save_for_hf`) or a weights
    file; a config.json beside the file is read as data: its `model_args` become constructor kwargs (as
    `timm.create_model("local-dir:...")` does) and its input size and normalisation reach the backbone. The
    file's `architecture` must be `name`. No config.json: (checkpoint, {}, {}), the model as `name` builds it.
    """
    import json
    from pathlib import Path

    path = Path(checkpoint)
    file = path / "model.safetensors" if path.is_dir() else path
    config = file.parent / "config.json"
    if not config.is_file():
        return str(file), {}, {}
    saved = json.loads(config.read_text())
    arch = saved.get("architecture")
    if arch != name:
        raise BackboneUnavailable(f"{config} is for architecture {arch!r}, not {name!r}; use --backbone timm:{arch}")
    args = saved.get("model_args") or {}
    if not isinstance(args, dict):
        raise BackboneUnavailable(f"{config}: model_args must be a JSON object, got {type(args).__name__}")
    args = {k: v for k, v in args.items() if k != "num_classes"}  # the probe asks for features (num_classes=0)
    pcfg = saved.get("pretrained_cfg") or {}
    fields = {k: tuple(pcfg[k]) for k in ("input_size", "mean", "std") if k in pcfg}
    return str(file), args, fields


def _timm(name: str, checkpoint: str | None) -> Backbone:
    import timm

    try:
        if checkpoint:
            file, args, fields = _saved_timm_config(name, checkpoint)
            model = timm.create_model(
                name, pretrained=True, num_classes=0, pretrained_cfg_overlay={"file": file, **fields}, **args
            )
        else:
            _offline_if_unreachable()
            model = timm.create_model(name, pretrained=True, num_classes=0)
    except BackboneUnavailable:
        raise
    except Exception as e:  # noqa: BLE001  (timm raises many kinds; all mean "no weights")
        where = f"from {checkpoint!r}" if checkpoint else "(no network?)"
        raise BackboneUnavailable(
            f"cannot load timm weights {name!r} {where}: {type(e).__name__}; {BACKBONE_HINT}"
        ) from None
    cfg = model.pretrained_cfg
    size = int(cfg.get("input_size", (3, 224, 224))[-1])
    return Backbone(
        model,
        model.num_features,
        size,
        tuple(cfg.get("mean", IMAGENET[0])),
        tuple(cfg.get("std", IMAGENET[1])),
        r".*\.attn\.(qkv|proj)",
        "timm",
    )


def _open_clip(spec: str, checkpoint: str | None) -> Backbone:
    import open_clip

    arch, _, tag = spec.partition(":")
    if not (tag or checkpoint):
        raise ValueError(f"open_clip backbone {spec!r} needs weights: open_clip:ARCH:TAG or --checkpoint PATH")
    try:
        if not checkpoint:
            _offline_if_unreachable()
        logging.disable(logging.ERROR)  # open_clip logs its own multi-line error before raising
        try:
            model = open_clip.create_model(arch, pretrained=checkpoint or tag or None)
        finally:
            logging.disable(logging.NOTSET)
    except Exception as e:  # noqa: BLE001
        where = f"from {checkpoint!r}" if checkpoint else f"tag {tag!r} (no network?)"
        raise BackboneUnavailable(
            f"cannot load open_clip weights {arch!r} {where}: {type(e).__name__}; {BACKBONE_HINT}"
        ) from None
    visual = model.visual
    return Backbone(visual, visual.output_dim, int(visual.image_size[0]), *CLIP, r".*\.attn", "open_clip")


def _random_tiny(clip: bool, seed: int) -> Backbone:
    torch.manual_seed(seed)
    if clip:
        from open_clip.transformer import VisionTransformer as ClipTower

        tower = ClipTower(image_size=32, patch_size=4, width=64, layers=4, heads=4, mlp_ratio=2.0, output_dim=64)
        return Backbone(tower, 64, 32, *CLIP, r".*\.attn", "open_clip")
    from timm.models.vision_transformer import VisionTransformer

    vit = VisionTransformer(
        img_size=32, patch_size=4, embed_dim=64, depth=4, num_heads=4, mlp_ratio=2.0, num_classes=0, qkv_bias=True
    )
    return Backbone(vit, 64, 32, *IMAGENET, r".*\.attn\.(qkv|proj)", "timm")


def load_backbone(spec: str, checkpoint: str | None = None, seed: int = 0) -> Backbone:
    """A backbone from "timm:NAME", "open_clip:ARCH[:TAG]", "random-tiny" or "random-tiny-clip"."""
    if spec in ("random-tiny", "random-tiny-clip"):
        return _random_tiny(spec.endswith("clip"), seed)
    family, _, rest = spec.partition(":")
    if family == "timm" and rest:
        return _timm(rest, checkpoint)
    if family == "open_clip" and rest:
        return _open_clip(rest, checkpoint)
    raise ValueError(
        f"unknown backbone {spec!r}: use timm:NAME, open_clip:ARCH[:TAG], random-tiny or random-tiny-clip"
    )
