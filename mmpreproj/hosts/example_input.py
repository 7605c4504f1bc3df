"""`example_input(model)`: a small input a model can run one forward on, built from what the model says about
itself; None when it cannot tell (the caller then asks for `example_input=`).

- transformers: the model's `main_input_name` (`input_ids`, `pixel_values`, `input_features`, `input_values`)
  sized from its config (vocabulary, image size and channels, frames, mel bins), plus the other tower's input when
  the forward takes it and the config has that tower (CLIP-style `input_ids` + `pixel_values`; SigLIP2's patches,
  mask and `spatial_shapes`), and `decoder_input_ids` for an encoder-decoder; a VLM decoder gets one image and as
  many image tokens as its `get_image_features` makes of it, then the text (text only when it cannot tell or the
  pair does not run: its vision tower is then named as not run);
- timm: an image of the model's input size (the first `img_size` of its modules, else `pretrained_cfg["input_size"]`);
- open_clip: an image of `visual.image_size` and tokens of `context_length`.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch import nn

from ..util.probing import probing

_TOKENS = 8


def _params(model: nn.Module) -> set[str]:
    try:
        return set(inspect.signature(model.forward).parameters)
    except (TypeError, ValueError):
        return set()


def _device(model: nn.Module) -> torch.device:
    p = next(model.parameters(), None)
    return p.device if p is not None else torch.device("cpu")


def _dtype(model: nn.Module) -> torch.dtype:
    p = next((p for p in model.parameters() if p.is_floating_point()), None)
    return p.dtype if p is not None else torch.float32


def _pair(v: Any) -> tuple[int, int] | None:
    if isinstance(v, int) and v > 0:
        return v, v
    if isinstance(v, (tuple, list)) and len(v) >= 2 and all(isinstance(i, int) and i > 0 for i in v[-2:]):
        return int(v[-2]), int(v[-1])
    if isinstance(v, dict) and isinstance(v.get("height"), int) and isinstance(v.get("width"), int):
        return v["height"], v["width"]
    return None


def _sub(config: Any, *names: str) -> Any:
    for n in names:
        c = getattr(config, n, None)
        if c is not None and not isinstance(c, (int, float, str, bool, list, tuple, dict)):
            return c
    return None


def _vocab(config: Any) -> int | None:
    for c in (config, _sub(config, "text_config", "decoder", "language_config")):
        v = getattr(c, "vocab_size", None) if c is not None else None
        if isinstance(v, int) and v > 1:
            return v
    return None


def _image(config: Any, g: torch.Generator) -> torch.Tensor | None:
    for c in (_sub(config, "vision_config", "backbone_config"), config):
        if c is None:
            continue
        size = _pair(getattr(c, "image_size", None)) or _pair(getattr(c, "img_size", None))
        channels = getattr(c, "num_channels", None) or getattr(c, "in_channels", None) or 3
        frames = getattr(c, "num_frames", None)
        if size is not None and isinstance(channels, int):  # a video model: (batch, frames, channels, h, w)
            lead = (1, frames) if isinstance(frames, int) and frames > 0 else (1,)
            return torch.randn(*lead, channels, *size, generator=g)
    return None


def _image_token(config: Any) -> int | None:
    """A VLM's image placeholder token id (`image_token_id` / `image_token_index`), else None."""
    return next(
        (v for k in ("image_token_id", "image_token_index") if isinstance(v := getattr(config, k, None), int)), None
    )


def _feature_rows(features: Any) -> int | None:
    """How many placeholder tokens `get_image_features` output fills: its rows over every image."""
    features = getattr(features, "pooler_output", features)
    tensors = [features] if isinstance(features, torch.Tensor) else list(features or ())
    if not tensors or not all(isinstance(t, torch.Tensor) and t.dim() >= 2 for t in tensors):
        return None
    return sum(t.numel() // t.shape[-1] for t in tensors)


def _with_image_tokens(model: nn.Module, ids: torch.Tensor, pixels: torch.Tensor, token: int) -> dict | None:
    """`input_ids` holding one image's placeholder tokens, as many as the model's `get_image_features` makes of
    `pixels`, then the text, and the pixels; None (the text alone) when the model cannot tell or cannot run it."""
    get = getattr(model, "get_image_features", None)
    if not callable(get):
        return None
    config, params = model.config, set(inspect.signature(get).parameters)
    kwargs = {k: getattr(config, k) for k in ("vision_feature_layer", "vision_feature_select_strategy") if k in params}
    pixels = pixels.to(_device(model), _dtype(model))
    try:
        with probing(model), torch.no_grad():
            rows = _feature_rows(get(pixel_values=pixels, **kwargs))
            if not rows:
                return None
            text = torch.where(ids == token, torch.full_like(ids, max(0, token - 1)), ids)
            out = {"input_ids": torch.cat([torch.full((1, rows), token, dtype=ids.dtype), text], dim=1)}
            out["pixel_values"] = pixels
            model(**out)  # the pair runs (else the text alone, and the tower is named as not run)
    except Exception:  # noqa: BLE001 - any model that cannot run it keeps the text-only input
        return None
    return out


def _transformers_input(model: nn.Module, g: torch.Generator) -> dict | None:
    config = model.config
    params = _params(model)
    main = getattr(model, "main_input_name", "input_ids")
    vocab = _vocab(config)
    ids = torch.randint(min(3, vocab - 1), vocab, (1, _TOKENS), generator=g) if vocab else None
    out: dict[str, torch.Tensor] = {}
    if main == "input_ids":
        if ids is None:
            return None
        out["input_ids"] = ids
        pixels = _image(config, g) if "pixel_values" in params and _sub(config, "vision_config") is not None else None
        token = _image_token(config)
        if pixels is not None and token is None:  # a two-tower model (CLIP, SigLIP) takes both
            out["pixel_values"] = pixels
        elif pixels is not None:  # a VLM decoder: its images need their tokens in the text
            out.update(_with_image_tokens(model, ids, pixels, token) or {})
        vision = _sub(config, "vision_config")
        patches, patch = getattr(vision, "num_patches", None), getattr(vision, "patch_size", None)
        if "spatial_shapes" in params and isinstance(patches, int) and isinstance(patch, int):  # NaFlex (SigLIP2)
            side = int(patches**0.5)
            out["pixel_values"] = torch.randn(1, side * side, 3 * patch * patch, generator=g)
            out["pixel_attention_mask"] = torch.ones(1, side * side, dtype=torch.long)
            out["spatial_shapes"] = torch.tensor([[side, side]])
    elif main == "pixel_values":
        pixels = _image(config, g)
        if pixels is None:
            return None
        out["pixel_values"] = pixels
        if "input_ids" in params and ids is not None and _sub(config, "text_config") is not None:
            out["input_ids"] = ids
    elif main == "input_features":
        bins = getattr(config, "num_mel_bins", None) or getattr(config, "feature_size", None)
        frames = 2 * (getattr(config, "max_source_positions", 0) or 0) or 64
        if not isinstance(bins, int):
            return None
        out["input_features"] = torch.randn(1, bins, frames, generator=g)
    elif main == "input_values":
        out["input_values"] = torch.randn(1, 1600, generator=g)
    else:
        return None
    if "decoder_input_ids" in params and getattr(config, "is_encoder_decoder", False):
        start = getattr(config, "decoder_start_token_id", None)
        start = start if isinstance(start, int) else 0
        out["decoder_input_ids"] = torch.full((1, 4), start, dtype=torch.long)
    return out


def example_input(model: nn.Module) -> dict | None:
    """Keyword inputs for one forward of `model`, on its device (floats in its dtype); None if unknown."""
    g = torch.Generator().manual_seed(0)
    config = getattr(model, "config", None)
    if config is not None and hasattr(config, "model_type"):
        out = _transformers_input(model, g)
    elif hasattr(model, "pretrained_cfg") or hasattr(model, "default_cfg"):  # timm
        size = next((_pair(m.img_size) for m in model.modules() if _pair(getattr(m, "img_size", None))), None)
        if size is None:
            cfg = getattr(model, "pretrained_cfg", None) or getattr(model, "default_cfg", None) or {}
            size = _pair(tuple(cfg.get("input_size", ()))) if isinstance(cfg, dict) else None
        chans = getattr(model, "in_chans", None) or 3
        out = {"x": torch.randn(1, chans, *size, generator=g)} if size else None
        if out is not None and "x" not in _params(model):
            out = None if not _params(model) else {next(iter(_params(model))): out["x"]}
    elif hasattr(model, "visual") and hasattr(model, "encode_text"):  # open_clip
        size = _pair(getattr(model.visual, "image_size", None))
        length = getattr(model, "context_length", None)
        vocab = getattr(model, "vocab_size", None)
        out = (
            {
                "image": torch.randn(1, 3, *size, generator=g),
                "text": torch.randint(1, vocab, (1, min(length, _TOKENS)), generator=g),
            }
            if size and isinstance(length, int) and isinstance(vocab, int)
            else None
        )
    else:
        out = None
    if out is None:
        return None
    device, dtype = _device(model), _dtype(model)
    return {k: v.to(device, dtype if v.is_floating_point() else v.dtype) for k, v in out.items()}
