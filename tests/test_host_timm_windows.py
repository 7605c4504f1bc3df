"""timm window-attention hosts (rows `timm_swin`, `timm_maxvit`): the shared contract, a hand check from raw
weights of what each attention receives (the windows of the pre-projected tokens; Swin's zero pads and
shifted windows) and of where the skip joins, stages of different widths, and the MaxxVit attention
blocks that must be refused (channels-first, CoAtNet, MaxxViT-V2's parallel block).

Each tiny model is built once per module (`host_contract.build_once`) and handed out as a deep copy."""

from __future__ import annotations

import pytest
import timm
import torch
import torch.nn.functional as F
from timm.models import maxxvit
from timm.models._features import FeatureListNet
from timm.models.maxxvit import MaxxVit, MaxxVitCfg, MaxxVitConvCfg, MaxxVitTransformerCfg
from timm.models.swin_transformer import SwinTransformer, window_partition, window_reverse

import mmpreproj
from mmpreproj import PreProjAttention, PreProjConfig
from mmpreproj.hosts import find_host
from tests.helpers.host_contract import IDENTITY, HostCase, HostContract, build_once, run
from tests.helpers.snapshots import assert_same_snapshot, snapshot


def swin(width=64, depth=2, seed=0, window_size=4, **kw):
    """One stage on a 6x6 patch grid with 4x4 windows: padded to 8x8; block 1 is shifted by 2."""
    torch.manual_seed(seed)
    return SwinTransformer(
        img_size=24,
        patch_size=4,
        window_size=window_size,
        embed_dim=width,
        depths=(depth,),
        num_heads=(4,),
        num_classes=10,
        **kw,
    ).eval()


def swin_images(batch=2, seed=1):
    return (torch.randn(batch, 3, 24, 24, generator=torch.Generator().manual_seed(seed)),)


def maxvit(width=64, depth=2, seed=0, embed_dim=None, depths=None, block_type=("M",), **tcfg):
    """MaxViT on an 8x8 grid after the stem and one stride-2 stage: 4x4 block windows and a 4x4 grid."""
    torch.manual_seed(seed)
    embed_dim, depths = embed_dim or (width,), depths or (depth,)
    cfg = MaxxVitCfg(
        embed_dim=embed_dim,
        depths=depths,
        block_type=block_type * len(depths),
        stem_width=16,
        conv_cfg=MaxxVitConvCfg(expand_ratio=2.0),
        transformer_cfg=MaxxVitTransformerCfg(dim_head=16, window_size=(4, 4), grid_size=(4, 4), **tcfg),
    )
    return MaxxVit(cfg, img_size=32, num_classes=10).eval()


def images(batch=2, seed=1):
    return (torch.randn(batch, 3, 32, 32, generator=torch.Generator().manual_seed(seed)),)


CASES = [
    HostCase("swin_padded_shifted", "timm_swin", build_once(swin), swin_images),
    HostCase("maxvit_block_grid", "timm_maxvit", build_once(maxvit), images),
]


@pytest.fixture(params=CASES, ids=[c.id for c in CASES])
def case(request):
    return request.param


class TestContract(HostContract):
    pass


def _x_tilde(norm: torch.nn.LayerNorm, w: PreProjAttention, x: torch.Tensor) -> torch.Tensor:
    """x~ = PreProj(norm(x)) from raw weights, on the token grid (..., d)."""
    x_hat = F.layer_norm(x, norm.normalized_shape, norm.weight, norm.bias, norm.eps)
    return x_hat + F.silu(x_hat @ w.slots()[0].up.weight.T) @ w.slots()[0].down.weight.T


def _seen(model, blk, inputs: tuple) -> dict:
    """One forward: the block's input `x`, what norm2 receives `h` and what the host attention receives."""
    seen = {}
    hooks = [
        blk.register_forward_pre_hook(lambda m, a: seen.update(x=a[0])),
        blk.norm2.register_forward_pre_hook(lambda m, a: seen.update(h=a[0])),
        blk.attn.base_layer.register_forward_pre_hook(lambda m, a: seen.update(attn_in=a[0])),
    ]
    with torch.no_grad():
        model(*inputs)
    for hook in hooks:
        hook.remove()
    return seen


@pytest.mark.parametrize("index", [0, 1], ids=["padded", "padded_shifted"])
def test_swin_attention_receives_the_windows_of_the_pre_projected_tokens(index):
    """attention input == windows(pad(roll(x~))), pads exactly 0; norm2 input == x + un-windowed attention
    output + W_skip·x~ on the 6x6 grid, from raw weights."""
    model = swin()
    mmpreproj.inject(model, PreProjConfig(skip_init_std=0.05))
    blk = model.layers[0].blocks[index]
    w = blk.attn
    seen = _seen(model, blk, swin_images())
    with torch.no_grad():
        x = seen["x"]  # (B, 6, 6, d)
        B, H, W, d = x.shape
        ws, shift = blk.window_size, blk.shift_size
        assert (H, ws, shift) == (6, (4, 4), ((0, 0), (2, 2))[index])
        x_tilde = _x_tilde(blk.norm1, w, x)
        shifted = torch.roll(x_tilde, shifts=(-shift[0], -shift[1]), dims=(1, 2))
        padded = F.pad(shifted, (0, 0, 0, 2, 0, 2))  # (B, 8, 8, d)
        windows = window_partition(padded, ws).view(-1, 16, d)  # (B*4, 16, d)
        torch.testing.assert_close(seen["attn_in"], windows, atol=1e-6, rtol=1e-5)
        pad = window_partition(F.pad(torch.ones(B, H, W, 1), (0, 0, 0, 2, 0, 2)), ws).view(-1, 16, 1) == 0
        assert pad.any() and seen["attn_in"].masked_select(pad).abs().max() == 0
        attn = w.base_layer(windows, mask=blk.attn_mask).view(-1, *ws, d)
        attn = torch.roll(window_reverse(attn, ws, 8, 8)[:, :H, :W], shifts=shift, dims=(1, 2))
        h = x + attn + x_tilde @ w.slots()[1].proj.weight.T
        torch.testing.assert_close(seen["h"], h.reshape(B, H * W, d), atol=1e-6, rtol=1e-5)
        assert not torch.allclose(seen["h"], (x + attn).reshape(B, H * W, d), atol=1e-4)  # the skip is there


@pytest.mark.parametrize("part", ["attn_block", "attn_grid"])
def test_maxvit_attention_receives_the_partitions_of_the_pre_projected_tokens(part):
    """attention input == window/grid partition of x~; norm2 input == x + ls1(reverse(attn)) + ls1(W_skip·x~)."""
    model = maxvit(init_values=0.5)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, maxxvit.PartitionAttentionCl):
                m.ls1.gamma.uniform_(0.2, 2.0)
    mmpreproj.inject(model, PreProjConfig(skip_init_std=0.05))
    blk = getattr(model.stages[0].blocks[0], part)
    w = blk.attn
    seen = _seen(model, blk, images())
    with torch.no_grad():
        x = seen["x"]  # (B, 8, 8, d)
        B, H, W, d = x.shape
        x_tilde = _x_tilde(blk.norm1, w, x)
        p = list(blk.partition_size)
        split, merge = (
            (maxxvit.window_partition, maxxvit.window_reverse)
            if part == "attn_block"
            else (maxxvit.grid_partition, maxxvit.grid_reverse)
        )
        parts = split(x_tilde, p)  # (B*4, 4, 4, d)
        torch.testing.assert_close(seen["attn_in"], parts, atol=1e-6, rtol=1e-5)
        other = (maxxvit.grid_partition if part == "attn_block" else maxxvit.window_partition)(x_tilde, p)
        assert not torch.allclose(seen["attn_in"], other, atol=1e-4)  # block and grid differ on this grid
        attn = merge(w.base_layer(parts), p, (H, W))
        h = x + blk.ls1(attn) + blk.ls1(x_tilde @ w.slots()[1].proj.weight.T)
        torch.testing.assert_close(seen["h"], h, atol=1e-6, rtol=1e-5)
        wrong = x + blk.ls1(attn) + x_tilde @ w.slots()[1].proj.weight.T  # the skip outside LayerScale
        assert not torch.allclose(seen["h"], wrong, atol=1e-4)


def _two_stage(name: str):
    if name == "swin":
        torch.manual_seed(0)
        return timm.create_model(
            "swin_tiny_patch4_window7_224",
            pretrained=False,
            img_size=32,
            embed_dim=16,
            depths=(1, 1),
            num_heads=(2, 2),
            window_size=4,
            num_classes=10,
        ).eval()
    return maxvit(embed_dim=(16, 32), depths=(1, 1))


@pytest.mark.parametrize("name", ["swin", "maxvit"])
def test_stages_of_different_widths_inject_and_reload(name, tmp_path):
    model = _two_stage(name).double()
    (x,) = images()
    x = x.double()
    with torch.no_grad():
        ref = model(x)
        mmpreproj.inject(model, IDENTITY)
        torch.testing.assert_close(model(x), ref, atol=1e-9, rtol=0)
    widths = sorted({m.slots()[0].dim for m in mmpreproj.injected_modules(model)})
    assert widths == [16, 32]
    with torch.no_grad():
        for n, p in model.named_parameters():
            if ".preproj." in n or ".preproj_skip." in n:
                p.normal_(std=0.05)
        out = model(x)
    assert not torch.allclose(out, ref, atol=1e-4)
    mmpreproj.save_adapter(model, tmp_path)
    fresh = _two_stage(name).double()
    mmpreproj.load_adapter(fresh, tmp_path)
    with torch.no_grad():
        torch.testing.assert_close(fresh(x), out, atol=1e-9, rtol=0)


REFUSED = {
    "PartitionAttention2d": lambda: maxvit(use_nchw_attn=True),
    "TransformerBlock2d": lambda: maxvit(block_type=("T",)),
    "ParallelPartitionAttention": lambda: maxvit(block_type=("PM",)),
}


@pytest.mark.parametrize("block", REFUSED, ids=REFUSED.keys())
def test_maxxvit_without_a_token_wise_seam_is_refused_untouched(block):
    model = REFUSED[block]()
    assert find_host(model).name == "timm_maxvit"
    before = snapshot(model)
    with pytest.raises(ValueError, match=f"is a {block}: .*PartitionAttentionCl"):
        mmpreproj.inject(model)
    assert_same_snapshot(snapshot(model), before)


def test_rows_are_found_for_the_one_call():
    """The one call picks each row; the injected modules sit on every window attention."""
    for case, count in zip(CASES, (2, 4)):  # swin: one per block; maxvit: block + grid per block
        model = case.build()
        mmpreproj.inject(model)
        assert len(mmpreproj.injected_modules(model)) == count
        run(case, model)


def _features(model):
    """timm's `features_only=True` wrapper (what `create_model` builds) around a tiny model: its children,
    flattened."""
    return FeatureListNet(model, out_indices=tuple(range(len(model.feature_info))), flatten_sequential=True).eval()


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_features_only_net_takes_the_full_models_adapter(case, tmp_path):
    """A FeatureListNet holds the backbone's blocks in the same order: same row, the full model's adapter loads
    and gives the full model's intermediates (MaxViT's first feature is the stem's, untouched)."""
    full = case.build()
    mmpreproj.inject(full)
    with torch.no_grad():
        for n, p in full.named_parameters():
            if ".preproj." in n or ".preproj_skip." in n:
                p.normal_(std=0.05)
    mmpreproj.save_adapter(full, tmp_path)
    net = _features(case.build())
    assert find_host(net).name == case.host
    (x,) = case.inputs()
    with torch.no_grad():
        ref = net(x)
        mmpreproj.load_adapter(net, tmp_path)
        got = net(x)
        want = full.forward_intermediates(x, intermediates_only=True)
    for a, b in zip(got, want, strict=True):  # Swin's stages give NHWC, forward_intermediates NCHW
        torch.testing.assert_close(a, b if a.shape == b.shape else b.permute(0, 2, 3, 1), atol=1e-6, rtol=0)
    assert not torch.allclose(got[-1], ref[-1], atol=1e-4)  # the last stage's attention is injected


def test_features_only_coatnet_is_refused_with_the_reason():
    model = _features(maxvit(block_type=("T",)))
    before = snapshot(model)
    with pytest.raises(ValueError, match="is a TransformerBlock2d: "):
        mmpreproj.inject(model)
    assert_same_snapshot(snapshot(model), before)


VARIANTS = {  # other configurations of the rows (MaxxViT-V2's registered models: grid attention only)
    "maxvit_grid_only": (lambda: maxvit(no_block_attn=True), images, 2),
    "maxvit_rel_pos_mlp": (lambda: maxvit(rel_pos_type="mlp"), images, 4),
    "swin_one_window_no_pad_no_shift": (lambda: swin(window_size=6), swin_images, 2),
}


@pytest.mark.parametrize("name", VARIANTS, ids=VARIANTS.keys())
def test_variants_inject_at_identity(name):
    builder, inputs, count = VARIANTS[name]
    model = builder().double()
    x = tuple(t.double() for t in inputs())
    with torch.no_grad():
        ref = model(*x)
        mmpreproj.inject(model, IDENTITY)
        assert len(mmpreproj.injected_modules(model)) == count
        torch.testing.assert_close(model(*x), ref, atol=1e-9, rtol=0)
