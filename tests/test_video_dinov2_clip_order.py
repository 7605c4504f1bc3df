"""recipes/video/dinov2_clip_order.py: tokens cut from cached frame features as clip_order.py cuts pixels, the
variants' shared init, and a --quick run end to end on a random tiny DINOv2 stand-in (seconds, in process)."""

from __future__ import annotations

import json

import torch
from einops import rearrange

import mmpreproj
from recipes.video import dinov2_clip_order as vd


def cfg(**kw) -> vd.Config:
    return vd.Config(**{"out": "unused", "grid_crop": 0, "center": False, **kw})


def frame_ids(num_frames: int, grid: int = 4, width: int = 3) -> torch.Tensor:
    """Features whose every entry is its frame's index: (T, G, G, d)."""
    return torch.arange(num_frames, dtype=torch.float).view(-1, 1, 1, 1).expand(-1, grid, grid, width).clone()


def token_frames(tokens: torch.Tensor, c: vd.Config, grid: tuple[int, int, int]) -> torch.Tensor:
    """(B, t*h*w, k*d) tokens of `frame_ids` features -> the frame index of each (clip, tubelet, frame): (B, t, k)."""
    x = rearrange(tokens, "b (t h w) (k d) -> b t h w k d", t=grid[0], h=grid[1], k=c.tubelet)
    return x[:, :, 0, 0, :, 0]


def test_tokens_follow_the_segment_and_its_label():
    c = cfg(pool=2)
    feats = frame_ids(40)
    segs = torch.tensor([[3, 0], [3, 1], [5, 1]])
    grid = vd.token_grid(c, 4)
    tokens = vd.make_tokens(feats, segs, c, None)
    assert grid == (4, 2, 2) and tokens.shape == (3, 16, 2 * 3)
    frames = token_frames(tokens, c, grid)
    in_order = torch.arange(3, 3 + 15, 2).view(4, 2).float()  # every 2nd frame, tubelets of 2
    assert torch.equal(frames[0], in_order)
    for (start, _), clip in zip(segs[1:].tolist(), frames[1:]):  # the same tubelets, each in order, reordered
        tubelets = torch.arange(start, start + 15, 2).view(4, 2).float()
        assert sorted(map(tuple, clip.tolist())) == list(map(tuple, tubelets.tolist()))
        assert not torch.equal(clip, tubelets)
    again = vd.make_tokens(feats, segs, c, None)  # test shuffles are fixed by the start frame
    assert torch.equal(again, tokens)
    reversed_ = token_frames(vd.make_tokens(feats, segs[:2], cfg(task="reversed"), None), c, grid)
    assert torch.equal(reversed_[1], in_order.flatten().flip(0).view(4, 2))


def test_pooling_crop_and_flip_act_on_the_patch_grid():
    c = cfg(tubelet=1, pool=2, grid_crop=2, frames=2, frame_stride=1)
    feats = torch.arange(4 * 4, dtype=torch.float).view(1, 4, 4, 1).repeat(4, 1, 1, 1)  # entry = row * 4 + column
    centre = vd.make_tokens(feats, torch.tensor([[0, 0]]), c, None)  # centre 2 x 2 crop, pooled to one token
    assert centre.shape == (1, 2, 1) and torch.allclose(centre, torch.full_like(centre, (5 + 6 + 9 + 10) / 4))
    whole = vd.make_tokens(feats, torch.tensor([[0, 0]]), cfg(tubelet=1, frames=2, frame_stride=1, pool=2), None)
    assert whole[0, :4, 0].tolist() == [2.5, 4.5, 10.5, 12.5]  # 2 x 2 means, row-major
    flips = cfg(tubelet=1, frames=2, frame_stride=1, pool=1)
    seen = set()
    for s in range(8):  # training draws
        row = vd.make_tokens(feats, torch.tensor([[0, 0]]), flips, torch.Generator().manual_seed(s))[0, :4, 0]
        seen.add(tuple(row.tolist()))
    assert seen == {(0.0, 1.0, 2.0, 3.0), (3.0, 2.0, 1.0, 0.0)}  # columns flipped half the time, rows never
    moving = cfg(center=True, tubelet=1, pool=1, frames=4, frame_stride=2)  # frames 0, 2, 4, 6: mean 3
    centred = vd.make_tokens(frame_ids(8), torch.tensor([[0, 0]]), moving, None)
    assert torch.equal(centred.view(4, 48), torch.tensor([-3.0, -1.0, 1.0, 3.0]).view(4, 1).expand(4, 48))


def test_variants_share_their_init_and_only_positions_differ():
    c = cfg(dim=32, num_heads=2, depth=2)
    models = {v: vd.build(c, v, 12, (4, 2, 2), seed=1) for v in vd.VARIANTS}
    shared = {k: p for k, p in models["rope3d"].state_dict().items()}
    for v in ("rope1d", "learned"):
        state = models[v].state_dict()
        assert all(torch.equal(state[k], p) for k, p in shared.items() if k in state), v
    assert "encoder.positions.table.table" in models["learned"].state_dict()
    injected = mmpreproj.injected_modules(models["rope3d+preproj"])
    assert len(injected) == 2 and all(p.requires_grad for p in models["rope3d+preproj"].parameters())
    x = torch.randn(2, 16, 12)
    with torch.no_grad():
        outs = {v: m.eval()(x) for v, m in models.items()}
    assert not torch.allclose(outs["rope3d"], outs["rope1d"])  # the same weights, other positions
    order = torch.randperm(16, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():  # without positions the mean pool would not see the order; with them it does
        assert not torch.allclose(models["rope3d"](x[:, order]), outs["rope3d"], atol=1e-6)


def test_quick_run_writes_metrics_report_and_reuses_the_feature_cache(tmp_path, capsys):
    argv = ["--quick", "--backbone", "random-dinov2-tiny", "--pool", "1", "--grid-crop", "1", "--no-progress"]
    argv += ["--out", str(tmp_path / "ev"), "--runs", str(tmp_path / "runs")]
    first = vd.main(argv)
    metrics = json.loads((tmp_path / "ev" / "metrics.json").read_text())
    assert metrics["features"]["cached"] is False and metrics["features"]["grid"] == [2, 2]
    assert set(metrics["results"]) == set(vd.VARIANTS) and metrics["test_clips"] > 0
    for variant, by_seed in metrics["results"].items():
        (r,) = by_seed.values()
        assert len(r["items"]) == metrics["test_clips"] and r["test_accuracy"] == sum(r["items"]) / len(r["items"])
        assert r["cpu_seconds"] > 0 and r["trainable_params"] > 0, variant
    params = {v: s["trainable_params"] for v, s in metrics["summary"].items()}
    assert params["rope3d"] == params["rope1d"] < params["learned"] and params["rope3d"] < params["rope3d+preproj"]
    assert {(c["method"], c["reference"]) for c in metrics["comparisons"]} >= {("rope3d", "rope1d")}
    report = (tmp_path / "ev" / "report.md").read_text()
    assert "random-dinov2-tiny" in report and all(f"| {v} |" in report for v in vd.VARIANTS)
    assert "--quick" in metrics["command"] and list((tmp_path / "runs").glob("features-*.pt"))

    (tmp_path / "ev" / "report.md").unlink()
    vd.main([*argv, "--report"])  # from metrics.json alone
    assert (tmp_path / "ev" / "report.md").read_text() == report
    second = vd.main(argv)  # the features come from the cache; the same seed trains the same runs
    assert second["features"]["cached"] is True
    assert second["results"]["rope3d"]["0"]["loss_curve"] == first["results"]["rope3d"]["0"]["loss_curve"]
