"""mmpreproj's own Block: causal KV cache, padding masks, and injection as a host like any other."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import mmpreproj
from mmpreproj.modules import Block, KVCache
from mmpreproj.rope import RoPE1D, RoPE2D, grid_positions


def _stack(rope_factory, causal=True, depth=2, dim=32, heads=4, seed=0):
    torch.manual_seed(seed)
    return nn.ModuleList(Block(dim, heads, rope=rope_factory(), causal=causal) for _ in range(depth)).eval()


def _run(blocks, x, pos, caches=None, attn_mask=None):
    for i, blk in enumerate(blocks):
        x = blk(x, pos=pos, attn_mask=attn_mask, cache=None if caches is None else caches[i])
    return x


def test_incremental_decoding_equals_full_forward():
    blocks = _stack(lambda: RoPE1D(8))
    mmpreproj.inject(blocks, mmpreproj.PreProjConfig(skip_init_std=0.05))
    x = torch.randn(2, 7, 32)
    pos = torch.arange(7)
    full = _run(blocks, x, pos)
    caches = [KVCache() for _ in blocks]
    steps = [_run(blocks, x[:, :3], pos[:3], caches)]
    for t in range(3, 7):
        steps.append(_run(blocks, x[:, t : t + 1], pos[t : t + 1], caches))
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=0)
    assert all(len(c) == 7 and c.k.shape == (2, 4, 7, 8) for c in caches)


def test_key_padding_mask_ignores_padded_keys():
    blocks = _stack(lambda: RoPE1D(8), causal=False)
    x = torch.randn(1, 5, 32)
    keep = torch.tensor([[True, True, True, False, False]])
    noisy = x.clone()
    noisy[:, 3:] = torch.randn(1, 2, 32) * 10
    out_a = _run(blocks, x, torch.arange(5), attn_mask=keep)
    out_b = _run(blocks, noisy, torch.arange(5), attn_mask=keep)
    torch.testing.assert_close(out_a[:, :3], out_b[:, :3], atol=1e-6, rtol=0)


def test_same_block_class_any_modality_and_injection_identity():
    # the block is the same class for text (1D) and patches (2D); inject treats both alike
    grid = grid_positions(3, 5)  # (15, 2)
    for rope, pos in ((RoPE1D(8), torch.arange(15)), (RoPE2D(8), grid)):
        torch.manual_seed(0)
        blk = Block(32, 4, rope=rope).eval()
        x = torch.randn(2, 15, 32)
        ref = blk(x, pos=pos)
        mmpreproj.inject(blk, mmpreproj.PreProjConfig(init="identity", skip_init_std=0))
        torch.testing.assert_close(blk(x, pos=pos), ref, atol=1e-6, rtol=0)
        assert mmpreproj.trainable_report(blk).injected == 2 * 32 * 40 + 32 * 32


def test_fully_padded_query_rows_stay_finite():
    blocks = _stack(lambda: RoPE1D(8), causal=True)
    x = torch.randn(1, 4, 32)
    keep = torch.tensor([[False, False, True, True]])  # left padding: query 0 sees no real key
    out = _run(blocks, x, torch.arange(4), attn_mask=keep)
    assert torch.isfinite(out).all()
    ref = _run(blocks, x[:, 2:], torch.arange(2, 4))  # real rows equal the unpadded sequence's
    torch.testing.assert_close(out[:, 2:], ref, atol=1e-5, rtol=0)


@pytest.mark.parametrize("causal", [False, True])
def test_block_without_rope_equals_torch_multihead_attention(causal):
    """An independent reference: torch's nn.MultiheadAttention with the block's weights, pre-norm residuals."""
    torch.manual_seed(0)
    blk = Block(32, 4, mlp_ratio=2.0, causal=causal).eval()
    mha = nn.MultiheadAttention(32, 4, batch_first=True).eval()
    with torch.no_grad():  # qkv rows are (three, heads, head_dim): nn.MultiheadAttention's in_proj layout
        mha.in_proj_weight.copy_(blk.attn.qkv.weight)
        mha.in_proj_bias.copy_(blk.attn.qkv.bias)
        mha.out_proj.weight.copy_(blk.attn.proj.weight)
        mha.out_proj.bias.copy_(blk.attn.proj.bias)
    x = torch.randn(2, 6, 32)
    future = torch.ones(6, 6, dtype=torch.bool).triu(1) if causal else None  # True = not attended
    h = blk.norm1(x)
    ref = x + mha(h, h, h, attn_mask=future, need_weights=False)[0]
    ref = ref + blk.mlp.fc2(nn.functional.gelu(blk.mlp.fc1(blk.norm2(ref))))
    torch.testing.assert_close(blk(x), ref, atol=1e-5, rtol=0)


def test_a_rope_of_another_head_dim_is_refused_at_construction():
    """Found by bench/mixed_audit.py: it was refused only at the first forward."""
    said = r"rope has head_dim=16, but this attention's heads have dim // num_heads = 8"
    with pytest.raises(ValueError, match=said):
        Block(32, 4, rope=RoPE1D(16))
    Block(32, 4, rope=RoPE1D(8))  # the matching one builds
