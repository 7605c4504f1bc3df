"""RoPE1D against transformers' GPT-NeoX (partial rotary), Llama (full rotary) and GPT-J (interleaved)."""

import pytest
import torch
from transformers import GPTNeoXConfig, LlamaConfig
from transformers.models.gpt_neox import modeling_gpt_neox as neox
from transformers.models.gptj import modeling_gptj as gptj
from transformers.models.llama import modeling_llama as llama

from mmpreproj.rope import RoPE1D


def _qk(b: int, h: int, n: int, d: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(b, h, n, d, generator=g), torch.randn(b, h, n, d, generator=g)


def _neox_config(head_dim: int, rotary_pct: float) -> GPTNeoXConfig:
    return GPTNeoXConfig(
        hidden_size=2 * head_dim, num_attention_heads=2, num_hidden_layers=1, intermediate_size=16,
        vocab_size=16, rotary_pct=rotary_pct, rotary_emb_base=10000, max_position_embeddings=64,
        bos_token_id=None, eos_token_id=None,
    )  # fmt: skip


def test_gpt_neox_partial_rotary_with_batch_offsets():
    cfg = _neox_config(head_dim=64, rotary_pct=0.25)
    assert cfg.rope_parameters["partial_rotary_factor"] == 0.25
    q, k = _qk(2, 3, 9, 64)
    position_ids = torch.arange(9)[None] + torch.tensor([[0], [37]])  # (B, N): per-batch KV-cache offsets
    cos, sin = neox.GPTNeoXRotaryEmbedding(cfg)(q, position_ids)
    q_ref, k_ref = neox.apply_rotary_pos_emb(q, k, cos, sin)

    rope = RoPE1D(64, rotary_fraction=0.25)
    assert rope.rotary_dim == 16
    q2, k2 = rope(q, k, position_ids)
    torch.testing.assert_close(q2, q_ref, atol=1e-6, rtol=0)
    torch.testing.assert_close(k2, k_ref, atol=1e-6, rtol=0)
    assert torch.equal(q2[..., 16:], q[..., 16:]) and torch.equal(k2[..., 16:], k[..., 16:])
    assert not torch.allclose(q2[..., :16], q[..., :16])


def test_cos_sin_is_gpt_neox_position_embeddings():
    cfg = _neox_config(head_dim=32, rotary_pct=0.5)
    x = torch.zeros(1)
    position_ids = torch.arange(11)[None] + torch.tensor([[0], [5]])
    cos_ref, sin_ref = neox.GPTNeoXRotaryEmbedding(cfg)(x, position_ids)  # (B, N, r)
    cos, sin = RoPE1D(32, rotary_fraction=0.5).cos_sin(position_ids)
    assert cos.dtype == sin.dtype == torch.float32 and cos.shape == cos_ref.shape == (2, 11, 16)
    assert torch.equal(cos, cos_ref) and torch.equal(sin, sin_ref)


@pytest.mark.parametrize("theta", [1e4, 5e5])
def test_llama_full_rotary(theta):
    cfg = LlamaConfig(
        hidden_size=64, num_attention_heads=2, num_hidden_layers=1, intermediate_size=16, vocab_size=16,
        rope_parameters={"rope_type": "default", "rope_theta": theta}, bos_token_id=None, eos_token_id=None,
    )  # fmt: skip
    q, k = _qk(2, 2, 13, 32, seed=1)
    position_ids = torch.arange(13)[None].expand(2, -1) + 100
    cos, sin = llama.LlamaRotaryEmbedding(cfg)(q, position_ids)
    q_ref, k_ref = llama.apply_rotary_pos_emb(q, k, cos, sin)
    q2, k2 = RoPE1D(32, theta=theta)(q, k, torch.arange(13) + 100)  # unbatched (N,) positions
    torch.testing.assert_close(q2, q_ref, atol=1e-6, rtol=0)
    torch.testing.assert_close(k2, k_ref, atol=1e-6, rtol=0)


def test_gptj_interleaved_partial_rotary():
    q, k = _qk(2, 2, 7, 32, seed=2)
    position_ids = torch.arange(7)[None] + torch.tensor([[3], [0]])
    sincos = gptj.create_sinusoidal_positions(32, 16)[position_ids]  # (B, N, r), as GPTJRotaryEmbedding
    sin, cos = sincos.chunk(2, dim=-1)

    def ref(x):  # GPT-J works on (B, N, H, D) and rotates x[..., :rotary_dim] pairwise
        x = x.transpose(1, 2)
        rot = gptj.apply_rotary_pos_emb(x[..., :16], sin, cos)
        return torch.cat((rot, x[..., 16:]), dim=-1).transpose(1, 2)

    q2, k2 = RoPE1D(32, rotary_fraction=0.5, pairing="interleaved")(q, k, position_ids)
    torch.testing.assert_close(q2, ref(q), atol=1e-6, rtol=0)
    torch.testing.assert_close(k2, ref(k), atol=1e-6, rtol=0)
    assert torch.equal(q2[..., 16:], q[..., 16:])


def test_prefix_tokens_untouched_and_rest_rotated_from_zero():
    q, k = _qk(2, 2, 10, 16, seed=3)
    rope = RoPE1D(16)
    q2, k2 = rope(q, k, torch.arange(7), num_prefix_tokens=3)
    assert torch.equal(q2[:, :, :3], q[:, :, :3]) and torch.equal(k2[:, :, :3], k[:, :, :3])
    q_ref, k_ref = RoPE1D(16)(q[:, :, 3:], k[:, :, 3:], torch.arange(7))
    assert torch.equal(q2[:, :, 3:], q_ref) and torch.equal(k2[:, :, 3:], k_ref)


def test_position_layouts_agree():
    q, k = _qk(2, 1, 5, 8, seed=4)
    rope = RoPE1D(8)
    p = torch.arange(5) + 2
    ref = rope(q, k, p)[0]
    for pos in (p[None], p[None].expand(2, -1), p[:, None], p[None, :, None]):
        assert torch.equal(rope(q, k, pos)[0], ref)


def test_rejects_bad_config_and_inputs():
    with pytest.raises(ValueError, match="rotary_dim"):
        RoPE1D(30, rotary_fraction=0.5)  # int(30 * 0.5) = 15 is odd
    with pytest.raises(ValueError, match="pairing must be one of \\('half', 'interleaved'\\)"):
        RoPE1D(16, pairing="gptj")
    with pytest.raises(ValueError, match="rotary_fraction"):
        RoPE1D(16, rotary_fraction=0.0)
    rope = RoPE1D(16)
    q, k = _qk(1, 1, 4, 16)
    with pytest.raises(ValueError, match="bfloat16"):
        rope(q, k, torch.arange(4).bfloat16())
    with pytest.raises(ValueError, match="num_prefix_tokens"):
        rope(q, k, torch.arange(4), num_prefix_tokens=1)  # pos must then describe 3 tokens
    with pytest.raises(ValueError, match="head_dim=16"):
        rope(q[..., :8], k[..., :8], torch.arange(4))
