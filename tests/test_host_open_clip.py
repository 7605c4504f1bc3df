"""open_clip hosts (rows `open_clip`, `open_clip_coca`, `open_clip_vit`, `open_clip_text`, `open_clip_transformer`,
`open_clip_multimodal`): the shared contract, plus where the skip joins a ResidualAttentionBlock and a
CustomResidualAttentionBlock (qk-norm, post-attention norm), the block order of a two-tower CLIP and of
CoCa (cross-attention untouched), towers of different widths, the model's other entry points and the
blocks that must be rejected.

Both block types share one call convention (`_CALL` in the row: slot 0 = the normed input; MHA returns a
tuple, the custom Attention a tensor); the contract runs on every case. open_clip 3.3 cannot checkpoint a
CustomResidualAttentionBlock at all, so those cases skip the checkpointing row of the contract (and a test
below pins that the untouched host fails the same way). Each new tiny model is built once per module."""

from __future__ import annotations

from functools import partial

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import mmpreproj
from mmpreproj import PreProjAttention, PreProjConfig
from tests.helpers.host_contract import IDENTITY, HostCase, HostContract, build_once, injected_params
from tests.helpers.snapshots import assert_same_snapshot, snapshot

open_clip = pytest.importorskip("open_clip")
from open_clip.coca_model import CoCa  # noqa: E402
from open_clip.model import CLIP, CustomTextCLIP  # noqa: E402
from open_clip.transformer import (  # noqa: E402
    CustomResidualAttentionBlock,
    CustomTransformer,
    MultimodalTransformer,
    TextTransformer,
    VisionTransformer,
)

CTX, VOCAB = 16, 100


def vision_cfg(width, depth):
    return dict(image_size=32, patch_size=8, width=width, layers=depth, head_width=32)


def text_cfg(width, depth):
    return dict(context_length=CTX, vocab_size=VOCAB, width=width, heads=2, layers=depth)


def seeded(fn, seed=0):
    torch.manual_seed(seed)
    return fn().eval()


# every CustomResidualAttentionBlock option but scaled cosine attention, which open_clip 3.3 itself cannot run
# (its Attention calls torch.bmm on 4D heads)
CUSTOM = dict(qk_norm=True, scale_attn=True, scale_heads=True, scale_attn_inner=True, scale_fc=True, ls_init_value=0.5)


def build_coca(width=64, depth=2, vision_width=None):
    """CoCa: text encoder, decoder and embed_dim share `width` (CoCa needs that); the vision tower may differ."""

    def make():
        model = CoCa(
            embed_dim=width,
            multimodal_cfg=dict(context_length=CTX, vocab_size=VOCAB, width=width, heads=2, layers=depth),
            text_cfg=dict(text_cfg(width, depth), embed_cls=True, output_tokens=True),
            vision_cfg=dict(
                vision_cfg(vision_width or width, depth),
                attentional_pool=True,
                attn_pooler_heads=2,
                attn_pooler_queries=8,
                output_tokens=True,
            ),
        )
        nn.init.normal_(model.text_decoder.text_projection, std=width**-0.5)  # CoCa leaves it torch.empty
        return model

    return seeded(make)


def build_decoder(width=64, depth=2):
    def make():
        model = MultimodalTransformer(width=width, layers=depth, heads=2, context_length=CTX, output_dim=32)
        nn.init.normal_(model.text_projection, std=width**-0.5)  # left torch.empty by open_clip
        return model

    return seeded(make)


def decoder_inputs():
    g = torch.Generator().manual_seed(4)
    return torch.randn(2, 5, 64, generator=g), torch.randn(2, CTX - 1, 64, generator=g)  # image, text embeddings


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


def coca_forward(model, inputs):
    """CoCa's own forward: normalised image/text latents and the decoder's caption logits."""
    return model(*inputs)


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
    # CustomResidualAttentionBlock vision tower (qk-norm, post-attention norm, ...) beside a default text tower
    HostCase(
        "clip_custom_vision_blocks",
        "open_clip",
        build_once(partial(build_clip, vision=CUSTOM)),
        lambda: (images(), tokens()),
        encoders,
    ),
    HostCase("coca", "open_clip_coca", build_once(build_coca), lambda: (images(), tokens()), coca_forward),
]
# open_clip checkpoints blocks as `checkpoint(block, x, None, None, attn_mask)`, which a
# CustomResidualAttentionBlock's `forward(x, attn_mask)` cannot take (CustomTransformer has no switch at all)
NO_CHECKPOINTING = {"clip_custom_vision_blocks"}


@pytest.fixture(params=CASES, ids=[c.id for c in CASES])
def case(request):
    return request.param


class TestContract(HostContract):
    not_bit_exact = frozenset({"clip", "custom_text_clip_layerscale", "vision_tower", "coca"})

    def test_gradient_checkpointing(self, case):
        if case.id in NO_CHECKPOINTING:
            pytest.skip("open_clip 3.3 cannot checkpoint CustomResidualAttentionBlock (see test_custom_blocks_...)")
        super().test_gradient_checkpointing(case)


def test_custom_blocks_cannot_checkpoint_in_open_clip_itself():
    """Why the custom cases skip checkpointing: the untouched host fails; if open_clip fixes it, enable them."""
    model = build_clip(vision=CUSTOM).train()
    model.set_grad_checkpointing(True)
    with pytest.raises(TypeError, match="positional argument"):
        model.encode_image(images())


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
        x_tilde = x_hat + F.silu(x_hat @ w.slots()[0].up.weight.T) @ w.slots()[0].down.weight.T
        torch.testing.assert_close(q, x_tilde, atol=1e-6, rtol=1e-5)
        attn = w.base_layer(x_tilde, x_tilde, x_tilde, need_weights=False)[0]
        skip = x_tilde @ w.slots()[1].proj.weight.T
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
    assert [w.slots()[1].dim for w in mmpreproj.injected_modules(model)] == [64, 64, 32, 32]
    assert model.mmpreproj_state.hidden_size == [64, 64, 32, 32]
    for a, b in zip(encoders(model, inputs), ref):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)  # fp32, see the contract's identity test
    with torch.no_grad():
        for w in mmpreproj.injected_modules(model):
            w.slots()[1].proj.weight.normal_(0, 0.05)
    trained = encoders(model, inputs)
    mmpreproj.save_adapter(model, tmp_path)
    mmpreproj.unload(model)
    assert_same_snapshot(snapshot(model), before)

    mmpreproj.load_adapter(model, tmp_path, is_trainable=True)  # as saved (MHA fast path off)
    for a, b in zip(encoders(model, inputs), trained):
        torch.testing.assert_close(a, b, atol=0, rtol=0)
    mmpreproj.unload(model)

    mmpreproj.inject(model.visual, IDENTITY)  # or each tower on its own
    mmpreproj.inject(model.transformer, IDENTITY)
    assert [w.slots()[1].dim for w in mmpreproj.injected_modules(model.visual)] == [64, 64]
    assert [w.slots()[1].dim for w in mmpreproj.injected_modules(model.transformer)] == [32, 32]
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
        assert not torch.allclose(untouched["image_intermediates"][-1], out["image_intermediates"][-1], atol=1e-4)


# --- CustomResidualAttentionBlock: the skip joins the attention output, inside ln_attn and ls_1 ---------


def test_custom_block_skip_joins_attention_output_inside_post_attention_norm():
    """Block output == x + ls_1(ln_attn(attn(x~) + W_skip·x~)) + MLP branch, from raw pre-projection weights."""
    model = build_clip(vision=CUSTOM)
    with torch.no_grad():
        for blk in model.visual.transformer.resblocks:
            blk.ls_1.gamma.uniform_(0.2, 2.0)
            blk.ln_attn.weight.uniform_(0.5, 1.5)
    mmpreproj.inject(model, PreProjConfig(skip_init_std=0.05))
    blk = model.visual.transformer.resblocks[1]
    assert isinstance(blk, CustomResidualAttentionBlock) and isinstance(blk.attn.base_layer.ln_q, nn.LayerNorm)
    seen = {}
    hooks = [
        blk.register_forward_hook(lambda m, a, out: seen.update(x=a[0], out=out)),
        blk.attn.base_layer.register_forward_pre_hook(lambda m, a: seen.update(x_in=a[0])),
    ]
    with torch.no_grad():
        model.encode_image(images())
        for h in hooks:
            h.remove()
        x, w = seen["x"], blk.attn
        x_hat = blk.ln_1(x)
        x_tilde = x_hat + F.silu(x_hat @ w.slots()[0].up.weight.T) @ w.slots()[0].down.weight.T
        torch.testing.assert_close(seen["x_in"], x_tilde, atol=1e-6, rtol=1e-5)
        attn = w.base_layer(x_tilde)  # the host's qk-norm attention, fed x~, returns a tensor
        skip = x_tilde @ w.slots()[1].proj.weight.T
        h = x + blk.ls_1.gamma * blk.ln_attn(attn + skip)
        expected = h + blk.ls_2(blk.mlp(blk.ln_2(h)))
        torch.testing.assert_close(seen["out"], expected, atol=1e-6, rtol=1e-5)
        h_out = x + blk.ls_1.gamma * (blk.ln_attn(attn) + skip)  # the skip after the norm: must not match
        assert not torch.allclose(seen["out"], h_out + blk.ls_2(blk.mlp(blk.ln_2(h_out))), atol=1e-4)


CUSTOM_ACCEPTED = {
    "custom_text_block": partial(build_clip, text={"block_type": "custom"}),
    "qk_norm_both_towers": partial(build_clip, vision={"qk_norm": True}, text={"qk_norm": True}),
    "custom_tower": lambda: seeded(
        lambda: VisionTransformer(
            image_size=32, patch_size=8, width=64, layers=2, heads=2, mlp_ratio=4.0, block_type="custom"
        )
    ),
}


@pytest.mark.parametrize("name", CUSTOM_ACCEPTED, ids=CUSTOM_ACCEPTED.keys())
def test_custom_blocks_inject_at_identity(name):
    """Every way open_clip builds CustomResidualAttentionBlocks injects, and identity init changes nothing."""
    model = CUSTOM_ACCEPTED[name]().double()
    inputs = (images().double(), tokens())
    fwd = (lambda m: (m(inputs[0]),)) if isinstance(model, VisionTransformer) else (lambda m: encoders(m, inputs))
    ref = fwd(model)
    mmpreproj.inject(model, IDENTITY)
    assert mmpreproj.injected_modules(model)
    for a, b in zip(fwd(model), ref):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)


# --- CoCa: vision, text encoder, decoder self-attention; cross-attention untouched --------------------


def test_coca_parts_block_order_and_untouched_cross_attention(tmp_path):
    """A CoCa whose vision tower is wider than its text side: every self-attention block, in the order
    vision, text, decoder; the decoder's cross-attention and the attentional pooler stay the host's own."""
    model = build_coca(width=32, vision_width=64)
    inputs = (images(), tokens())
    ref = model(*inputs)
    mmpreproj.inject(model, IDENTITY)
    wrappers = mmpreproj.injected_modules(model)
    assert [(w.part, w.block_index, w.slots()[1].dim) for w in wrappers] == [
        ("vision", 0, 64),
        ("vision", 1, 64),
        ("text", 2, 32),
        ("text", 3, 32),
        ("decoder", 4, 32),
        ("decoder", 5, 32),
    ]
    for blk in model.text_decoder.cross_attn:
        assert type(blk.attn) is nn.MultiheadAttention and hasattr(blk, "ln_1_kv")
    assert type(model.visual.attn_pool.attn) is nn.MultiheadAttention
    out = model(*inputs)
    for k in ("image_features", "text_features", "logits"):
        torch.testing.assert_close(out[k], ref[k], atol=1e-5, rtol=0)  # fp32: see the contract's identity test
    report = mmpreproj.trainable_report(model)
    assert report.trainable == report.injected
    assert {n.split(".")[0] for n, p in model.named_parameters() if p.requires_grad} == {
        "visual",
        "text",
        "text_decoder",
    }
    assert not any(p.requires_grad for p in model.text_decoder.cross_attn.parameters())
    mmpreproj.unload(model)

    mmpreproj.inject(model, PreProjConfig(parts=["decoder"], skip_init_std=0.05))  # the captioning decoder only
    assert [w.part for w in mmpreproj.injected_modules(model)] == ["decoder", "decoder"]
    out = model(*inputs)
    torch.testing.assert_close(out["image_features"], ref["image_features"], atol=1e-5, rtol=0)
    torch.testing.assert_close(out["text_features"], ref["text_features"], atol=1e-5, rtol=0)
    assert not torch.allclose(out["logits"], ref["logits"], atol=1e-4)
    mmpreproj.save_adapter(model, tmp_path)
    fresh = build_coca(width=32, vision_width=64)
    mmpreproj.load_adapter(fresh, tmp_path)
    assert torch.equal(fresh(*inputs)["logits"], out["logits"])


def test_coca_with_a_foreign_text_tower_is_rejected_untouched():
    model = build_coca()
    model.text = nn.Linear(
        4, 4
    )  # stands in for CoCa's Hugging Face text towers (coca_roberta-*), not buildable offline
    before = snapshot(model)
    with pytest.raises(ValueError, match="open_clip_coca.*text tower is a Linear, not an open_clip TextTransformer"):
        mmpreproj.inject(model)
    assert_same_snapshot(snapshot(model), before)


def test_decoder_alone_injects_self_attention_only(tmp_path):
    """CoCa's MultimodalTransformer alone (row `open_clip_multimodal`): its self-attention blocks, not cross_attn."""
    model = build_decoder().double()
    inputs = tuple(t.double() for t in decoder_inputs())
    ref = model(*inputs)
    assert mmpreproj.hosts.find_host(model).name == "open_clip_multimodal"
    mmpreproj.inject(model, IDENTITY)
    assert [type(b.attn).__name__ for b in model.resblocks] == ["PreProjAttention"] * 2
    assert [type(b.attn).__name__ for b in model.cross_attn] == ["MultiheadAttention"] * 2
    torch.testing.assert_close(model(*inputs), ref, atol=1e-6, rtol=0)


def test_custom_transformer_stack_row():
    """open_clip's CustomTransformer (all CustomResidualAttentionBlocks) matches the stack row; identity is exact."""
    model = seeded(lambda: CustomTransformer(width=64, layers=2, heads=2)).double()
    x = torch.randn(2, CTX, 64, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    ref = model(x)
    assert mmpreproj.hosts.find_host(model).name == "open_clip_transformer"
    mmpreproj.inject(model, IDENTITY)
    assert len(mmpreproj.injected_modules(model)) == 2
    torch.testing.assert_close(model(x), ref, atol=1e-6, rtol=0)


def test_cross_attention_block_in_a_stack_is_rejected_untouched():
    model = build_decoder()
    model.resblocks[1] = model.cross_attn[1]  # a self-attention slot holding a cross-attention block
    before = snapshot(model)
    with pytest.raises(ValueError, match="block 1 of the decoder tower is a cross-attention block"):
        mmpreproj.inject(model)
    assert_same_snapshot(snapshot(model), before)


def test_timm_vision_tower_is_rejected_with_a_pointer_to_its_trunk():
    model = seeded(
        lambda: CLIP(
            embed_dim=32,
            vision_cfg=dict(image_size=32, timm_model_name="vit_tiny_patch16_224", timm_model_pretrained=False),
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


def test_an_open_clip_adapter_on_a_model_without_visual_is_refused_not_crashed(tmp_path):
    """The vision audit: loading a CLIP adapter onto a timm ViT raised AttributeError from the row's check."""
    timm = pytest.importorskip("timm")
    clip = mmpreproj.inject(build_clip(width=192))
    mmpreproj.save_adapter(clip, tmp_path / "a")
    vit = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, depth=2).eval()
    before = snapshot(vit)
    with pytest.raises(ValueError, match="has no vision tower 'visual': it is not an open_clip CLIP"):
        mmpreproj.load_adapter(vit, tmp_path / "a")
    assert_same_snapshot(snapshot(vit), before)
