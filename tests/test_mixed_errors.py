"""Bad mixed input fails before any compute, with a message that names what is wrong."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from recipes.mixed.tinyvlm import MarkerIds, MixedSample, Visual, build_sequence, collate
from tests.helpers.mixed_models import IMAGE_ID, MARKERS, VIDEO_ID, VSTART, tiny_mixed

EMBED = nn.Embedding(40, 8)


def _vis(t=1, h=2, w=3, width=8):
    return Visual(torch.randn(t * h * w, width), (t, h, w))


@pytest.mark.parametrize(
    "ids, images, videos, match",
    [
        (
            [1, IMAGE_ID, 2, IMAGE_ID],
            [_vis()],
            [],
            r"2 image marker\(s\) \(id 30\) but only 1 image\(s\): marker 2 has no image",
        ),
        (
            [1, IMAGE_ID],
            [_vis(), _vis()],
            [],
            r"2 image\(s\) but only 1 image marker\(s\).*image 2 has no marker",
        ),
        ([1, 2], [_vis()], [], r"1 image\(s\) but only 0 image marker"),
        ([1, VIDEO_ID], [], [], r"1 video marker\(s\) \(id 31\) but only 0 video"),
        (
            [1, IMAGE_ID],
            [Visual(torch.randn(5, 8), (1, 2, 3))],
            [],
            r"image 0: grid \(1, 2, 3\) means 6 tokens, but features have shape \(5, 8\)",
        ),
        ([1, IMAGE_ID], [_vis(t=2)], [], r"image 0: grid must have t = 1"),
        ([1, IMAGE_ID], [_vis(width=4)], [], r"image 0: features have width 4, the decoder has 8"),
        ([VSTART, IMAGE_ID], [_vis()], [], r"contain the vision_start marker"),
        ([], [], [], "input_ids is empty"),
    ],
)
def test_build_sequence_errors(ids, images, videos, match):
    with pytest.raises(ValueError, match=match):
        build_sequence(ids, EMBED, MARKERS, images, videos)


def test_build_sequence_rejects_markers_in_target_and_bad_mode():
    with pytest.raises(ValueError, match="target_ids must be text"):
        build_sequence([1], EMBED, MARKERS, target_ids=[IMAGE_ID])
    with pytest.raises(ValueError, match="position_mode must be one of"):
        build_sequence([1], EMBED, MARKERS, position_mode="2d")


def test_model_names_the_sample_and_the_size():
    model = tiny_mixed(inject=False)
    calls = []
    model.tower.register_forward_hook(lambda *a: calls.append(1))
    good = MixedSample([1, IMAGE_ID], images=[torch.randn(3, 8, 8)])
    with pytest.raises(ValueError, match=r"sample 1: 1 image marker\(s\) \(id 30\) but only 0 image"):
        model.prepare([good, MixedSample([1, IMAGE_ID])])
    assert not calls  # checked before the tower ran
    with pytest.raises(ValueError, match=r"sample 0: 1 image\(s\) but only 0 image marker"):
        model.prepare([MixedSample([1, 2], images=[torch.randn(3, 8, 8)])])
    with pytest.raises(ValueError, match=r"sample 0 image 0 of size 8x12: height and width must be multiples of 8"):
        model.prepare([MixedSample([1, IMAGE_ID], images=[torch.randn(3, 8, 12)])])
    with pytest.raises(ValueError, match=r"sample 0 video 0: expected a \(T, 3, H, W\) tensor, got \(3, 8, 8\)"):
        model.prepare([MixedSample([1, VIDEO_ID], videos=[torch.randn(3, 8, 8)])])


def test_marker_ids_and_collate_are_checked():
    with pytest.raises(ValueError, match="must be distinct"):
        MarkerIds(image=1, video=1, vision_start=2, vision_end=3)
    with pytest.raises(ValueError, match="non-negative int"):
        MarkerIds(image=-1, video=1, vision_start=2, vision_end=3)
    with pytest.raises(ValueError, match="at least one"):
        collate([])
