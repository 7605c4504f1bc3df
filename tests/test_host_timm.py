"""timm hosts (rows `timm_vit`, `timm_eva`, `timm_beit`, `timm_naflexvit`, `timm_vit_relpos`, `timm_vit_sam`):
the shared contract, plus where the skip sits in the block (LayerScale, drop-path, SAM's windows), the
feature paths (forward_features / forward_head / forward_intermediates / features_only), NaFlex padding,
fused vs manual attention and the blocks that must be rejected.

Every row here shares one call convention (`attn(x, **kw)` -> tensor); the contract runs on every case.
Each tiny model is built once per module (`host_contract.build_once`) and handed out as a deep copy."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import pytest
import timm
import torch
import torch.nn.functional as F
from timm.layers import set_reentrant_ckpt, use_reentrant_ckpt
from timm.models.beit import Beit
from timm.models.deit import VisionTransformerDistilled
from timm.models.eva import Eva
from timm.models.naflexvit import NaFlexVit
from timm.models.vision_transformer import (
    ParallelScalingBlock,
    ParallelThingsBlock,
    ResPostBlock,
    VisionTransformer,
)
from timm.models.vision_transformer_relpos import ResPostRelPosBlock, VisionTransformerRelPos
from timm.models.vision_transformer_sam import VisionTransformerSAM, window_partition, window_unpartition
from torch import nn

import mmpreproj
from mmpreproj import PreProjAttention, PreProjConfig
from mmpreproj.hosts.checkpointing import reentrant_checkpointing
from tests.helpers.host_contract import IDENTITY, HostCase, HostContract, build_once, injected_params, run
from tests.helpers.snapshots import assert_same_snapshot, snapshot

TINY = dict(img_size=32, patch_size=8, num_heads=4, num_classes=10)


def build(cls, width=64, depth=2, seed=0, **kw):
    torch.manual_seed(seed)
    return cls(embed_dim=width, depth=depth, **TINY, **kw).eval()


def images(batch=2, seed=1):
    return (torch.randn(batch, 3, 32, 32, generator=torch.Generator().manual_seed(seed)),)


def sam(width=64, depth=2, seed=0, global_attn_indexes=(1,), **kw):
    """SAM on a 5x5 patch grid with 2x2 windows: the grid is zero-padded to 6x6; block 1 is global."""
    torch.manual_seed(seed)
    return VisionTransformerSAM(
        img_size=40,
        patch_size=8,
        embed_dim=width,
        depth=depth,
        num_heads=4,
        num_classes=10,
        window_size=2,
        global_attn_indexes=global_attn_indexes,
        neck_chans=16,
        init_values=0.5,
        **kw,
    ).eval()


def sam_images(batch=2, seed=1):
    return (torch.randn(batch, 3, 40, 40, generator=torch.Generator().manual_seed(seed)),)


def naflex_batch(batch_seed=1):
    """NaFlex inputs (patches, patch_coord, patch_valid): a 4x4 image and a 3x4 one padded to 16 patches."""
    g = torch.Generator().manual_seed(batch_seed)
    n = 16
    patches = torch.randn(2, n, 8 * 8 * 3, generator=g)
    coord = torch.zeros(2, n, 2, dtype=torch.long)
    valid = torch.zeros(2, n, dtype=torch.bool)
    for b, (h, w) in enumerate([(4, 4), (3, 4)]):
        grid = torch.stack(torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij"), -1).reshape(-1, 2)
        coord[b, : h * w], valid[b, : h * w] = grid, True
    patches[~valid] = 0
    return patches, coord, valid


def features_and_logits(model, inputs):
    """Pre-head features too: Beit's head starts 1000x smaller (head_init_scale), its logits alone are ~1e-4."""
    feats = model.forward_features(*inputs)
    return feats, model.forward_head(feats)


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
    # near misses: the ViT block shape outside VisionTransformer (one contract case per row; the other
    # variants run in the block-layout tests and test_near_miss_variants_inject_at_identity)
    "beit_relpos_layerscale": build_once(partial(build, Beit, use_rel_pos_bias=True, init_values=0.5)),
    "naflexvit_rope_masked": build_once(partial(build, NaFlexVit, rope_type="axial", class_token=True, reg_tokens=1)),
    "vit_relpos_shared_cls": build_once(
        partial(build, VisionTransformerRelPos, init_values=0.5, shared_rel_pos=True, class_token=True)
    ),
    "vit_sam_relpos_padded": build_once(partial(sam, use_rel_pos=True)),
}
HOST = {
    "eva_rope": "timm_eva",
    "eva_attention_rope_gqa": "timm_eva",
    "beit_relpos_layerscale": "timm_beit",
    "naflexvit_rope_masked": "timm_naflexvit",
    "vit_relpos_shared_cls": "timm_vit_relpos",
    "vit_sam_relpos_padded": "timm_vit_sam",
}
INPUTS = {
    "naflexvit_rope_masked": naflex_batch,  # NaFlex mode: padded patches, a key-padding mask, RoPE per patch
    "vit_sam_relpos_padded": sam_images,
}
FORWARD = {"beit_relpos_layerscale": features_and_logits}
CASES = [
    HostCase(
        name,
        HOST.get(name, "timm_vit"),
        b,
        INPUTS.get(name, images),
        **({"forward": FORWARD[name]} if name in FORWARD else {}),
    )
    for name, b in BUILDERS.items()
]


@pytest.fixture(params=CASES, ids=[c.id for c in CASES])
def case(request):
    return request.param


class TestContract(HostContract):
    not_bit_exact = frozenset({"vit_sam_relpos_padded"})


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
    # kwargs seen by the block and passed on to attention: shared_rel_pos_bias= / shared_rel_pos= / attn_mask=
    "beit_shared": BlockLayout(
        partial(build, Beit, use_abs_pos_emb=False, use_shared_rel_pos_bias=True, init_values=0.5),
        lambda b: b.gamma_1,
        lambda b: b.gamma_2,
    ),
    "beit_relpos": BlockLayout(BUILDERS["beit_relpos_layerscale"], lambda b: b.gamma_1, lambda b: b.gamma_2),
    "vit_relpos_shared": BlockLayout(BUILDERS["vit_relpos_shared_cls"], lambda b: b.ls1.gamma, lambda b: b.ls2.gamma),
    "naflexvit": BlockLayout(partial(build, NaFlexVit, init_values=0.5), lambda b: b.ls1.gamma, lambda b: b.ls2.gamma),
    "naflexvit_eva_rope": BlockLayout(
        partial(build, NaFlexVit, rope_type="axial", init_values=0.5), lambda b: b.gamma_1, lambda b: b.gamma_2
    ),
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
        x_tilde = x_hat + F.silu(x_hat @ w.slots()[0].up.weight.T) @ w.slots()[0].down.weight.T
        attn = w.base_layer(x_tilde, **kw)  # the host's own attention (and RoPE for Eva), fed x~
        skip = x_tilde @ w.slots()[1].proj.weight.T
        h = x + layout.gamma1(blk) * (attn + skip)
        expected = h + layout.gamma2(blk) * blk.mlp(blk.norm2(h))
        torch.testing.assert_close(seen["out"], expected, atol=1e-6, rtol=1e-5)
        # the same with the skip outside LayerScale does not match: the check above can fail
        h_out = x + layout.gamma1(blk) * attn + skip
        wrong = h_out + layout.gamma2(blk) * blk.mlp(blk.norm2(h_out))
        assert not torch.allclose(seen["out"], wrong, atol=1e-4)


def _skip_only_branch(model, blk, inputs: tuple) -> tuple[torch.Tensor, torch.Tensor]:
    """Zero `blk`'s attention output projection (its branch is then the skip alone), run one train-mode
    forward at seed 0 and return (the block's input, what its norm2 receives = input + dropped branch)."""
    with torch.no_grad():
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
        model(*inputs)
    for hook in hooks:
        hook.remove()
    return seen["x"], seen["h"]


@pytest.mark.parametrize("cls", [VisionTransformer, Eva], ids=["vit", "eva"])
def test_drop_path_drops_the_skip_with_attention(cls):
    """In train mode a dropped attention path drops the skip too (per sample), a kept one rescales it."""
    model = build(cls, drop_path_rate=0.5, **({"use_rot_pos_emb": True} if cls is Eva else {}))
    mmpreproj.inject(model, PreProjConfig(init="identity", skip_init_std=0.1))
    blk = model.blocks[1]  # timm's drop-path schedule: block 0 gets 0, block 1 gets the full rate
    keep = 1 - blk.drop_path1.drop_prob
    x, h = _skip_only_branch(model, blk, images(batch=16))
    skip = blk.attn.slots()[1](blk.norm1(x)).detach()
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
    mmpreproj.load_adapter(net, tmp_path, is_trainable=True)
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


# Beit, NaFlexVit and RelPos call `checkpoint(blk, x, shared_rel_pos_bias=... | rope=... | shared_rel_pos=...)`,
# which torch refuses in reentrant mode ("Unexpected keyword arguments") with or without mmpreproj
REENTRANT = ["vit", "vit_sam_relpos_padded"]


def _reentrant_backward_reaches_the_adapter(name: str, check=None) -> None:
    """Case `name`, checkpointed reentrantly with the base frozen: every injected weight gets a gradient.
    `check(model)` runs first, on the checkpointed model."""
    case = next(c for c in CASES if c.id == name)
    model = _perturbed(case.build()).train()
    model.set_grad_checkpointing(True)
    if check is not None:
        check(model)
    before = use_reentrant_ckpt()
    set_reentrant_ckpt(True)
    try:
        run(case, model).square().mean().backward()
    finally:
        set_reentrant_ckpt(before)
    for n, p in injected_params(model).items():
        assert p.grad is not None and p.grad.abs().sum() > 0, f"no gradient for {n}"


@pytest.mark.parametrize("name", REENTRANT)
def test_reentrant_checkpointing_gets_gradients_with_frozen_base(name):
    """The row's `input_embeddings` (patch_embed; NaFlexVit's embeds) makes the block input require grad while
    timm's checkpointing is on and reentrant (the hook reads those switches; see tests/test_precision.py)."""
    _reentrant_backward_reaches_the_adapter(name)


def test_a_timm_without_use_reentrant_ckpt_counts_as_reentrant(monkeypatch):
    """timm < 1.0.13 has no `use_reentrant_ckpt` (its checkpoint calls took torch's default, reentrant): the
    checkpointing switch reads that as reentrant, and the frozen-base model still gets gradients (it raised an
    AttributeError at the first forward there)."""
    import timm.layers

    monkeypatch.delattr(timm.layers, "use_reentrant_ckpt")

    def reads_reentrant(model):
        assert reentrant_checkpointing(model, "timm") and reentrant_checkpointing(model, "any")

    _reentrant_backward_reaches_the_adapter("vit", reads_reentrant)


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


# --- SAM: windowed attention on a zero-padded grid ----------------------------------------------------


@pytest.mark.parametrize("index", [0, 1], ids=["windowed_padded", "global"])
def test_sam_skip_joins_attention_output_before_unwindowing(index):
    """SAM block output == x + unwindow(ls1(attn(window(x~)))) + ls1(W_skip·x~), from raw weights, where
    x~ = PreProj(norm1(x)) on the un-windowed 5x5 grid (block 0: 2x2 windows, zero-padded to 6x6)."""
    model = BUILDERS["vit_sam_relpos_padded"]()
    with torch.no_grad():
        for blk in model.blocks:
            blk.ls1.gamma.uniform_(0.2, 2.0)
    mmpreproj.inject(model, PreProjConfig(skip_init_std=0.05))
    blk = model.blocks[index]
    w = blk.attn
    seen = {}
    hooks = [
        blk.register_forward_pre_hook(lambda m, a: seen.update(x=a[0])),
        blk.norm2.register_forward_pre_hook(lambda m, a: seen.update(h=a[0])),
        w.base_layer.register_forward_pre_hook(lambda m, a: seen.update(attn_in=a[0])),
    ]
    with torch.no_grad():
        model(*sam_images())
        for h in hooks:
            h.remove()
        x = seen["x"]  # (B, 5, 5, d)
        B, H, W, d = x.shape
        ws = blk.window_size
        assert (index, ws, H) in ((0, 2, 5), (1, 0, 5))
        n1 = blk.norm1
        x_hat = F.layer_norm(x, n1.normalized_shape, n1.weight, n1.bias, n1.eps)
        x_tilde = x_hat + F.silu(x_hat @ w.slots()[0].up.weight.T) @ w.slots()[0].down.weight.T
        # what the attention receives: the windowed x~ (pre-projection commutes with windowing, pads stay 0)
        w_tilde, pad_hw = window_partition(x_tilde, ws) if ws else (x_tilde, None)
        torch.testing.assert_close(seen["attn_in"], w_tilde, atol=1e-6, rtol=1e-5)
        if ws:
            assert pad_hw == (6, 6) and seen["attn_in"].shape == (B * 9, 2, 2, d)
            pad = window_partition(torch.ones(B, H, W, 1), ws)[0] == 0  # padded positions, windowed
            assert pad.any() and seen["attn_in"].masked_select(pad).abs().max() == 0
        attn = w.base_layer(w_tilde)
        attn = window_unpartition(blk.ls1(attn), ws, (H, W), pad_hw) if ws else blk.ls1(attn)
        gamma = blk.ls1.gamma
        h = x + attn + gamma * (x_tilde @ w.slots()[1].proj.weight.T)  # the skip on the un-windowed grid
        torch.testing.assert_close(seen["h"], h.reshape(B, H * W, d), atol=1e-6, rtol=1e-5)
        # the skip outside LayerScale does not match: the check above can fail
        wrong = x + attn + x_tilde @ w.slots()[1].proj.weight.T
        assert not torch.allclose(seen["h"], wrong.reshape(B, H * W, d), atol=1e-4)


def test_sam_drop_path_drops_the_skip_with_its_window():
    """timm's SAM drop-path draws per window (dim 0 of the windowed tensor); the skip goes with its window."""
    model = sam(use_rel_pos=True, drop_path_rate=0.5, global_attn_indexes=(0,))
    mmpreproj.inject(model, PreProjConfig(init="identity", skip_init_std=0.1))
    blk = model.blocks[1]  # windowed; timm's drop-path schedule gives block 0 rate 0, block 1 the full rate
    assert blk.window_size == 2
    keep = 1 - blk.drop_path1.drop_prob
    x, h = _skip_only_branch(model, blk, sam_images(batch=4))
    B, H, W, d = x.shape
    skip = blk.ls1(blk.attn.slots()[1](blk.norm1(x))).detach()  # identity pre-projection: x~ = norm1(x)
    delta = h.reshape(B, H, W, d) - x
    win = window_partition(delta, 2)[0].flatten(1)  # (B*9, 2*2*d); padded slots are 0
    skip_win = window_partition(skip, 2)[0].flatten(1)
    real = window_partition(torch.ones(B, H, W, 1), 2)[0].flatten(1).repeat_interleave(d, 1) > 0
    dropped = win.abs().amax(1) == 0
    assert 0 < dropped.sum() < len(dropped), "expected both dropped and kept windows"
    torch.testing.assert_close(
        win[~dropped][real[~dropped]], (skip_win / keep)[~dropped][real[~dropped]], atol=1e-6, rtol=1e-5
    )
    assert skip_win[dropped].abs().amax() > 0  # the skip was there to drop


# --- NaFlex: padded patches stay masked -----------------------------------------------------------------


def test_naflex_padding_is_still_masked():
    """With the modules trained away from identity, padded patches still do not reach the output."""
    model = _perturbed(BUILDERS["naflexvit_rope_masked"]())
    patches, coord, valid = naflex_batch()
    noisy = patches.clone()
    noisy[~valid] = torch.randn(int((~valid).sum()), patches.shape[-1])
    with torch.no_grad():
        out = model(patches, coord, valid)
        torch.testing.assert_close(model(noisy, coord, valid), out, atol=1e-6, rtol=0)
        with mmpreproj.adapter_disabled(model):
            assert not torch.allclose(model(patches, coord, valid), out, atol=1e-4)  # the modules act


VARIANTS = {
    "beit_shared_relpos_no_layerscale": (
        partial(build, Beit, use_abs_pos_emb=False, use_shared_rel_pos_bias=True),
        images,
    ),
    "naflexvit_standard_images": (partial(build, NaFlexVit), images),
    "naflexvit_mixed_rope_naflex": (partial(build, NaFlexVit, rope_type="mixed"), naflex_batch),
    "vit_relpos_mlp_bias": (partial(build, VisionTransformerRelPos, init_values=0.5, rel_pos_type="mlp"), images),
    "vit_sam_rope": (partial(sam, use_rope=True, use_abs_pos=False), sam_images),
}


@pytest.mark.parametrize("name", VARIANTS, ids=VARIANTS.keys())
def test_near_miss_variants_inject_at_identity(name):
    """Other configurations of the new rows: identity init leaves the fp64 model unchanged."""
    builder, inputs = VARIANTS[name]
    model = builder().double()
    x = tuple(t.double() if t.is_floating_point() else t for t in inputs())
    with torch.no_grad():
        ref = model(*x)
        mmpreproj.inject(model, IDENTITY)
        assert len(mmpreproj.injected_modules(model)) == len(model.blocks)
        torch.testing.assert_close(model(*x), ref, atol=1e-6, rtol=0)


# --- rejected near misses -------------------------------------------------------------------------------

NEAR_MISS_REJECTED = {
    "ResPostRelPosBlock": (partial(build, VisionTransformerRelPos, block_fn=ResPostRelPosBlock), "RelPosBlock"),
    "ResPostBlock": (partial(build, NaFlexVit, block_fn=ResPostBlock), "EvaBlock"),
    "ParallelScalingBlock": (partial(build, NaFlexVit, block_fn=ParallelScalingBlock), "EvaBlock"),
}


@pytest.mark.parametrize("block", NEAR_MISS_REJECTED, ids=NEAR_MISS_REJECTED.keys())
def test_near_miss_blocks_are_rejected_with_the_nearest_form(block):
    builder, nearest = NEAR_MISS_REJECTED[block]
    model = builder()
    before = snapshot(model)
    with pytest.raises(ValueError, match=f"is a {block};.*{nearest}"):
        mmpreproj.inject(model)
    assert_same_snapshot(snapshot(model), before)
