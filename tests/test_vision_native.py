"""Native ViT and VideoViT: one Block class for every modality, positions of every kind, any grid size."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import mmpreproj
from mmpreproj.models import PatchEmbed, VideoViT, ViT, parse_positions
from mmpreproj.modules import Block
from mmpreproj.rope import RoPE1D

IDENTITY = mmpreproj.PreProjConfig(init="identity", skip_init_std=0)


def vit(positions: str, **kw) -> ViT:
    torch.manual_seed(0)
    return ViT(img_size=16, patch_size=4, dim=32, depth=2, num_heads=2, positions=positions, **kw).eval()


def video_vit(positions: str = "rope3d", **kw) -> VideoViT:
    torch.manual_seed(0)
    return VideoViT(
        clip_size=(4, 16, 16), patch_size=4, tubelet=2, dim=32, depth=2, num_heads=2, positions=positions, **kw
    ).eval()


@pytest.mark.parametrize("positions", ["learned", "rope2d", "rope1d", "none", "learned+rope2d"])
@pytest.mark.parametrize("class_token", [True, False])
def test_vit_runs_any_size_and_every_parameter_trains(positions, class_token):
    model = vit(positions, class_token=class_token).train()
    for h, w in ((16, 16), (12, 20)):
        out = model(torch.randn(2, 3, h, w))
        assert out.shape == (2, 10) and torch.isfinite(out).all()
    model(torch.randn(2, 3, 16, 16)).square().mean().backward()
    for n, p in model.named_parameters():
        assert p.grad is not None, f"no gradient for {n}"


def test_positions_change_the_model_and_unknown_specs_fail():
    x = torch.randn(1, 3, 16, 16)
    outs = {p: vit(p).forward_features(x) for p in ("none", "rope2d", "rope1d")}
    assert not torch.allclose(outs["none"], outs["rope2d"]) and not torch.allclose(outs["rope2d"], outs["rope1d"])
    for bad in ("rope3d", "learned+rope1d+rope2d", "none+learned", "absolute"):
        with pytest.raises(ValueError, match="positions="):
            parse_positions(bad, 2)
    assert parse_positions("learned+rope3d", 3) == (True, "rope3d")


class TextDecoder(nn.Module):
    """A causal text stack: the same `Block`, with RoPE1D over token indices."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(32, 2, rope=RoPE1D(16), causal=True) for _ in range(2))

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x, pos=torch.arange(x.shape[1]))
        return x


def test_one_block_class_for_images_video_and_text_and_identity_injection():
    torch.manual_seed(0)
    cases = (
        (vit("rope2d"), torch.randn(2, 3, 16, 16)),
        (video_vit("rope3d"), torch.randn(2, 3, 4, 16, 16)),
        (TextDecoder().eval(), torch.randn(2, 7, 32)),
    )
    for model, x in cases:
        blocks = [m for m in model.modules() if isinstance(m, Block)]
        assert len(blocks) == 2 and all(type(b) is Block for b in blocks)
        ref = model.forward_features(x)
        mmpreproj.inject(model, IDENTITY)
        assert mmpreproj.hosts.find_host(model).name == "mmpreproj_block"
        assert len(mmpreproj.injected_modules(model)) == 2
        torch.testing.assert_close(model.forward_features(x), ref, atol=1e-6, rtol=0)
        mmpreproj.unload(model)


@pytest.mark.parametrize("positions", ["rope3d", "rope1d", "learned", "learned+rope3d"])
def test_video_vit_clips_of_other_lengths_and_sizes(positions):
    model = video_vit(positions)
    enc = model.encoder
    seen = []  # the positions every block's rope gets
    if enc.positions.rope is not None:
        enc.positions.rope.register_forward_pre_hook(lambda m, a: seen.append(a[2].clone()))
    reference = torch.randn(2, 3, 4, 16, 16, generator=torch.Generator().manual_seed(3))
    first = model(reference)
    for t, h, w in ((8, 16, 16), (6, 12, 20), (2, 8, 8)):
        grid = (t // 2, h // 4, w // 4)  # tubelet 2, patch 4
        seen.clear()
        out = model(torch.randn(2, 3, t, h, w))
        assert out.shape == (2, 2) and torch.isfinite(out).all()
        if enc.positions.kind == "rope3d":  # (t, row, column) of this clip's grid, t-major, in every block
            expected = [[i, r, c] for i in range(grid[0]) for r in range(grid[1]) for c in range(grid[2])]
            assert len(seen) == 2 and all(p.tolist() == expected for p in seen)
        elif enc.positions.kind == "rope1d":
            assert len(seen) == 2 and all(p.tolist() == list(range(grid[0] * grid[1] * grid[2])) for p in seen)
        if enc.positions.table is not None:  # resampled to this grid, and trilinear: within the table's range
            table, stored = enc.positions.table(grid), enc.positions.table.table
            assert table.shape == (grid[0] * grid[1] * grid[2], 32)
            lo, hi = stored.amin(dim=(0, 2, 3, 4)), stored.amax(dim=(0, 2, 3, 4))
            assert bool(((table >= lo - 1e-6) & (table <= hi + 1e-6)).all())
    # nothing of another clip size stays behind (cos/sin caches, resampled tables): the same output again
    assert torch.equal(model(reference), first)
    if enc.positions.table is not None:  # at the reference grid the stored table is used as it is
        assert torch.equal(enc.positions.table((2, 4, 4)), enc.positions.table.table[0].flatten(1).T)


def test_rope3d_scores_depend_only_on_the_displacement():
    # identical tubelets and no table: q.k of block 0 depends only on (dt, drow, dcol)
    model = video_vit("rope3d")
    with torch.no_grad():  # random init attends ~uniformly; sharpen it so a wrong position would show
        for block in model.encoder.blocks:
            block.attn.qkv.weight.mul_(15.0)
    seen = {}
    rope = model.encoder.blocks[0].attn.rope
    handle = rope.register_forward_hook(lambda m, a, out: seen.setdefault("qk", out))
    model(torch.ones(1, 3, 6, 12, 16))  # grid (3, 3, 4)
    handle.remove()
    q, k = seen["qk"]
    scores = (q @ k.transpose(-1, -2))[0]  # (H, N, N)
    t, h, w = 3, 3, 4
    coords = [(i // (h * w), i // w % h, i % w) for i in range(t * h * w)]
    groups: dict[tuple, list] = {}
    for i, a in enumerate(coords):
        for j, b in enumerate(coords):
            groups.setdefault(tuple(y - x for x, y in zip(a, b)), []).append(scores[:, i, j])
    assert max(torch.stack(v).std(0).max().item() for v in groups.values() if len(v) > 1) < 1e-4
    assert torch.stack([v[0] for v in groups.values()]).std(0).max() > 1e-2  # and the scores do vary


def test_tubelet_tokens_are_t_major_then_row_major():
    torch.manual_seed(0)
    embed = PatchEmbed(3, 8, (2, 4, 4))
    x = torch.randn(1, 3, 6, 8, 12)
    tokens, grid = embed(x)
    assert grid == (3, 2, 3) and tokens.shape == (1, 18, 8)
    t, r, c = 2, 1, 2
    n = (t * 2 + r) * 3 + c
    patch = x[:, :, 2 * t : 2 * t + 2, 4 * r : 4 * r + 4, 4 * c : 4 * c + 4]
    expected = (patch * embed.proj.weight).sum(dim=(1, 2, 3, 4)) + embed.proj.bias  # (8,)
    torch.testing.assert_close(tokens[0, n], expected, atol=1e-5, rtol=0)
