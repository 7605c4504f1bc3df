"""Tiny mixed text/image/video models built in code for the tests/test_mixed_*.py files."""

from __future__ import annotations

import torch
from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

import mmpreproj
from mmpreproj.mixed import (
    MarkerIds,
    MixedModel,
    MixedSample,
    NativeDecoder,
    NeoXDecoder,
    PatchTower,
    VisionProjector,
)

# The Qwen2-VL test config's ids, so a builder sequence can be fed to get_rope_index unchanged.
VSTART, VEND, IMAGE_ID, VIDEO_ID = 28, 29, 30, 31
MARKERS = MarkerIds(image=IMAGE_ID, video=VIDEO_ID, vision_start=VSTART, vision_end=VEND, pad=0)
VOCAB = 40
PATCH, MERGE = 4, 2  # a 16x24-pixel image -> 4x6 patches -> 2x3 decoder tokens


def tiny_neox_lm(seed: int = 0) -> GPTNeoXForCausalLM:
    """2 blocks, head_dim 32, rotary_pct 0.25 (Pythia's layout): 8 rotary channels = 4 pairs -> sections (2, 1, 1)."""
    torch.manual_seed(seed)
    cfg = GPTNeoXConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=128, rotary_pct=0.25, max_position_embeddings=256,
                        use_parallel_residual=True, tie_word_embeddings=False)  # fmt: skip
    return GPTNeoXForCausalLM(cfg).eval()


def tiny_mixed(decoder: str = "native", position_mode: str = "mrope", inject: bool = True, seed: int = 0,
               tower_depth: int = 1) -> MixedModel:  # fmt: skip
    torch.manual_seed(seed)
    dec = (
        NativeDecoder(VOCAB, width=64, depth=2, num_heads=2)
        if decoder == "native"
        else NeoXDecoder(tiny_neox_lm(seed))
    )
    model = MixedModel(
        PatchTower(PATCH, 32, tower_depth, 2), VisionProjector(32, 64, MERGE), dec, MARKERS, position_mode
    )
    if inject:  # skip weights large enough that the content path changes the outputs
        mmpreproj.mixed.inject_decoder(model, mmpreproj.PreProjConfig(skip_init_std=0.05, freeze_base=False))
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
