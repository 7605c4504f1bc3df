"""RoPE2D against timm's axial RotaryEmbeddingCat + apply_rot_embed_cat, on non-square grids."""

import pytest
import torch
from timm.layers.pos_embed_sincos import RotaryEmbeddingCat, apply_rot_embed_cat

from mmpreproj.rope import RoPE2D, grid_positions


def _timm_embed(head_dim: int, h: int, w: int, theta: float, indexing: str) -> torch.Tensor:
    # timm's `dim` is the head dim: dim // 4 bands per axis, cat[sin, cos] of (N, 2 * dim), sin first.
    rot = RotaryEmbeddingCat(head_dim, temperature=theta, in_pixels=False, grid_indexing=indexing)
    return rot.get_embed((h, w))


def _qk(b: int, n: int, d: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(b, 3, n, d, generator=g), torch.randn(b, 3, n, d, generator=g)


def test_grid_positions_row_major():
    pos = grid_positions(2, 3)
    assert pos.dtype == torch.long and pos.shape == (6, 2)
    assert pos.tolist() == [[0, 0], [0, 1], [0, 2], [1, 0], [1, 1], [1, 2]]
    assert grid_positions(2, 1, 2).tolist() == [[0, 0, 0], [0, 0, 1], [1, 0, 0], [1, 0, 1]]
    with pytest.raises(ValueError, match="positive integer sizes"):
        grid_positions(3, 0)


@pytest.mark.parametrize("h, w", [(3, 5), (7, 4)])
@pytest.mark.parametrize("theta", [1e4, 100.0])
def test_matches_timm_ij(h, w, theta):
    q, k = _qk(2, h * w, 32)
    emb = _timm_embed(32, h, w, theta, "ij")
    q2, k2 = RoPE2D(32, theta=theta)(q, k, grid_positions(h, w))
    torch.testing.assert_close(q2, apply_rot_embed_cat(q, emb), atol=1e-6, rtol=0)
    torch.testing.assert_close(k2, apply_rot_embed_cat(k, emb), atol=1e-6, rtol=0)


@pytest.mark.parametrize("h, w", [(3, 5), (7, 4)])
def test_matches_timm_xy_with_swapped_columns(h, w):
    q, k = _qk(1, h * w, 16, seed=1)
    emb = _timm_embed(16, h, w, 100.0, "xy")  # naver rope-vit axial: x (column) first, theta 100
    rope = RoPE2D(16, theta=100.0)
    pos = grid_positions(h, w)
    q2, _ = rope(q, k, pos[:, [1, 0]])
    torch.testing.assert_close(q2, apply_rot_embed_cat(q, emb), atol=1e-6, rtol=0)
    assert not torch.allclose(rope(q, k, pos)[0], q2)  # the axis order matters


def test_prefix_tokens_unrotated_like_timm_attention_rope():
    h, w, prefix = 3, 5, 2  # class + one register token
    q, k = _qk(2, prefix + h * w, 32, seed=2)
    emb = _timm_embed(32, h, w, 1e4, "ij")
    q2, k2 = RoPE2D(32)(q, k, grid_positions(h, w), num_prefix_tokens=prefix)
    q_ref = torch.cat((q[:, :, :prefix], apply_rot_embed_cat(q[:, :, prefix:], emb)), dim=2)
    torch.testing.assert_close(q2, q_ref, atol=1e-6, rtol=0)
    assert torch.equal(q2[:, :, :prefix], q[:, :, :prefix]) and torch.equal(k2[:, :, :prefix], k[:, :, :prefix])


def test_half_pairing_matches_timm_rotate_half():
    h, w = 3, 5
    q, k = _qk(1, h * w, 16, seed=3)
    rot = RotaryEmbeddingCat(16, temperature=1e4, in_pixels=False, rotate_half=True)
    q2, _ = RoPE2D(16, pairing="half")(q, k, grid_positions(h, w))
    torch.testing.assert_close(q2, apply_rot_embed_cat(q, rot.get_embed((h, w)), half=True), atol=1e-6, rtol=0)


def test_rejects_bad_config_and_positions():
    with pytest.raises(ValueError, match="head_dim"):
        RoPE2D(18)
    with pytest.raises(ValueError, match="pairing must be one of"):
        RoPE2D(16, pairing="zigzag")
    q, k = _qk(1, 6, 16)
    with pytest.raises(ValueError, match=r"\(N, 2\) or \(B, N, 2\)"):
        RoPE2D(16)(q, k, torch.arange(6))
