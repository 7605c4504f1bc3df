"""Tiny mixed text/image/video models (the mixed recipe's `recipes.mixed.tinyvlm`) built in code for
tests/test_mixed_*.py."""

from __future__ import annotations

import torch

import mmpreproj
from recipes.mixed.tinyvlm import (
    MarkerIds,
    MixedModel,
    MixedSample,
    NativeDecoder,
    PatchTower,
    VisionProjector,
    inject_decoder,
)

# The Qwen2-VL test config's ids, so a builder sequence can be fed to get_rope_index unchanged.
VSTART, VEND, IMAGE_ID, VIDEO_ID = 28, 29, 30, 31
MARKERS = MarkerIds(image=IMAGE_ID, video=VIDEO_ID, vision_start=VSTART, vision_end=VEND, pad=0)
VOCAB = 40
PATCH, MERGE = 4, 2  # a 16x24-pixel image -> 4x6 patches -> 2x3 decoder tokens


def tiny_mixed(position_mode: str = "mrope", inject: bool = True, seed: int = 0, tower_depth: int = 1,
               layout: str = "chunked") -> MixedModel:  # fmt: skip
    torch.manual_seed(seed)
    dec = NativeDecoder(VOCAB, width=64, depth=2, num_heads=2, layout=layout)
    model = MixedModel(
        PatchTower(PATCH, 32, tower_depth, 2), VisionProjector(32, 64, MERGE), dec, MARKERS, position_mode
    )
    if inject:  # skip weights large enough that the content path changes the outputs
        inject_decoder(model, mmpreproj.PreProjConfig(skip_init_std=0.05, freeze_base=False))
    return model.eval()


def mixed_samples(seed: int = 0) -> list[MixedSample]:
    """Three prompts of different lengths: two images of different sizes, a video and an image, text only."""
    g = torch.Generator().manual_seed(seed)

    def px(*shape):
        return torch.randn(*shape, generator=g)

    return [
        MixedSample([5, 6, IMAGE_ID, 7, IMAGE_ID, 8], images=[px(3, 16, 24), px(3, 8, 8)]),
        MixedSample([9, VIDEO_ID, 10, IMAGE_ID, 11], images=[px(3, 24, 16)], videos=[px(3, 3, 16, 16)]),
        MixedSample([12, 13, 14]),
    ]
