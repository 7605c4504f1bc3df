"""MixedModel parts: the shared pre-projection sits in the decoder only, gradients reach every part, towers."""

from __future__ import annotations

import pytest
import timm
import torch
from mixed_fixtures import IMAGE_ID, MARKERS, mixed_samples, tiny_mixed

import mmpreproj
from mmpreproj.analysis import routing_ratios
from mmpreproj.mixed import (
    IMAGE,
    TEXT,
    MixedModel,
    MixedSample,
    NativeDecoder,
    OpenClipTower,
    TimmTower,
    VisionProjector,
)  # fmt: skip


def test_one_preprojection_per_decoder_block_shared_by_all_modalities():
    model = tiny_mixed("native", tower_depth=2)  # the tower is a Block stack too: it must stay unwrapped
    wrappers = mmpreproj.injected_modules(model)
    assert len(wrappers) == len(model.decoder.blocks) == 2
    assert all(w is b.attn for w, b in zip(wrappers, model.decoder.blocks))
    assert not mmpreproj.injected_modules(model.tower)
    assert (
        sum(1 for n, _ in model.named_parameters() if ".preproj." in n or ".skip." in n) == 2 * 3
    )  # up, down, skip


@pytest.mark.parametrize("decoder", ["native", "neox"])
def test_every_parameter_gets_a_gradient(decoder):
    model = tiny_mixed(decoder).train()
    samples = [MixedSample(s.input_ids, s.images, s.videos, target_ids=[3, 4]) for s in mixed_samples()]
    batch = model.prepare(samples)
    logits, _ = model(**batch.decoder_inputs())
    loss = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), batch.labels[:, 1:].flatten())
    loss.backward()
    for name, p in model.named_parameters():
        if p.requires_grad:
            assert p.grad is not None and torch.isfinite(p.grad).all(), f"No gradient for {name}"


def test_routing_ratios_by_modality():
    model = tiny_mixed("native")
    with torch.no_grad():
        batch = model.prepare(mixed_samples())
    by_mod = {}
    for name, code in (("text", TEXT), ("image", IMAGE)):
        feed = [{**batch.decoder_inputs(), "mask": (batch.modality == code) & batch.attention_mask.bool()}]
        by_mod[name] = routing_ratios(model, feed, token_mask_key="mask")
    assert set(by_mod["text"]) == set(by_mod["image"]) == {0, 1}
    assert all(v > 0 for m in by_mod.values() for v in m.values())
    assert by_mod["text"] != by_mod["image"]


def test_projector_merges_2x2_neighbours():
    proj = VisionProjector(1, 4, merge=2)
    with torch.no_grad():
        proj.norm.weight.fill_(1), proj.norm.bias.zero_()
    grid = torch.arange(24.0).reshape(1, 4, 6, 1)  # (B, h, w, C)
    seen = []
    proj.mlp[0].register_forward_pre_hook(lambda m, a: seen.append(a[0]))
    assert proj(grid).shape == (1, 2, 3, 4)
    assert seen[0].shape == (1, 2, 3, 4)  # (B, h/2, w/2, 4C): one group is rows 2i..2i+1, columns 2j..2j+1
    with pytest.raises(ValueError, match="4x5 patch grid cannot be merged 2x2"):
        proj(torch.zeros(1, 4, 5, 1))


def test_timm_tower_any_resolution():
    vit = timm.models.vision_transformer.VisionTransformer(
        img_size=16, patch_size=4, embed_dim=32, depth=1, num_heads=2, num_classes=0, dynamic_img_size=True
    )
    torch.manual_seed(0)
    model = MixedModel(
        TimmTower(vit), VisionProjector(32, 32, 2), NativeDecoder(40, 32, 1, 2), MARKERS
    ).eval()
    with torch.no_grad():
        batch = model.prepare([MixedSample([1, IMAGE_ID], images=[torch.randn(3, 16, 24)]),
                               MixedSample([IMAGE_ID], images=[torch.randn(3, 32, 8)])])  # fmt: skip
    assert ((batch.modality == IMAGE).sum(1)).tolist() == [2 * 3, 4 * 1]
    with pytest.raises(ValueError, match="dynamic_img_size=True"):
        TimmTower(timm.models.vision_transformer.VisionTransformer(img_size=16, patch_size=4, embed_dim=32, depth=1,
                                                                     num_heads=2))  # fmt: skip


def test_open_clip_tower_at_its_resolution():
    from open_clip.transformer import VisionTransformer

    torch.manual_seed(0)
    visual = VisionTransformer(
        image_size=16, patch_size=4, width=32, layers=1, heads=2, mlp_ratio=2.0, output_dim=8
    )
    model = MixedModel(
        OpenClipTower(visual), VisionProjector(32, 32, 2), NativeDecoder(40, 32, 1, 2), MARKERS
    ).eval()
    with torch.no_grad():
        batch = model.prepare([MixedSample([1, IMAGE_ID, IMAGE_ID], images=[torch.randn(3, 16, 16)] * 2)])
        feats = OpenClipTower(visual)(torch.randn(2, 3, 16, 16))
    assert feats.shape == (2, 4, 4, 32) and (batch.modality == IMAGE).sum() == 2 * 4
    with pytest.raises(ValueError, match="must be 16x16"):
        model.prepare([MixedSample([IMAGE_ID], images=[torch.randn(3, 16, 24)])])
