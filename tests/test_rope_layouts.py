"""M-RoPE frequency layouts: Qwen2-VL chunks (`MultimodalRoPE`) and Qwen3-VL interleaving, against transformers."""

from __future__ import annotations

import pytest
import torch
from transformers.models.qwen3_vl import modeling_qwen3_vl as qwen3
from transformers.models.qwen3_vl.configuration_qwen3_vl import Qwen3VLTextConfig

from mmpreproj.rope import InterleavedMultimodalRoPE, MultimodalRoPE, RoPE1D, default_sections, make_mrope


@pytest.mark.parametrize("head_dim, sections", [(128, (24, 20, 20)), (32, (6, 5, 5))])
def test_interleaved_matches_qwen3vl(head_dim, sections):
    cfg = Qwen3VLTextConfig(hidden_size=2 * head_dim, num_attention_heads=2, num_key_value_heads=2, head_dim=head_dim,
                            num_hidden_layers=1, intermediate_size=8, vocab_size=8,
                            rope_parameters={"rope_type": "default", "rope_theta": 5e5,
                                             "mrope_section": list(sections)})  # fmt: skip
    pos = torch.randint(0, 300, (2, 7, 3), generator=torch.Generator().manual_seed(0))  # (B, N, 3)
    x = torch.zeros(2, 7, head_dim)
    cos_ref, sin_ref = qwen3.Qwen3VLTextRotaryEmbedding(cfg)(x, pos.permute(2, 0, 1))  # (3, B, N) in
    rope = InterleavedMultimodalRoPE(head_dim, sections, theta=5e5)
    cos, sin = rope.cos_sin(pos)
    assert torch.equal(cos, cos_ref) and torch.equal(sin, sin_ref)


def test_layouts_reduce_to_1d_rope_on_text():
    q, k = torch.randn(2, 2, 9, 32), torch.randn(2, 2, 9, 32)
    text = torch.arange(9)[None].expand(2, -1)
    q1, k1 = RoPE1D(32)(q, k, text)
    for layout in ("chunked", "interleaved"):
        q2, k2 = make_mrope(32, layout)(q, k, text[..., None].expand(-1, -1, 3))
        assert torch.equal(q2, q1) and torch.equal(k2, k1)


def test_chunked_gives_columns_only_slow_pairs_interleaved_does_not():
    """Why the layout matters for small grids: the fastest pair that turns with w."""
    chunked, inter = make_mrope(32, "chunked"), make_mrope(32, "interleaved")
    assert isinstance(chunked, MultimodalRoPE) and chunked.sections == default_sections(32) == (4, 6, 6)
    assert inter.sections == default_sections(32, "interleaved") == (6, 5, 5)
    col = torch.tensor([[[0, 0, 0], [0, 0, 1]]])  # two tokens one column apart
    sin = {name: r.cos_sin(col)[1][0, 1].abs().max().item() for name, r in (("c", chunked), ("i", inter))}
    assert sin["c"] < 0.004 and sin["i"] > 0.3  # the fastest w pair: theta^(-20/32) vs theta^(-4/32) rad


def test_layout_validation():
    with pytest.raises(ValueError, match="layout must be one of"):
        make_mrope(32, "spiral")
    with pytest.raises(ValueError, match="summing to rotary_dim / 2 = 16"):
        InterleavedMultimodalRoPE(32, (4, 6, 4))
    with pytest.raises(ValueError, match="to interleave"):
        InterleavedMultimodalRoPE(32, (2, 7, 7))
    assert isinstance(make_mrope(32, "interleaved"), InterleavedMultimodalRoPE)
