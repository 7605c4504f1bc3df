"""The mixed model's own sequence builder against transformers' Qwen2-VL `get_rope_index` (5.x semantics)."""

from __future__ import annotations

import pytest
import torch
import transformers
from torch import nn
from transformers import Qwen2VLConfig
from transformers.models.qwen2_vl import modeling_qwen2_vl as qwen

from recipes.mixed.tinyvlm import IMAGE, PAD, TEXT, VIDEO, Visual, build_sequence
from tests.helpers.mixed_models import (
    IMAGE_ID,
    MARKERS,
    MERGE,
    PATCH,
    VEND,
    VIDEO_ID,
    VSTART,
    mixed_samples,
    tiny_mixed,
)

pytestmark = pytest.mark.skipif(
    int(transformers.__version__.split(".")[0]) < 5,
    reason="transformers 4.x advances video positions differently",
)


@pytest.fixture(scope="module")
def qwen_model() -> qwen.Qwen2VLModel:
    cfg = Qwen2VLConfig(
        text_config=dict(
            hidden_size=32, num_attention_heads=2, num_key_value_heads=2, num_hidden_layers=1,
            intermediate_size=16, vocab_size=40, bos_token_id=None, eos_token_id=None,
            rope_parameters={"rope_type": "default", "rope_theta": 1e4, "mrope_section": [2, 3, 3]},
        ),
        vision_config=dict(depth=1, embed_dim=16, hidden_size=32, num_heads=2, mlp_ratio=1, patch_size=PATCH,
                           temporal_patch_size=1, spatial_merge_size=MERGE),
        image_token_id=IMAGE_ID, video_token_id=VIDEO_ID, vision_start_token_id=VSTART, vision_end_token_id=VEND,
    )  # fmt: skip
    return qwen.Qwen2VLModel(cfg).eval()


def _qwen_positions(model, token_ids, modality, image_grids, video_grids):
    """get_rope_index on the builder's own token ids; grids in tokens -> Qwen's grid_thw in patches."""
    types = torch.zeros_like(token_ids)
    types[modality == IMAGE], types[modality == VIDEO] = 1, 2
    to_patches = [[t, h * MERGE, w * MERGE] for t, h, w in image_grids + video_grids]
    n_img = len(image_grids)
    pos, delta = model.get_rope_index(
        token_ids[None],
        mm_token_type_ids=types[None],
        image_grid_thw=torch.tensor(to_patches[:n_img]) if n_img else None,
        video_grid_thw=torch.tensor(to_patches[n_img:]) if video_grids else None,
    )
    return pos[:, 0].T, int(delta[0, 0])  # (N, 3), scalar


def test_builder_two_images_and_video_match_get_rope_index(qwen_model):
    embed = nn.Embedding(40, 8)
    # a video with more frames (5) than max(h, w) = 2: 5.x continues after it at start + 2, not + 5
    grids = {"a": (1, 2, 3), "b": (1, 1, 1), "v": (5, 2, 2)}
    vis = {k: Visual(torch.randn(t * h * w, 8), (t, h, w)) for k, (t, h, w) in grids.items()}
    ids = [1, IMAGE_ID, 2, 3, IMAGE_ID, VIDEO_ID, 4, 5]
    seq = build_sequence(ids, embed, MARKERS, [vis["a"], vis["b"]], [vis["v"]], target_ids=[6, 7])
    # the builder wrote begin/end markers around every visual, and visual slots hold the marker id
    assert seq.token_ids[:3].tolist() == [1, VSTART, IMAGE_ID] and seq.token_ids[8].item() == VEND
    assert (seq.modality == IMAGE).sum() == 7 and (seq.modality == VIDEO).sum() == 20
    ref_pos, ref_delta = _qwen_positions(
        qwen_model, seq.token_ids, seq.modality, [grids["a"], grids["b"]], [grids["v"]]
    )
    assert torch.equal(seq.positions, ref_pos)
    assert seq.delta == ref_delta
    # the visual features sit at their slots, the text is embedded
    assert torch.equal(seq.embeds[seq.modality == VIDEO], vis["v"].features)
    assert torch.equal(seq.embeds[0], embed.weight[1])
    assert seq.labels[-2:].tolist() == [6, 7] and (seq.labels[:-2] == -100).all()


def test_model_batch_positions_match_get_rope_index(qwen_model):
    """End to end: pixels -> tower grids -> left-padded batch; each row's real tokens match Qwen."""
    model = tiny_mixed()
    samples = mixed_samples()
    with torch.no_grad():
        batch = model.prepare(samples)
    for b, s in enumerate(samples):
        keep = batch.attention_mask[b].bool()
        images = [(1, im.shape[1] // (PATCH * MERGE), im.shape[2] // (PATCH * MERGE)) for im in s.images]
        videos = [(v.shape[0], v.shape[2] // (PATCH * MERGE), v.shape[3] // (PATCH * MERGE)) for v in s.videos]
        ref_pos, ref_delta = _qwen_positions(qwen_model, batch.token_ids[b, keep], batch.modality[b, keep],
                                             images, videos)  # fmt: skip
        assert torch.equal(batch.position_ids[b, keep], ref_pos)
        assert batch.next_position[b].item() == keep.sum().item() + ref_delta
        assert (batch.modality[b, ~keep] == PAD).all() and (batch.attention_mask[b, : (~keep).sum()] == 0).all()


def test_1d_mode_counts_every_token():
    model = tiny_mixed(position_mode="1d")
    with torch.no_grad():
        batch = model.prepare(mixed_samples()[:2])
    for b in range(2):
        keep = batch.attention_mask[b].bool()
        n = int(keep.sum())
        assert torch.equal(batch.position_ids[b, keep], torch.arange(n)[:, None].expand(-1, 3))
        assert batch.next_position[b].item() == n
    assert (batch.modality == TEXT).any() and (batch.modality == IMAGE).any()
