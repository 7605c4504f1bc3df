"""RoPE3D against diffusers' get_3d_rotary_pos_embed + apply_rotary_emb (CogVideoX), on a (3, 4, 5) grid."""

import pytest
import torch
from diffusers.models.embeddings import apply_rotary_emb, get_1d_rotary_pos_embed, get_3d_rotary_pos_embed

from mmpreproj.rope import RoPE3D, grid_positions

T, H, W = 3, 4, 5


def _qk(n: int, d: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(2, 2, n, d, generator=g), torch.randn(2, 2, n, d, generator=g)


@pytest.mark.parametrize("grid_type", ["linspace", "slice"])
@pytest.mark.parametrize("head_dim", [64, 48])
def test_matches_diffusers(grid_type, head_dim):
    # crops_coords ((0, 0), (H, W)) with grid_size (H, W) makes the linspace grid the integers 0..H-1 / 0..W-1
    # (as CogVideoX calls it); "slice" takes arange(max_size) cut to the grid. Tokens are t-major, row-major.
    freqs = get_3d_rotary_pos_embed(
        head_dim,
        ((0, 0), (H, W)),
        (H, W),
        T,
        theta=10000,
        use_real=True,
        grid_type=grid_type,
        max_size=(H, W),
    )  # (cos, sin), each (T*H*W, head_dim)
    q, k = _qk(T * H * W, head_dim)
    q2, k2 = RoPE3D(head_dim)(q, k, grid_positions(T, H, W))
    torch.testing.assert_close(q2, apply_rotary_emb(q, freqs), atol=1e-6, rtol=0)
    torch.testing.assert_close(k2, apply_rotary_emb(k, freqs), atol=1e-6, rtol=0)


def test_text_prefix_unrotated_like_cogvideox():
    text = 4  # CogVideoX rotates hidden_states[:, :, text_seq_length:] only
    freqs = get_3d_rotary_pos_embed(32, ((0, 0), (H, W)), (H, W), T, use_real=True)
    q, k = _qk(text + T * H * W, 32, seed=1)
    q2, k2 = RoPE3D(32)(q, k, grid_positions(T, H, W), num_prefix_tokens=text)
    assert torch.equal(q2[:, :, :text], q[:, :, :text]) and torch.equal(k2[:, :, :text], k[:, :, :text])
    torch.testing.assert_close(q2[:, :, text:], apply_rotary_emb(q[:, :, text:], freqs), atol=1e-6, rtol=0)


def test_custom_sections_match_per_axis_diffusers_spectra():
    sections = (8, 12, 4)  # channels for t, h, w
    pos = grid_positions(T, H, W)
    per_axis = [get_1d_rotary_pos_embed(c, pos[:, a].float(), use_real=True) for a, c in enumerate(sections)]
    cos = torch.cat([cs[0] for cs in per_axis], dim=-1)  # (N, 24): [t | h | w], each interleaved
    sin = torch.cat([cs[1] for cs in per_axis], dim=-1)
    q, k = _qk(T * H * W, 24, seed=2)
    q2, _ = RoPE3D(24, sections=sections)(q, k, pos)
    torch.testing.assert_close(q2, apply_rotary_emb(q, (cos, sin)), atol=1e-6, rtol=0)


def test_rejects_bad_sections():
    with pytest.raises(ValueError, match="divisible by 16"):
        RoPE3D(40)  # 40/4 = 10, 40//8*3 = 15: odd
    with pytest.raises(ValueError, match="sum to head_dim=32"):
        RoPE3D(32, sections=(8, 8, 8))
    with pytest.raises(ValueError, match="positive even"):
        RoPE3D(32, sections=(8, 11, 13))
    with pytest.raises(ValueError, match="positive even"):
        RoPE3D(32, sections=(16, 16))
