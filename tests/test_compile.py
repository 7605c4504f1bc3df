"""torch.compile sees no graph breaks in our modules and gives the same outputs.

(The one-matmul Q/K/V + skip path these tests once covered was removed: README, Performance.)
"""

from __future__ import annotations

import pytest
import torch

import mmpreproj
from mmpreproj import PreProjConfig
from mmpreproj.modules import ContentSkip, PreProjection
from tests.helpers.zoo import tiny_neox


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
