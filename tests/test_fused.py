"""The one-matmul Q/K/V + skip fast path equals the plain path; torch.compile sees no graph breaks in our modules."""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import tiny_neox
from torch import nn

import mmpreproj
from mmpreproj import PreProjConfig
from mmpreproj.modules import Block, ContentSkip, KVCache, PreProjection
from mmpreproj.rope import RoPE1D


def _pair(neox):
    plain = mmpreproj.inject(neox, PreProjConfig(skip_init_std=0.05))
    fused = mmpreproj.set_fused(copy.deepcopy(plain), True)
    assert all(w.fused_forward is not None for w in mmpreproj.injected_modules(fused))
    return plain, fused


def test_neox_fused_equals_plain_forward_cache_and_grads(neox, tokens):
    plain, fused = _pair(neox)
    with torch.no_grad():
        torch.testing.assert_close(fused(tokens).logits, plain(tokens).logits, atol=1e-5, rtol=1e-5)
    plain.generation_config.eos_token_id = fused.generation_config.eos_token_id = None
    kw = dict(attention_mask=torch.ones_like(tokens), max_new_tokens=5, do_sample=False)
    assert torch.equal(plain.generate(tokens, **kw), fused.generate(tokens, **kw))
    for m in (plain, fused):
        m.train()
        m(tokens, labels=tokens).loss.backward()
    for wp, wf in zip(mmpreproj.injected_modules(plain), mmpreproj.injected_modules(fused)):
        for (n, pp), pf in zip(wp.named_parameters(), wf.parameters()):
            if pp.requires_grad:
                torch.testing.assert_close(pf.grad, pp.grad, atol=1e-6, rtol=1e-4, msg=n)


def test_cached_weight_follows_in_place_updates(tokens):
    plain, fused = _pair(tiny_neox())
    with torch.no_grad():
        fused(tokens)  # fills the inference cache
        for m in (plain, fused):
            for w in mmpreproj.injected_modules(m):
                w.skip.proj.weight.mul_(3.0)  # as an optimizer step would, in place
        torch.testing.assert_close(fused(tokens).logits, plain(tokens).logits, atol=1e-5, rtol=1e-5)


def test_native_fused_equals_plain_with_kv_cache():
    torch.manual_seed(0)
    blocks = nn.ModuleList(Block(32, 4, rope=RoPE1D(8), causal=True) for _ in range(2)).eval()
    plain = mmpreproj.inject(blocks, PreProjConfig(skip_init_std=0.05))
    fused = mmpreproj.set_fused(copy.deepcopy(plain), True)
    x, pos = torch.randn(2, 6, 32), torch.arange(6)

    def run(m, x, pos, caches=None):
        for i, b in enumerate(m):
            x = b(x, pos=pos, cache=None if caches is None else caches[i])
        return x

    torch.testing.assert_close(run(fused, x, pos), run(plain, x, pos), atol=1e-5, rtol=1e-5)
    caches = [KVCache(), KVCache()]
    steps = [run(fused, x[:, :4], pos[:4], caches), run(fused, x[:, 4:], pos[4:], caches)]
    torch.testing.assert_close(torch.cat(steps, 1), run(plain, x, pos), atol=1e-5, rtol=1e-5)


def test_fused_unavailable_host_errors_and_leaves_model_untouched():
    from mmpreproj.hosts import HOSTS, HostSpec

    spec = HOSTS["gpt_neox"]
    HOSTS["no_fused_test"] = HostSpec(**{**spec.__dict__, "name": "no_fused_test", "fused_forward": None})
    try:
        model = tiny_neox()
        with pytest.raises(ValueError, match="fused"):
            mmpreproj.inject(model, PreProjConfig(fuse_qkv_skip=True), host="no_fused_test")
        assert not mmpreproj.is_injected(model)
    finally:
        del HOSTS["no_fused_test"]


@pytest.mark.parametrize("module", [PreProjection(16), ContentSkip(16)], ids=["preproj", "skip"])
def test_modules_compile_fullgraph(module):
    x = torch.randn(2, 5, 16)
    compiled = torch.compile(module, fullgraph=True, backend="eager")
    torch.testing.assert_close(compiled(x), module(x))


def test_injected_neox_compiles_with_no_graph_break_in_wrapper(tokens):
    model = mmpreproj.inject(tiny_neox(), PreProjConfig(skip_init_std=0.05))
    wrapper = mmpreproj.injected_modules(model)[0]
    x = torch.randn(2, tokens.shape[1], 32)
    emb = model.gpt_neox.rotary_emb(x, torch.arange(tokens.shape[1])[None])
    causal = torch.full((1, 1, x.shape[1], x.shape[1]), float("-inf")).triu(1)
    compiled = torch.compile(wrapper, fullgraph=True, backend="eager")
    with torch.no_grad():
        ref = wrapper(x, attention_mask=causal, position_embeddings=emb)[0]
        torch.testing.assert_close(compiled(x, attention_mask=causal, position_embeddings=emb)[0], ref)
        torch.testing.assert_close(torch.compile(model, backend="eager")(tokens).logits, model(tokens).logits)


def test_injected_timm_vit_compiles_with_no_graph_break_in_wrapper():
    import timm

    torch.manual_seed(0)
    vit = timm.models.vision_transformer.VisionTransformer(
        img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=4, num_classes=10
    ).eval()
    mmpreproj.inject(vit, PreProjConfig(skip_init_std=0.05))
    wrapper = mmpreproj.injected_modules(vit)[0]
    x = torch.randn(2, 17, 64)
    with torch.no_grad():
        compiled = torch.compile(wrapper, fullgraph=True, backend="eager")  # fails on any graph break
        torch.testing.assert_close(compiled(x), wrapper(x))
        img = torch.randn(2, 3, 32, 32)
        torch.testing.assert_close(torch.compile(vit, backend="eager")(img), vit(img))
