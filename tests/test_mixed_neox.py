"""The GPT-NeoX host with its rotary module swapped for M-RoPE: text is bit-identical, images rotate by (t, h, w)."""

from __future__ import annotations

import pytest
import torch
from mixed_fixtures import tiny_neox_lm
from transformers.models.qwen2_vl import modeling_qwen2_vl as qwen
from transformers.models.qwen2_vl.configuration_qwen2_vl import Qwen2VLTextConfig

import mmpreproj
from mmpreproj.mixed import MultimodalRotaryEmbedding, NeoXDecoder, default_sections, swap_rotary


@pytest.mark.parametrize("injected", [False, True], ids=["host", "injected"])
def test_text_only_is_bit_identical_to_host(injected):
    lm = tiny_neox_lm()
    if injected:
        mmpreproj.inject(lm, mmpreproj.PreProjConfig(skip_init_std=0.05))
    ids = torch.randint(0, 40, (2, 11), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(2, 11, dtype=torch.long)
    mask[1, :4] = 0  # left padding
    pos = (mask.cumsum(-1) - 1).clamp(min=0)  # the host's own position ids for a left-padded row
    with torch.no_grad():
        ref = lm(ids).logits
        ref_padded = lm(ids, attention_mask=mask, position_ids=pos).logits
        decoder = NeoXDecoder(lm)
        assert isinstance(lm.gpt_neox.rotary_emb, MultimodalRotaryEmbedding)
        assert torch.equal(lm(ids).logits, ref)  # (B, S) default positions
        assert torch.equal(lm(ids, attention_mask=mask, position_ids=pos).logits, ref_padded)
        three = pos[..., None].expand(-1, -1, 3)  # (B, S, 3): text has t = h = w
        logits, _ = decoder(decoder.embed(ids), mask, three)
        assert torch.equal(logits, ref_padded)
        original = decoder.restore()
        assert not isinstance(original.gpt_neox.rotary_emb, MultimodalRotaryEmbedding)
        assert torch.equal(lm(ids).logits, ref)


def test_rotary_tables_match_qwen2vl_over_rotary_channels():
    lm = tiny_neox_lm()
    swap_rotary(lm)
    sections = list(default_sections(8))  # head 32 x rotary_pct 0.25 = 8 channels, 4 pairs
    assert sections == [2, 1, 1]
    cfg = Qwen2VLTextConfig(hidden_size=16, num_attention_heads=2, num_key_value_heads=2, num_hidden_layers=1,
                            intermediate_size=8, vocab_size=8, bos_token_id=None, eos_token_id=None,
                            rope_parameters={"rope_type": "default", "rope_theta": 1e4, "mrope_section": sections})  # fmt: skip
    pos = torch.randint(0, 200, (2, 9, 3), generator=torch.Generator().manual_seed(1))  # (B, S, 3)
    x = torch.zeros(2, 9, 64)
    cos, sin = lm.gpt_neox.rotary_emb(x, pos)
    cos_ref, sin_ref = qwen.Qwen2VLRotaryEmbedding(cfg)(x, pos.permute(2, 0, 1))  # Qwen takes (3, B, S)
    assert torch.equal(cos, cos_ref) and torch.equal(sin, sin_ref)


def test_image_positions_change_the_output():
    lm = tiny_neox_lm()
    decoder = NeoXDecoder(lm)
    ids = torch.randint(0, 40, (1, 6), generator=torch.Generator().manual_seed(2))
    text = torch.arange(6)[None, :, None].expand(-1, -1, 3)
    grid = text.clone()
    grid[0, 2:6, 1:] = torch.tensor([[2, 2], [2, 3], [3, 2], [3, 3]])  # a 2x2 image's rows and columns
    with torch.no_grad():
        a, _ = decoder(decoder.embed(ids), None, text)
        b, _ = decoder(decoder.embed(ids), None, grid)
        # no mask given: the decoder passes an all-ones one, so the jumps in the position ids are not read
        # as packed sequences (which would stop later tokens from seeing earlier ones)
        b_masked, _ = decoder(decoder.embed(ids), torch.ones(1, 6, dtype=torch.long), grid)
    assert torch.equal(b, b_masked)
    assert torch.equal(a[:, :3], b[:, :3]) and not torch.allclose(a[:, 3:], b[:, 3:])


def test_swap_rejects_bad_input():
    lm = tiny_neox_lm()
    with pytest.raises(ValueError, match="sum to rotary_dim / 2 = 4"):
        swap_rotary(lm, sections=(2, 2, 2))
    swap_rotary(lm)
    with pytest.raises(RuntimeError, match="already"):
        swap_rotary(lm)
    with pytest.raises(TypeError, match="GPT-NeoX"):
        swap_rotary(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match=r"\(B, S\) or \(B, S, 3\)"):
        lm.gpt_neox.rotary_emb(torch.zeros(1, 2, 64), torch.zeros(1, 2, 2, dtype=torch.long))
