"""Skip-norm analysis against direct computations."""

from __future__ import annotations

import torch
from conftest import tiny_neox

import mmpreproj
from mmpreproj.analysis import plot_skip_norms, routing_ratios, skip_norms, skip_norms_from_adapter


def test_skip_norms_match_weights_and_saved_adapter(tmp_path):
    model = mmpreproj.inject(tiny_neox(), mmpreproj.PreProjConfig(skip_init_std=0.1))
    norms = skip_norms(model)
    for w in mmpreproj.injected_modules(model):
        assert abs(norms[w.block_index] - torch.linalg.matrix_norm(w.skip.proj.weight).item()) < 1e-6
    mmpreproj.save_adapter(model, tmp_path)
    assert skip_norms_from_adapter(tmp_path) == norms


def test_routing_ratio_equals_hand_computation(tokens):
    model = mmpreproj.inject(tiny_neox(), mmpreproj.PreProjConfig(skip_init_std=0.1))
    mask = torch.ones_like(tokens, dtype=torch.bool)
    mask[0, :4] = False
    ratios = routing_ratios(model, [{"input_ids": tokens, "token_mask": mask}], token_mask_key="token_mask")
    # by hand: run each block's pieces on the captured normed input
    layer = model.gpt_neox.layers[0]
    seen = {}
    h = layer.input_layernorm.register_forward_hook(lambda m, a, o: seen.setdefault("x_hat", o))
    with torch.no_grad():
        model(tokens)
        h.remove()
        w = layer.attention
        x_tilde = w.preproj(seen["x_hat"])
        emb = model.gpt_neox.rotary_emb(x_tilde, torch.arange(tokens.shape[1])[None])
        S = tokens.shape[1]
        causal = torch.full((1, 1, S, S), float("-inf")).triu(1)
        attn = w.base_layer(x_tilde, attention_mask=causal, position_embeddings=emb)[0]
        skip = w.skip(x_tilde)
    expected = skip.norm(dim=-1)[mask].sum() / attn.norm(dim=-1)[mask].sum()
    assert abs(ratios[0] - expected.item()) < 1e-5 * expected.item()
    assert set(ratios) == {0, 1} and not model.training


def test_plot_writes_png(tmp_path):
    p = plot_skip_norms({"a": [0.1, 0.2, 0.3], "b": [0.2, 0.2, 0.1]}, tmp_path / "fig.png")
    assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
