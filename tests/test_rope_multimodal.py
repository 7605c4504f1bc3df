"""MultimodalRoPE and multimodal_positions against transformers' Qwen2-VL (installed 5.x semantics)."""

import pytest
import torch
import transformers
from transformers import Qwen2VLConfig
from transformers.models.gpt_neox import modeling_gpt_neox as neox
from transformers.models.qwen2_vl import modeling_qwen2_vl as qwen
from transformers.models.qwen2_vl.configuration_qwen2_vl import Qwen2VLTextConfig

from mmpreproj.rope import MultimodalRoPE, RoPE1D, multimodal_positions

IMAGE, VIDEO, VSTART, VEND = 30, 31, 28, 29  # token ids of the tiny config
MERGE = 2  # spatial_merge_size: a 4x6-patch image enters the sequence as 2x3 tokens


def _qwen_rotary(head_dim: int, sections: list[int], theta: float = 1e4) -> qwen.Qwen2VLRotaryEmbedding:
    # transformers 5.x reads mrope_section from rope_parameters (4.x: rope_scaling={"type": "mrope", ...}).
    cfg = Qwen2VLTextConfig(
        hidden_size=2 * head_dim, num_attention_heads=2, num_key_value_heads=2, num_hidden_layers=1,
        intermediate_size=16, vocab_size=32, bos_token_id=None, eos_token_id=None,
        rope_parameters={"rope_type": "default", "rope_theta": theta, "mrope_section": sections},
    )  # fmt: skip
    return qwen.Qwen2VLRotaryEmbedding(cfg)


def _qk(b: int, n: int, d: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(b, 2, n, d, generator=g), torch.randn(b, 2, n, d, generator=g)


def test_matches_qwen2vl_random_positions():
    g = torch.Generator().manual_seed(5)
    pos = torch.randint(0, 300, (2, 10, 3), generator=g)  # (B, N, 3) = (t, h, w)
    q, k = _qk(2, 10, 32)
    cos, sin = _qwen_rotary(32, [4, 6, 6])(q, pos.permute(2, 0, 1))  # Qwen takes (3, B, N)
    q_ref, k_ref = qwen.apply_rotary_pos_emb(q, k, cos, sin)
    rope = MultimodalRoPE(32, sections=(4, 6, 6))
    q2, k2 = rope(q, k, pos)
    torch.testing.assert_close(q2, q_ref, atol=1e-6, rtol=0)
    torch.testing.assert_close(k2, k_ref, atol=1e-6, rtol=0)
    cos2, sin2 = rope.cos_sin(pos)
    assert torch.equal(cos2, cos) and torch.equal(sin2, sin)


def test_partial_rotary_sections_cover_rotary_channels_only():
    g = torch.Generator().manual_seed(6)
    pos = torch.randint(0, 50, (2, 7, 3), generator=g)
    q, k = _qk(2, 7, 64, seed=1)
    # Qwen's M-RoPE tables for the 32 rotary channels, applied the GPT-NeoX way (first 32 rotate, rest pass).
    cos, sin = _qwen_rotary(32, [4, 6, 6])(q, pos.permute(2, 0, 1))
    q_ref, k_ref = neox.apply_rotary_pos_emb(q, k, cos, sin)
    q2, k2 = MultimodalRoPE(64, sections=(4, 6, 6), rotary_fraction=0.5)(q, k, pos)
    torch.testing.assert_close(q2, q_ref, atol=1e-6, rtol=0)
    torch.testing.assert_close(k2, k_ref, atol=1e-6, rtol=0)
    assert torch.equal(q2[..., 32:], q[..., 32:]) and torch.equal(k2[..., 32:], k[..., 32:])


@pytest.mark.parametrize("rotary_fraction", [1.0, 0.25])
def test_text_positions_equal_rope1d(rotary_fraction):
    q, k = _qk(2, 9, 64, seed=2)
    text = torch.arange(9)[None] + torch.tensor([[0], [12]])  # (B, N)
    r = int(64 * rotary_fraction) // 2
    sections = (r - 2 * (r // 3), r // 3, r // 3)
    q2, k2 = MultimodalRoPE(64, sections, rotary_fraction=rotary_fraction)(q, k, text[..., None].expand(-1, -1, 3))
    q1, k1 = RoPE1D(64, rotary_fraction=rotary_fraction)(q, k, text)
    assert torch.equal(q2, q1) and torch.equal(k2, k1)


def test_rejects_wrong_section_sum():
    with pytest.raises(ValueError, match="sum to rotary_dim / 2 = 16"):
        MultimodalRoPE(32, sections=(4, 6, 4))
    with pytest.raises(ValueError, match="sum to rotary_dim / 2 = 8"):
        MultimodalRoPE(64, sections=(4, 6, 6), rotary_fraction=0.25)


@pytest.mark.parametrize("encoder", [MultimodalRoPE(16, sections=(2, 3, 3)), RoPE1D(16)], ids=["mrope", "rope1d"])
def test_integer_queries_are_refused_not_truncated(encoder):
    """Integer q/k would be rotated in float32 and cast back, the rotation truncated (found by bench/mixed_audit.py):
    refused naming both dtypes."""
    q = torch.arange(1, 97).reshape(1, 2, 3, 16)  # int64
    pos = torch.tensor([[0, 0, 0], [3, 1, 2], [3, 1, 3]]) if isinstance(encoder, MultimodalRoPE) else torch.arange(3)
    with pytest.raises(ValueError, match=r"q and k must be floating point, got torch.int64 and torch.float32"):
        encoder(q, q.float(), pos)
    encoder(q.float(), q.float(), pos)  # the same call in float runs


# ---- multimodal_positions vs Qwen2VLModel.get_rope_index --------------------------------------------------


@pytest.fixture(scope="module")
def qwen_model() -> qwen.Qwen2VLModel:
    cfg = Qwen2VLConfig(
        text_config=dict(
            hidden_size=32, num_attention_heads=2, num_key_value_heads=2, num_hidden_layers=1,
            intermediate_size=16, vocab_size=32, bos_token_id=None, eos_token_id=None,
            rope_parameters={"rope_type": "default", "rope_theta": 1e4, "mrope_section": [2, 3, 3]},
        ),
        vision_config=dict(
            depth=1, embed_dim=16, hidden_size=32, num_heads=2, mlp_ratio=1, patch_size=2,
            temporal_patch_size=1, spatial_merge_size=MERGE,
        ),
        image_token_id=IMAGE, video_token_id=VIDEO, vision_start_token_id=VSTART, vision_end_token_id=VEND,
    )  # fmt: skip
    return qwen.Qwen2VLModel(cfg).eval()


def _qwen_sequence(parts: list) -> tuple[torch.Tensor, torch.Tensor, list, list]:
    """input_ids, mm_token_type_ids, image and video grid_thw (in patches, before merging) of one sequence."""
    ids, types, images, videos = [], [], [], []
    for part in parts:
        if isinstance(part, int):  # a text token
            ids.append(part)
            types.append(0)
            continue
        kind, thw = part
        n = thw[0] * thw[1] * thw[2] // MERGE**2
        ids += [IMAGE if kind == "image" else VIDEO] * n
        types += [1 if kind == "image" else 2] * n
        (images if kind == "image" else videos).append(list(thw))
    return torch.tensor([ids]), torch.tensor([types]), images, videos


def _get_rope_index(model, parts):
    ids, types, images, videos = _qwen_sequence(parts)
    pos, delta = model.get_rope_index(
        ids,
        mm_token_type_ids=types,
        image_grid_thw=torch.tensor(images) if images else None,
        video_grid_thw=torch.tensor(videos) if videos else None,
    )
    return pos[:, 0].T, int(delta[0, 0])  # (N, 3), scalar


def test_image_sequence_matches_get_rope_index(qwen_model):
    # 3 text, vision-start, a 4x6-patch image merged 2x2, vision-end, 2 text (start/end are text tokens)
    parts = [1, 2, 3, VSTART, ("image", (1, 4, 6)), VEND, 4, 5]
    ref_pos, ref_delta = _get_rope_index(qwen_model, parts)
    pos, delta = multimodal_positions([("text", 4), ("image", (2, 3)), ("text", 3)])
    assert pos.dtype == torch.long and pos.shape == (13, 3)
    assert torch.equal(pos, ref_pos)
    assert delta == ref_delta == int(pos.max()) + 1 - 13


@pytest.mark.skipif(int(transformers.__version__.split(".")[0]) < 5, reason="video advance differs in 4.x")
def test_two_images_and_video_match_get_rope_index(qwen_model):
    # The video has 5 frames of 2x2 tokens: transformers 5.x continues after it at start + max(h, w) = start + 2,
    # not start + 5, so this sequence tells the 4.x and 5.x semantics apart.
    parts = [1, VSTART, ("image", (1, 4, 6)), VEND, 2, VSTART, ("image", (1, 2, 2)), VEND, VSTART,
             ("video", (5, 4, 4)), VEND, 3, 4]  # fmt: skip
    ref_pos, ref_delta = _get_rope_index(qwen_model, parts)
    segments = [("text", 2), ("image", (2, 3)), ("text", 3), ("image", (1, 1)), ("text", 2),
                ("video", (5, 2, 2)), ("text", 3)]  # fmt: skip
    pos, delta = multimodal_positions(segments)
    assert torch.equal(pos, ref_pos)
    assert delta == ref_delta


def test_delta_gives_decoding_positions():
    pos, delta = multimodal_positions([("text", 2), ("image", (3, 4)), ("text", 1)])
    n = pos.shape[0]  # 15 tokens; the image spans positions 2..5, the last text token is at 6
    assert pos[-1].tolist() == [6, 6, 6]
    assert n + 0 + delta == 7  # first generated token continues right after


@pytest.mark.parametrize(
    "segments, match",
    [
        ([], "non-empty"),
        ([("audio", 3)], r"kind must be one of \('text', 'image', 'video'\)"),
        ([("text", 0)], r"segments\[0\].*n_tokens must be a positive int"),
        ([("text", 2), ("image", (0, 3))], r"segments\[1\] \('image', \(h, w\)\)"),
        ([("video", (2, 3))], r"segments\[0\] \('video', \(t, h, w\)\)"),
        ([("text",)], r"\(kind, size\) pair"),
    ],
)
def test_rejects_bad_segments(segments, match):
    with pytest.raises(ValueError, match=match):
        multimodal_positions(segments)
