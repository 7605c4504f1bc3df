"""`add_rope` / `remove_rope` on tiny timm ViT and Eva models built in code (pretrained=False, no downloads)."""

from __future__ import annotations

import itertools

import pytest
import torch
from timm.models.eva import Eva
from timm.models.vision_transformer import VisionTransformer

import mmpreproj
from mmpreproj.rope import RoPE1D, RoPE2D
from mmpreproj.timm_rope import RotaryAttention, add_rope, has_rope, remove_rope, rope_from_timm
from tests.helpers.adapter_json import load_desc

IDENTITY = mmpreproj.PreProjConfig(init="identity", skip_init_std=0)


@torch.no_grad()
def sharpen(model):
    """Scale q/k/v weights x15 so attention is far from uniform and positions matter (random init: ~uniform)."""
    for block in model.blocks:
        for name in ("qkv", "q_proj", "k_proj"):
            if getattr(block.attn, name, None) is not None:
                getattr(block.attn, name).weight.mul_(15.0)
    return model


def tiny_vit(seed: int = 0, **kw) -> VisionTransformer:
    torch.manual_seed(seed)
    args = dict(
        img_size=(32, 48),
        patch_size=8,
        embed_dim=32,
        depth=2,
        num_heads=2,
        num_classes=5,
        dynamic_img_size=True,
        reg_tokens=1,
    )
    args.update(kw)
    return sharpen(VisionTransformer(**args).eval())


def image(h: int = 32, w: int = 48, seed: int = 1) -> torch.Tensor:
    return torch.randn(2, 3, h, w, generator=torch.Generator().manual_seed(seed))


def feats(model, x: torch.Tensor) -> torch.Tensor:
    """Normed tokens (B, P + h*w, C): O(1) values, unlike the tiny logits of a freshly initialised head."""
    return model.forward_features(x)


def capture_rope(model):
    """Forward hook on the shared rope of block 0: (q, k) in, (q2, k2) out."""
    seen = {}
    rope = model.blocks[0].attn.rope

    def hook(module, args, kwargs, out):
        if "q" not in seen:
            seen["q"], seen["k"], seen["q2"], seen["k2"] = args[0], args[1], out[0], out[1]

    return seen, rope.register_forward_hook(hook, with_kwargs=True)


@pytest.mark.parametrize(
    "kw", [{}, {"qk_norm": True, "class_token": False, "reg_tokens": 0, "global_pool": "avg", "init_values": 0.1}]
)
def test_zero_positions_reproduce_the_host_exactly(kw):
    # rotation by angle 0 is the identity: our forward_features and RotaryAttention compute what timm computes
    model = tiny_vit(**kw)
    ref = feats(model, image())
    add_rope(model, positions=lambda h, w, device=None: torch.zeros(h * w, 2))
    torch.testing.assert_close(feats(model, image()), ref, atol=1e-6, rtol=0)


def test_prefix_tokens_unrotated_patch_tokens_rotated_on_non_square_grid():
    model = add_rope(tiny_vit())  # class token + 1 register token
    seen, handle = capture_rope(model)
    out = model(image(32, 48))
    handle.remove()
    assert out.shape == (2, 5)
    npt = model.num_prefix_tokens
    assert npt == 2 and seen["q"].shape[2] == npt + 4 * 6
    assert torch.equal(seen["q2"][:, :, :npt], seen["q"][:, :, :npt])
    assert torch.equal(seen["k2"][:, :, :npt], seen["k"][:, :, :npt])
    assert not torch.allclose(seen["q2"][:, :, npt + 1 :], seen["q"][:, :, npt + 1 :])


@pytest.mark.parametrize("hw", [(32, 48), (40, 24)])
def test_patch_scores_depend_only_on_the_displacement(hw):
    # constant image, no absolute table: all patch tokens enter block 0 alike, so after our rotation the
    # q.k scores depend only on the (row, column) displacement of the actual (non-square) grid
    model = add_rope(tiny_vit(), keep_abs_pos=False)
    seen, handle = capture_rope(model)
    model(torch.ones(1, 3, *hw))
    handle.remove()
    h, w = hw[0] // 8, hw[1] // 8
    npt = model.num_prefix_tokens
    q, k = seen["q2"][0, :, npt:], seen["k2"][0, :, npt:]  # (H, h*w, D)
    scores = q @ k.transpose(-1, -2)  # (H, h*w, h*w)
    groups: dict[tuple[int, int], list[torch.Tensor]] = {}
    for i, j in itertools.product(range(h * w), repeat=2):
        groups.setdefault((j // w - i // w, j % w - i % w), []).append(scores[:, i, j])
    spreads = [torch.stack(v).std(0).max().item() for v in groups.values() if len(v) > 1]
    assert max(spreads) < 1e-4
    assert torch.stack([v[0] for v in groups.values()]).std(0).max() > 1e-2  # and the scores do vary


def test_identity_injection_on_top_changes_nothing_and_everything_undoes():
    model = tiny_vit()
    base = feats(model, image())
    add_rope(model)
    roped = feats(model, image())
    assert not torch.allclose(roped, base)
    mmpreproj.inject(model, IDENTITY)
    assert len(mmpreproj.injected_modules(model)) == 2
    torch.testing.assert_close(feats(model, image()), roped, atol=1e-6, rtol=0)
    # inject wrapped the rotary attention; the pre-projection feeds it
    assert isinstance(model.blocks[0].attn.base_layer, RotaryAttention)
    remove_rope(model)  # under the injection
    assert not has_rope(model) and not isinstance(model.blocks[0].attn.base_layer, RotaryAttention)
    torch.testing.assert_close(feats(model, image()), base, atol=1e-6, rtol=0)
    mmpreproj.unload(model)
    assert torch.equal(feats(model, image()), base)


def test_rope_added_after_injection_survives_unload():
    model = tiny_vit()
    mmpreproj.inject(model, IDENTITY)
    add_rope(model, keep_abs_pos=False)
    roped = feats(model, image())
    mmpreproj.unload(model)
    assert isinstance(model.blocks[1].attn, RotaryAttention)
    torch.testing.assert_close(feats(model, image()), roped, atol=1e-6, rtol=0)


def test_remove_rope_restores_modules_table_and_forward():
    model = tiny_vit()
    table = model.pos_embed
    keys = set(model.state_dict())
    ref = feats(model, image())
    add_rope(model, keep_abs_pos=False)
    assert model.pos_embed is None and "pos_embed" not in model.state_dict()
    remove_rope(model)
    assert model.pos_embed is table and set(model.state_dict()) == keys
    assert "forward_features" not in vars(model)
    assert torch.equal(feats(model, image()), ref)


def test_all_parameters_train_and_bad_calls_leave_the_model_untouched():
    model = add_rope(tiny_vit(), keep_abs_pos=False).train()
    model(image()).square().mean().backward()
    for n, p in model.named_parameters():
        assert p.grad is not None, f"no gradient for {n}"
    plain = tiny_vit()
    before = [(n, id(m)) for n, m in plain.named_modules()]
    with pytest.raises(ValueError, match="head_dim"):
        add_rope(plain, RoPE2D(8))
    head_dim = plain.blocks[0].attn.head_dim
    with pytest.raises(ValueError, match=r"RoPE1D has num_axes=1, but positions \(GridPositions\) give 2 per patch"):
        add_rope(plain, RoPE1D(head_dim))  # refused at once, not at the first forward (an independent audit's case)
    assert [(n, id(m)) for n, m in plain.named_modules()] == before and not has_rope(plain)
    add_rope(plain)
    with pytest.raises(RuntimeError, match="already"):
        add_rope(plain)


def tiny_eva(grid_indexing: str, rotate_half: bool, ref_feat_shape, **kw) -> Eva:
    torch.manual_seed(0)
    return sharpen(
        Eva(
            img_size=(32, 48),
            patch_size=8,
            embed_dim=32,
            depth=2,
            num_heads=2,
            num_classes=5,
            dynamic_img_size=True,
            use_rot_pos_emb=True,
            rope_temperature=10000.0,
            rope_grid_indexing=grid_indexing,
            rope_rotate_half=rotate_half,
            ref_feat_shape=ref_feat_shape,
            num_reg_tokens=1,
            **kw,
        ).eval()
    )


@pytest.mark.parametrize(
    "grid_indexing, rotate_half, ref_feat_shape, kw",
    [("ij", False, None, {}), ("xy", False, (6, 4), {}), ("ij", True, (4, 4), {"qkv_fused": False})],
)
def test_eva_rope_replaced_by_ours_reproduces_eva(grid_indexing, rotate_half, ref_feat_shape, kw):
    model = tiny_eva(grid_indexing, rotate_half, ref_feat_shape, **kw)
    sizes = [(32, 48), (24, 40)]
    refs = [feats(model, image(*s)) for s in sizes]
    rope, positions = rope_from_timm(model.rope)
    add_rope(model, rope, positions=positions)
    assert all(isinstance(b.attn, RotaryAttention) for b in model.blocks)
    for s, ref in zip(sizes, refs):
        torch.testing.assert_close(feats(model, image(*s)), ref, atol=1e-5, rtol=0)
    # wrong settings do not match: this test can fail
    model_bad = add_rope(tiny_eva(grid_indexing, rotate_half, ref_feat_shape, **kw), RoPE2D(16, theta=100.0))
    assert (feats(model_bad, image()) - refs[0]).abs().max() > 1e-2
    remove_rope(model)
    assert type(model.rope).__name__ == "RotaryEmbeddingCat"
    assert torch.equal(feats(model, image()), refs[0])


# ---- add_rope positions saved with the adapter: restored on load, or the load refused ---------------------
TRAINED = mmpreproj.PreProjConfig(skip_init_std=0.05)  # a skip large enough to change the outputs


def _saved(tmp_path, model):
    mmpreproj.inject(model, TRAINED)
    mmpreproj.save_adapter(model, tmp_path / "adapter")
    return tmp_path / "adapter", load_desc(tmp_path / "adapter" / "adapter_config.json")


@pytest.mark.parametrize("keep_abs_pos", [True, False])
def test_adapter_round_trip_restores_add_rope(tmp_path, keep_abs_pos):
    model = add_rope(tiny_vit(), RoPE2D(16, theta=50.0), keep_abs_pos=keep_abs_pos)
    path, desc = _saved(tmp_path, model)
    ref = feats(model, image())
    assert desc["rope"] == {
        "kind": "vit",
        "abs_pos_removed": not keep_abs_pos,
        "rope": {"class": "RoPE2D", "head_dim": 16, "theta": 50.0, "pairing": "interleaved"},
        "positions": {"class": "GridPositions", "ref_shape": None, "offset": 0.0, "xy": False},
    }
    plain = tiny_vit()
    mmpreproj.load_adapter(plain, path)
    assert has_rope(plain) and (plain.pos_embed is None) == (not keep_abs_pos)
    assert torch.equal(feats(plain, image()), ref)
    # without the restore the reloaded model would differ: the rope is what makes them equal
    remove_rope(plain)
    assert (feats(plain, image()) - ref).abs().max() > 1e-2


def test_adapter_round_trip_restores_eva_rope_from_timm(tmp_path):
    model = tiny_eva("xy", False, (6, 4))
    rope, positions = rope_from_timm(model.rope)
    add_rope(model, rope, positions=positions)
    path, desc = _saved(tmp_path, model)
    assert desc["rope"]["kind"] == "eva" and desc["rope"]["positions"]["ref_shape"] == [6, 4]
    plain = tiny_eva("xy", False, (6, 4))
    mmpreproj.load_adapter(plain, path)
    assert type(plain.rope).__name__ == "EvaPositions"
    for size in ((32, 48), (24, 40)):
        assert torch.equal(feats(plain, image(*size)), feats(model, image(*size)))


def test_adapter_load_refuses_positions_it_cannot_rebuild_or_that_differ(tmp_path):
    def zeros(h, w, device=None):
        return torch.zeros(h * w, 2, device=device)

    path, _ = _saved(tmp_path, add_rope(tiny_vit(), positions=zeros))
    plain = tiny_vit()
    before = [(n, id(m)) for n, m in plain.named_modules()]
    with pytest.raises(ValueError, match=r"cannot rebuild: call mmpreproj\.timm_rope\.add_rope\(model, rope"):
        mmpreproj.load_adapter(plain, path)
    assert [(n, id(m)) for n, m in plain.named_modules()] == before  # untouched: no rope, no injection
    assert not has_rope(plain) and not mmpreproj.is_injected(plain)
    mmpreproj.load_adapter(add_rope(plain, positions=zeros), path)  # as the message says: the same call first
    assert mmpreproj.is_injected(plain)

    other = add_rope(tiny_vit(), RoPE2D(16, theta=10.0))  # theta 100 was saved
    with pytest.raises(ValueError, match="this model has"):
        mmpreproj.load_adapter(other, _saved(tmp_path / "b", add_rope(tiny_vit()))[0])
    assert not mmpreproj.is_injected(other)

    no_rope_path, desc = _saved(tmp_path / "c", tiny_vit())
    assert "rope" not in desc
    with pytest.raises(ValueError, match=r"without add_rope positions.*remove_rope\(model\) first"):
        mmpreproj.load_adapter(add_rope(tiny_vit()), no_rope_path)
