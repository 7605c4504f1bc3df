"""timm hosts (rows `timm_vit`, `timm_eva`): the shared contract, plus where the skip sits in the block,
the feature paths (forward_features / forward_head / forward_intermediates / features_only), fused vs
manual attention and the blocks that must be rejected."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import pytest
import timm
import torch
import torch.nn.functional as F
from host_contract import IDENTITY, HostCase, HostContract, assert_same_snapshot, injected_params, snapshot
from timm.layers import set_reentrant_ckpt, use_reentrant_ckpt
from timm.models.deit import VisionTransformerDistilled
from timm.models.eva import Eva
from timm.models.vision_transformer import (
    ParallelScalingBlock,
    ParallelThingsBlock,
    ResPostBlock,
    VisionTransformer,
)
from torch import nn

import mmpreproj
from mmpreproj import PreProjAttention, PreProjConfig

TINY = dict(img_size=32, patch_size=8, num_heads=4, num_classes=10)


def build(cls, width=64, depth=2, seed=0, **kw):
    torch.manual_seed(seed)
    return cls(embed_dim=width, depth=depth, **TINY, **kw).eval()


def images(batch=2, seed=1):
    return (torch.randn(batch, 3, 32, 32, generator=torch.Generator().manual_seed(seed)),)


BUILDERS = {
    "vit": partial(build, VisionTransformer),
    "vit_registers_no_cls": partial(
        build, VisionTransformer, class_token=False, reg_tokens=4, global_pool="avg", no_embed_class=True
    ),
    "vit_layerscale": partial(build, VisionTransformer, init_values=0.5),
    "deit_distilled": partial(build, VisionTransformerDistilled),
    "eva_rope": partial(build, Eva, use_rot_pos_emb=True, init_values=0.5, swiglu_mlp=True, scale_mlp=True),
    "eva_attention_rope_gqa": partial(
        build, Eva, use_rot_pos_emb=True, attn_type="rope", qkv_fused=False, num_kv_heads=2
    ),
}
HOST = {"eva_rope": "timm_eva", "eva_attention_rope_gqa": "timm_eva"}
CASES = [HostCase(name, HOST.get(name, "timm_vit"), b, images) for name, b in BUILDERS.items()]


@pytest.fixture(params=CASES, ids=[c.id for c in CASES])
def case(request):
    return request.param


class TestContract(HostContract):
    pass


# --- where the skip joins: inside the attention branch, before LayerScale and drop-path ---------------


@dataclass
class BlockLayout:
    """How a pre-norm timm block scales its two branches."""

    build: Callable[[], nn.Module]
    gamma1: Callable[[nn.Module], torch.Tensor]  # block -> attention-branch LayerScale weight
    gamma2: Callable[[nn.Module], torch.Tensor]  # block -> MLP-branch LayerScale weight


LAYOUTS = {
    "vit": BlockLayout(BUILDERS["vit_layerscale"], lambda b: b.ls1.gamma, lambda b: b.ls2.gamma),
    "eva": BlockLayout(BUILDERS["eva_rope"], lambda b: b.gamma_1, lambda b: b.gamma_2),
}


def _capture(block):
    """Run-time (args, kwargs, output) of `block`, e.g. Eva's `rope=`."""
    seen = {}

    def hook(module, args, kwargs, out):
        seen.update(x=args[0], kwargs=kwargs, out=out)

    return seen, block.register_forward_hook(hook, with_kwargs=True)


@pytest.mark.parametrize("layout", LAYOUTS.values(), ids=LAYOUTS.keys())
def test_layer_scale_scales_the_skip(layout):
    """Block output == x + ls1(attn(x~) + W_skip·x~), then the MLP branch, written from raw weights."""
    model = layout.build()
    with torch.no_grad():  # distinct per-channel scales, so a misplaced skip cannot match by accident
        for blk in model.blocks:
            layout.gamma1(blk).uniform_(0.2, 2.0)
    mmpreproj.inject(model, PreProjConfig(skip_init_std=0.05))
    blk = model.blocks[1]
    seen, handle = _capture(blk)
    with torch.no_grad():
        model(*images())
        handle.remove()
        x, kw, w = seen["x"], seen["kwargs"], blk.attn
        assert isinstance(w, PreProjAttention)
        n1 = blk.norm1
        x_hat = F.layer_norm(x, n1.normalized_shape, n1.weight, n1.bias, n1.eps)
        x_tilde = x_hat + F.silu(x_hat @ w.preproj.up.weight.T) @ w.preproj.down.weight.T
        attn = w.base_layer(x_tilde, **kw)  # the host's own attention (and RoPE for Eva), fed x~
        skip = x_tilde @ w.skip.proj.weight.T
        h = x + layout.gamma1(blk) * (attn + skip)
        expected = h + layout.gamma2(blk) * blk.mlp(blk.norm2(h))
        torch.testing.assert_close(seen["out"], expected, atol=1e-6, rtol=1e-5)
        # the same with the skip outside LayerScale does not match: the check above can fail
        h_out = x + layout.gamma1(blk) * attn + skip
        wrong = h_out + layout.gamma2(blk) * blk.mlp(blk.norm2(h_out))
        assert not torch.allclose(seen["out"], wrong, atol=1e-4)


@pytest.mark.parametrize("cls", [VisionTransformer, Eva], ids=["vit", "eva"])
def test_drop_path_drops_the_skip_with_attention(cls):
    """In train mode a dropped attention path drops the skip too (per sample), a kept one rescales it."""
    model = build(cls, drop_path_rate=0.5, **({"use_rot_pos_emb": True} if cls is Eva else {}))
    mmpreproj.inject(model, PreProjConfig(init="identity", skip_init_std=0.1))
    blk = model.blocks[1]  # timm's drop-path schedule: block 0 gets 0, block 1 gets the full rate
    keep = 1 - blk.drop_path1.drop_prob
    with torch.no_grad():  # attention output 0: the branch is the skip alone
        blk.attn.base_layer.proj.weight.zero_()
        blk.attn.base_layer.proj.bias.zero_()
    seen = {}
    hooks = [
        blk.register_forward_pre_hook(lambda m, a: seen.__setitem__("x", a[0])),
        blk.norm2.register_forward_pre_hook(lambda m, a: seen.__setitem__("h", a[0])),
    ]
    model.train()
    torch.manual_seed(0)
    with torch.no_grad():
        model(*images(batch=16))
    for h in hooks:
        h.remove()
    x, h = seen["x"], seen["h"]
    skip = blk.attn.skip(blk.norm1(x)).detach()
    delta = (h - x).flatten(1)
    dropped = delta.abs().amax(1) == 0
    assert 0 < dropped.sum() < len(dropped), "expected both dropped and kept samples"
    torch.testing.assert_close(delta[~dropped], (skip / keep).flatten(1)[~dropped], atol=1e-6, rtol=1e-5)
    assert skip.flatten(1)[dropped].abs().amax() > 0  # the skip was there to drop


# --- feature paths ------------------------------------------------------------------------------------


def _perturbed(model, seed=5):
    mmpreproj.inject(model)
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in injected_params(model).values():
            p.normal_(std=0.05)
    return model


@pytest.mark.parametrize("name", ["vit", "vit_registers_no_cls", "deit_distilled", "eva_rope"])
def test_forward_features_head_and_intermediates_agree(name):
    model = _perturbed(BUILDERS[name]())
    (x,) = images()
    with torch.no_grad():
        feats = model.forward_features(x)
        torch.testing.assert_close(model(x), model.forward_head(feats), atol=1e-6, rtol=0)
        final, inter = model.forward_intermediates(x, output_fmt="NLC")
        torch.testing.assert_close(final, feats, atol=1e-6, rtol=0)
        only = model.forward_intermediates(x, output_fmt="NLC", intermediates_only=True)
        assert len(only) == len(inter) == len(model.blocks)
        for a, b in zip(only, inter):
            torch.testing.assert_close(a, b, atol=1e-6, rtol=0)
        with mmpreproj.adapter_disabled(model):  # the injection is in effect on this path
            untouched = model.forward_intermediates(x, output_fmt="NLC", intermediates_only=True)
        assert not torch.allclose(untouched[-1], only[-1], atol=1e-4)


@pytest.mark.parametrize("name", ["vit_tiny_patch16_224", "eva02_tiny_patch14_224"])
def test_features_only_model(name, tmp_path):
    """A `features_only=True` net takes the adapter of the full model and gives its intermediates."""
    kw = dict(pretrained=False, img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=4)
    torch.manual_seed(0)
    full = timm.create_model(name, **kw).eval()
    torch.manual_seed(0)
    net = timm.create_model(name, features_only=True, out_indices=(0, 1), **kw).eval()
    (x,) = images()
    with torch.no_grad():
        ref = net(x)
    mmpreproj.inject(net, IDENTITY)
    with torch.no_grad():
        for a, b in zip(net(x), ref):
            torch.testing.assert_close(a, b, atol=1e-6, rtol=0)
    mmpreproj.unload(net)

    mmpreproj.save_adapter(_perturbed(full), tmp_path)
    mmpreproj.load_adapter(net, tmp_path)
    with torch.no_grad():
        want = full.forward_intermediates(x, indices=(0, 1), intermediates_only=True)
        got = net(x)
    for a, b, r in zip(got, want, ref):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)
        assert not torch.allclose(a, r, atol=1e-4)
    sum(f.square().mean() for f in net(x)).backward()
    assert all(p.grad is not None for p in injected_params(net).values())
    assert all(p.grad is None for n, p in net.named_parameters() if n not in injected_params(net))


def _set_fused_attn(model, fused: bool) -> int:
    """Set `fused_attn` on the host attention modules (not on the wrappers, which only forward reads)."""
    found = [m for m in model.modules() if not isinstance(m, PreProjAttention) and hasattr(m, "fused_attn")]
    for m in found:
        m.fused_attn = fused
    return len(found)


@pytest.mark.parametrize("name", ["vit", "vit_registers_no_cls", "eva_rope"])
def test_fused_and_manual_attention_agree(name):
    model = _perturbed(BUILDERS[name]())
    (x,) = images()
    results = []
    for fused in (True, False):
        assert _set_fused_attn(model, fused) == len(model.blocks)
        model.zero_grad()
        out = model(x)
        out.square().mean().backward()
        results.append((out.detach(), {n: p.grad.clone() for n, p in injected_params(model).items()}))
    (out_f, g_f), (out_m, g_m) = results
    torch.testing.assert_close(out_f, out_m, atol=1e-5, rtol=0)
    for n in g_f:
        torch.testing.assert_close(g_f[n], g_m[n], atol=1e-5, rtol=1e-4)


def test_reentrant_checkpointing_gets_gradients_with_frozen_base():
    """The row's `input_embeddings` (patch_embed) makes the block input require grad while timm's
    checkpointing is on and reentrant (the hook reads those switches; see tests/test_precision.py)."""
    model = _perturbed(BUILDERS["vit"]()).train()
    model.set_grad_checkpointing(True)
    (x,) = images()
    before = use_reentrant_ckpt()
    set_reentrant_ckpt(True)
    try:
        model.forward_features(x).square().mean().backward()
    finally:
        set_reentrant_ckpt(before)
    for n, p in injected_params(model).items():
        assert p.grad is not None and p.grad.abs().sum() > 0, f"no gradient for {n}"


# --- rejected blocks ----------------------------------------------------------------------------------

REJECTED = {
    "ResPostBlock": partial(build, VisionTransformer, block_fn=ResPostBlock),
    "ParallelScalingBlock": partial(build, VisionTransformer, block_fn=ParallelScalingBlock),
    "ParallelThingsBlock": partial(build, VisionTransformer, block_fn=ParallelThingsBlock),
    "EvaBlockPostNorm": partial(build, Eva, use_post_norm=True),
}


@pytest.mark.parametrize("block", REJECTED, ids=REJECTED.keys())
def test_unsupported_blocks_are_rejected_untouched(block):
    model = REJECTED[block]()
    before = snapshot(model)
    with pytest.raises(ValueError, match=f"is a {block}"):
        mmpreproj.inject(model)
    assert_same_snapshot(snapshot(model), before)
