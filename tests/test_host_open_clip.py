"""open_clip hosts (rows `open_clip`, `open_clip_vit`, `open_clip_text`, `open_clip_transformer`): the shared
contract, plus where the skip joins a ResidualAttentionBlock, the block order of a two-tower CLIP,
towers of different widths, the model's other entry points and the blocks that must be rejected."""

from __future__ import annotations

from functools import partial

import pytest
import torch
import torch.nn.functional as F
from host_contract import IDENTITY, HostCase, HostContract, assert_same_snapshot, injected_params, snapshot

import mmpreproj
from mmpreproj import PreProjAttention, PreProjConfig

open_clip = pytest.importorskip("open_clip")
from open_clip.model import CLIP, CustomTextCLIP  # noqa: E402
from open_clip.transformer import TextTransformer, VisionTransformer  # noqa: E402

CTX, VOCAB = 16, 100


def vision_cfg(width, depth):
    return dict(image_size=32, patch_size=8, width=width, layers=depth, head_width=32)


def text_cfg(width, depth):
    return dict(context_length=CTX, vocab_size=VOCAB, width=width, heads=2, layers=depth)


def seeded(fn, seed=0):
    torch.manual_seed(seed)
    return fn().eval()


def build_clip(width=64, depth=2, cls=CLIP, vision=None, text=None):
    """Both towers `width` wide and `depth` deep unless `vision` / `text` override their configs."""
    return seeded(
        lambda: cls(
            embed_dim=32,
            vision_cfg={**vision_cfg(width, depth), **(vision or {})},
            text_cfg={**text_cfg(width, depth), **(text or {})},
        )
    )


def images(batch=2):
    return torch.randn(batch, 3, 32, 32, generator=torch.Generator().manual_seed(1))


def tokens(batch=2):
    t = torch.randint(1, VOCAB - 1, (batch, CTX), generator=torch.Generator().manual_seed(2))
    t[:, -3] = VOCAB - 1  # the end-of-text token (argmax pooling)
    return t


def encoders(model, inputs):
    """Unnormalised features of both towers (CLIP.forward L2-normalises, which flattens a square loss)."""
    return model.encode_image(inputs[0]), model.encode_text(inputs[1])


CASES = [
    HostCase("clip", "open_clip", build_clip, lambda: (images(), tokens()), encoders),
    HostCase(
        "custom_text_clip_layerscale",
        "open_clip",
        partial(build_clip, cls=CustomTextCLIP, vision={"ls_init_value": 0.5}, text={"ls_init_value": 0.5}),
        lambda: (images(), tokens()),
        encoders,
    ),
    HostCase(
        "vision_tower",
        "open_clip_vit",
        lambda width=64, depth=2: seeded(
            lambda: VisionTransformer(
                image_size=32, patch_size=8, width=width, layers=depth, heads=2, mlp_ratio=4.0, output_dim=32
            )
        ),
        lambda: (images(),),
    ),
    HostCase(
        "text_tower",
        "open_clip_text",
        lambda width=64, depth=2: seeded(
            lambda: TextTransformer(
                context_length=CTX, vocab_size=VOCAB, width=width, heads=2, layers=depth, output_dim=32
            )
        ),
        lambda: (tokens(),),
    ),
]


@pytest.fixture(params=CASES, ids=[c.id for c in CASES])
def case(request):
    return request.param


class TestContract(HostContract):
    pass


def test_transformer_stack_row():
    """A bare block stack (a plain CLIP's text tower) matches its own row; identity init leaves it unchanged."""
    model = build_clip()
    stack = model.transformer
    assert mmpreproj.hosts.find_host(stack).name == "open_clip_transformer"
    x = torch.randn(2, CTX, 64, generator=torch.Generator().manual_seed(3))
    ref = stack(x, attn_mask=model.attn_mask)
    mmpreproj.inject(stack, IDENTITY)
    assert len(mmpreproj.injected_modules(stack)) == 2
    out = stack(x, attn_mask=model.attn_mask)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=0)  # fp32: see the contract's identity test


# --- where the skip joins: output[0] of MultiheadAttention, inside ls_1 --------------------------------


def test_skip_joins_attention_output_inside_layer_scale():
    """Block output == x + ls_1(mha(x~, x~, x~)[0] + W_skip·x~) + ..., from raw pre-projection weights."""
    model = build_clip(vision={"ls_init_value": 0.5})
    with torch.no_grad():
        for blk in model.visual.transformer.resblocks:
            blk.ls_1.gamma.uniform_(0.2, 2.0)
    mmpreproj.inject(model, PreProjConfig(skip_init_std=0.05))
    blk = model.visual.transformer.resblocks[1]
    seen = {}
    hooks = [
        blk.register_forward_hook(lambda m, a, out: seen.update(x=a[0], out=out)),
        blk.attn.base_layer.register_forward_pre_hook(lambda m, a: seen.update(qkv=a)),
    ]
    with torch.no_grad():
        model.encode_image(images())
        for h in hooks:
            h.remove()
        x, w = seen["x"], blk.attn
        q, k, v = seen["qkv"]
        assert q is k is v, "MultiheadAttention must still see one self-attention input"
        x_hat = blk.ln_1(x)
        x_tilde = x_hat + F.silu(x_hat @ w.preproj.up.weight.T) @ w.preproj.down.weight.T
        torch.testing.assert_close(q, x_tilde, atol=1e-6, rtol=1e-5)
        attn = w.base_layer(x_tilde, x_tilde, x_tilde, need_weights=False)[0]
        skip = x_tilde @ w.skip.proj.weight.T
        h = x + blk.ls_1.gamma * (attn + skip)
        expected = h + blk.ls_2(blk.mlp(blk.ln_2(h)))
        torch.testing.assert_close(seen["out"], expected, atol=1e-6, rtol=1e-5)
        h_out = x + blk.ls_1.gamma * attn + skip  # the skip outside LayerScale: must not match
        assert not torch.allclose(seen["out"], h_out + blk.ls_2(blk.mlp(blk.ln_2(h_out))), atol=1e-4)


# --- two towers -------------------------------------------------------------------------------------


def test_block_order_is_vision_then_text():
    model = build_clip(depth=2)
    ref_image, ref_text = encoders(model, (images(), tokens()))
    mmpreproj.inject(model, PreProjConfig(layers=[1, 2]))
    vis, txt = model.visual.transformer.resblocks, model.transformer.resblocks
    assert isinstance(vis[1].attn, PreProjAttention) and vis[1].attn.block_index == 1
    assert isinstance(txt[0].attn, PreProjAttention) and txt[0].attn.block_index == 2
    assert not isinstance(vis[0].attn, PreProjAttention) and not isinstance(txt[1].attn, PreProjAttention)
    mmpreproj.unload(model)
    mmpreproj.inject(model, PreProjConfig(layers=[2, 3]))  # the text tower only
    image, text = encoders(model, (images(), tokens()))
    torch.testing.assert_close(image, ref_image, atol=1e-5, rtol=0)  # fp32: only the frozen flags differ
    assert not torch.allclose(text, ref_text, atol=1e-4)


def test_towers_of_different_widths(tmp_path):
    """One injection covers both towers even when their widths differ; each module takes its block's width."""
    model = build_clip(width=64, text={"width": 32})
    inputs = (images(), tokens())
    ref = encoders(model, inputs)
    before = snapshot(model)
    mmpreproj.inject(model, IDENTITY)
    assert [w.skip.dim for w in mmpreproj.injected_modules(model)] == [64, 64, 32, 32]
    assert model.mmpreproj_state.hidden_size == [64, 64, 32, 32]
    for a, b in zip(encoders(model, inputs), ref):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)  # fp32, see the contract's identity test
    with torch.no_grad():
        for w in mmpreproj.injected_modules(model):
            w.skip.proj.weight.normal_(0, 0.05)
    trained = encoders(model, inputs)
    mmpreproj.save_adapter(model, tmp_path)
    mmpreproj.unload(model)
    assert_same_snapshot(snapshot(model), before)

    mmpreproj.load_adapter(model, tmp_path)
    for a, b in zip(encoders(model, inputs), trained):
        torch.testing.assert_close(a, b, atol=0, rtol=0)
    mmpreproj.unload(model)

    mmpreproj.inject(model.visual, IDENTITY)  # or each tower on its own
    mmpreproj.inject(model.transformer, IDENTITY)
    assert [w.skip.dim for w in mmpreproj.injected_modules(model.visual)] == [64, 64]
    assert [w.skip.dim for w in mmpreproj.injected_modules(model.transformer)] == [32, 32]
    mmpreproj.unload(model.visual)
    mmpreproj.unload(model.transformer)
    assert_same_snapshot(snapshot(model), before)


def test_forward_and_intermediates_agree_with_encoders():
    model = build_clip()
    mmpreproj.inject(model)
    with torch.no_grad():
        for p in injected_params(model).values():
            p.normal_(std=0.05)
        image, text = encoders(model, (images(), tokens()))
        img_n, txt_n, _ = model(images(), tokens())
        torch.testing.assert_close(img_n, F.normalize(image, dim=-1), atol=1e-6, rtol=0)
        torch.testing.assert_close(txt_n, F.normalize(text, dim=-1), atol=1e-6, rtol=0)
        out = model.forward_intermediates(images(), tokens(), normalize=False)
        torch.testing.assert_close(out["image_features"], image, atol=1e-6, rtol=0)
        torch.testing.assert_close(out["text_features"], text, atol=1e-6, rtol=0)
        assert len(out["image_intermediates"]) == len(out["text_intermediates"]) == 2
        with mmpreproj.adapter_disabled(model):
            untouched = model.forward_intermediates(images(), tokens(), normalize=False)
        assert not torch.allclose(
            untouched["image_intermediates"][-1], out["image_intermediates"][-1], atol=1e-4
        )


# --- rejected -----------------------------------------------------------------------------------------

REJECTED = {
    "custom_vision_block": (partial(build_clip, vision={"qk_norm": True}), "CustomResidualAttentionBlock"),
    "custom_text_block": (partial(build_clip, text={"block_type": "custom"}), "CustomResidualAttentionBlock"),
    "custom_tower": (
        lambda: seeded(
            lambda: VisionTransformer(
                image_size=32, patch_size=8, width=64, layers=2, heads=2, mlp_ratio=4.0, block_type="custom"
            )
        ),
        "CustomResidualAttentionBlock",
    ),
}


@pytest.mark.parametrize("name", REJECTED, ids=REJECTED.keys())
def test_unsupported_blocks_are_rejected_untouched(name):
    build, message = REJECTED[name]
    model = build()
    before = snapshot(model)
    with pytest.raises(ValueError, match=message):
        mmpreproj.inject(model)
    assert_same_snapshot(snapshot(model), before)


def test_coca_decoder_stack_is_not_matched():
    """CoCa's MultimodalTransformer subclasses Transformer but interleaves cross-attention."""
    from open_clip.transformer import MultimodalTransformer

    stack = MultimodalTransformer(width=64, layers=1, heads=2, context_length=CTX, output_dim=32)
    with pytest.raises(ValueError, match="no host row for MultimodalTransformer.*describe it yourself"):
        mmpreproj.inject(stack)


def test_timm_vision_tower_is_rejected_with_a_pointer_to_its_trunk():
    model = seeded(
        lambda: CLIP(
            embed_dim=32,
            vision_cfg=dict(
                image_size=32, timm_model_name="vit_tiny_patch16_224", timm_model_pretrained=False
            ),
            text_cfg=text_cfg(64, 2),
        )
    )
    before = snapshot(model)
    with pytest.raises(ValueError, match=r"TimmModel.*model\.visual\.trunk"):
        mmpreproj.inject(model)
    assert_same_snapshot(snapshot(model), before)
    mmpreproj.inject(model.visual.trunk)  # the timm row takes the trunk
    assert mmpreproj.hosts.find_host(model.visual.trunk).name == "timm_vit"
    assert len(mmpreproj.injected_modules(model)) == len(model.visual.trunk.blocks)
