"""Are a short clip's frames in order? A small VideoViT trained on segments of one real video (CPU), with 3D RoPE
vs 1D RoPE over the flattened tokens vs a learned position table, at the same budget.

Method, top to bottom:
  1. Data: assets/videos/cockatoo.mp4 (280 frames, 20 fps), decoded with PyAV at 36x64. A segment is 8 frames
     taken every 2nd frame (15 frames of video), cut into 4 tubelets of 2 frames. Two tasks (--task):
       shuffled (default)  label 1 = the 4 tubelets come in a random non-identity order (each tubelet keeps
                           its own 2 frames in order, so only the order of the tokens in time tells them apart)
       reversed            label 1 = all 8 frames played backwards (the arrow of time)
     Time split: segments of the first 75% of the frames train, segments of the frames after an 8-frame gap
     test, so no test frame is ever seen in training. Every segment appears with both labels, so the two
     classes are balanced and share the same pictures. Test shuffles are fixed (seeded by the segment start).
     Training clips: random 32x48 crop and horizontal flip; test clips: the centre 32x48 crop.
  2. Model: `mmpreproj.models.VideoViT`, tubelets of 2 frames x 8x8 pixels (grid 4x4x6 = 96 tokens, t-major),
     width 64, depth 4, 4 heads, MLP ratio 2, mean pooling, built from `mmpreproj.modules.Block`. Variants:
       rope3d   axial RoPE over (t, row, column) (RoPE3D, channels D/4, 3D/8, 3D/8, theta 100)
       rope1d   RoPE over the flattened token index (t-major), as a text model would see the tokens
       learned  a learned absolute (t, row, column) table, no RoPE
  3. Training: the same seed, steps, batch order, AdamW and warmup + cosine LR for every variant.
  4. Report: test accuracy (chance = 50%), train accuracy, parameters, wall time.

    .venv/bin/python recipes/video/clip_order.py                     # default run (see --help)
    .venv/bin/python recipes/video/clip_order.py --task reversed     # the arrow-of-time task
    .venv/bin/python recipes/video/clip_order.py --quick             # ~10 s smoke run
Writes metrics.json, accuracy.png and loss.png under --out (default runs/clip_order_<task>/).
"""

from __future__ import annotations

import dataclasses
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from einops import rearrange

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: `recipes.kit`
import mmpreproj  # noqa: E402
from mmpreproj.data import asset_path  # noqa: E402
from mmpreproj.models import VideoViT  # noqa: E402
from recipes.kit import (  # noqa: E402
    environment,
    fit_classifier,
    log_interval,
    parse_config,
    plot_bars,
    plot_curves,
    print_table,
    read_video,
    write_json,
)

TASKS = ("shuffled", "reversed")


@dataclass
class Config:
    """Every knob of the run; `--quick` shrinks the model and steps for a smoke test."""

    task: str = "shuffled"
    video: str = str(asset_path("videos", "cockatoo.mp4"))
    max_frames: int = 0  # decode only the first n frames (0 = all)
    decode_size: tuple[int, ...] = (36, 64)
    crop: tuple[int, ...] = (32, 48)
    frames: int = 8
    frame_stride: int = 2
    train_fraction: float = 0.75
    gap_frames: int = 8
    variants: tuple[str, ...] = ("rope3d", "rope1d", "learned")
    dim: int = 64
    depth: int = 4
    num_heads: int = 4
    mlp_ratio: float = 2.0
    patch_size: int = 8
    tubelet: int = 2
    theta: float = 100.0
    steps: int = 200
    batch_size: int = 24
    lr: float = 1e-3
    weight_decay: float = 0.05
    warmup_steps: int = 20
    seed: int = 0
    threads: int = 2
    out: str = ""  # "" = runs/clip_order_<task>
    quick: bool = False
    progress: bool = True

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise ValueError(f"task={self.task!r}; choose from {TASKS}")
        if self.frames % self.tubelet:
            raise ValueError(f"frames={self.frames} must be a multiple of tubelet={self.tubelet}")
        self.out = self.out or f"runs/clip_order_{self.task}"
        if self.quick:
            self.dim, self.depth, self.num_heads, self.steps, self.batch_size, self.warmup_steps = 32, 1, 2, 6, 8, 1
            self.max_frames = self.max_frames or 96


# 1. Data: segments as (start frame, label) pairs; pixels are cut out per batch -------------------------------------
def segments(first: int, last: int, span: int) -> torch.Tensor:
    """(start, label) for every segment of `span` frames inside [first, last), with both labels: (N, 2)."""
    starts = torch.arange(first, last - span + 1)
    return torch.cat(
        [torch.stack([starts, torch.zeros_like(starts)], 1), torch.stack([starts, torch.ones_like(starts)], 1)]
    )


def time_split(num_frames: int, cfg: Config) -> tuple[torch.Tensor, torch.Tensor]:
    """(train, test) segments: starts in the first `train_fraction` of the frames, and after a `gap_frames` gap."""
    span = (cfg.frames - 1) * cfg.frame_stride + 1
    n_train = int(num_frames * cfg.train_fraction)
    train_segs = segments(0, n_train, span)
    test_segs = segments(n_train + cfg.gap_frames, num_frames, span)
    if len(test_segs) == 0:
        raise ValueError("no test segments: the video is too short for this split")
    print(
        f"{Path(cfg.video).name}: {num_frames} frames; train frames [0, {n_train}) -> {len(train_segs)} clips, "
        f"test frames [{n_train + cfg.gap_frames}, {num_frames}) -> {len(test_segs)} clips"
    )
    return train_segs, test_segs


def reorder(clip: torch.Tensor, cfg: Config, g: torch.Generator) -> torch.Tensor:
    """Label-1 frames: reversed, or the tubelets (groups of `tubelet` frames) in a random non-identity order."""
    if cfg.task == "reversed":
        return clip.flip(0)
    n = cfg.frames // cfg.tubelet
    perm = torch.arange(n)
    while torch.equal(perm, torch.arange(n)):
        perm = torch.randperm(n, generator=g)
    return rearrange(rearrange(clip, "(n k) ... -> n k ...", k=cfg.tubelet)[perm], "n k ... -> (n k) ...")


def make_clips(video: torch.Tensor, segs: torch.Tensor, cfg: Config, g: torch.Generator | None) -> torch.Tensor:
    """uint8 video (T, 3, H, W) + (B, 2) segments -> float clips (B, 3, frames, crop_h, crop_w) in [-1, 1].

    With a generator (training): random crop, flip and shuffle; without (test): the centre crop and a shuffle
    fixed by the segment's start frame.
    """
    span = (cfg.frames - 1) * cfg.frame_stride + 1
    (h, w), (ch, cw) = video.shape[-2:], cfg.crop
    clips = []
    for start, label in segs.tolist():
        clip = video[start : start + span : cfg.frame_stride]  # (frames, 3, H, W)
        if label:
            clip = reorder(clip, cfg, g if g is not None else torch.Generator().manual_seed(start))
        if g is None:
            y, x, flip = (h - ch) // 2, (w - cw) // 2, False
        else:
            y = int(torch.randint(0, h - ch + 1, (1,), generator=g))
            x = int(torch.randint(0, w - cw + 1, (1,), generator=g))
            flip = bool(torch.rand(1, generator=g) < 0.5)
        clip = clip[..., y : y + ch, x : x + cw]
        clips.append(clip.flip(-1) if flip else clip)
    x = torch.stack(clips).permute(0, 2, 1, 3, 4)  # (B, 3, frames, ch, cw)
    return x.float() / 127.5 - 1.0


# 2. Model ------------------------------------------------------------------------------------------------------
def build(cfg: Config, positions: str) -> torch.nn.Module:
    torch.manual_seed(cfg.seed)
    return VideoViT(
        clip_size=(cfg.frames, *cfg.crop),
        patch_size=cfg.patch_size,
        tubelet=cfg.tubelet,
        num_classes=2,
        dim=cfg.dim,
        depth=cfg.depth,
        num_heads=cfg.num_heads,
        mlp_ratio=cfg.mlp_ratio,
        positions=positions,
        theta=cfg.theta,
    )


# 3-4. Train every variant at the same budget, report ----------------------------------------------------------------
def main(argv: list[str] | None = None) -> dict:
    cfg = parse_config(Config, argv, __doc__)
    torch.set_num_threads(cfg.threads)
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    video = read_video(cfg.video, size=tuple(cfg.decode_size), max_frames=cfg.max_frames or None)  # (T, 3, H, W) uint8
    train_segs, test_segs = time_split(len(video), cfg)

    results, curves = {}, {}
    for variant in cfg.variants:
        fit = fit_classifier(
            build(cfg, variant),
            (train_segs, train_segs[:, 1]),
            (test_segs, test_segs[:, 1]),
            steps=cfg.steps,
            batch_size=cfg.batch_size,
            lr=cfg.lr,
            weight_decay=cfg.weight_decay,
            warmup_steps=cfg.warmup_steps,
            seed=cfg.seed,
            prepare_train=lambda s, g: make_clips(video, s, cfg, g),
            prepare_test=lambda s, g: make_clips(video, s, cfg, None),
            desc=variant,
            progress=cfg.progress,
        )
        results[variant] = dataclasses.asdict(fit)
        curves[variant] = fit.loss_curve
        write_json(out / "metrics.json", {"partial": True, "config": dataclasses.asdict(cfg), "results": results})

    rows = [
        {
            "positions": v,
            "test acc": r["test_accuracy"],
            "train acc": r["train_accuracy"],
            "params": f"{r['trainable_params']:,}",
            "seconds": r["seconds"],
        }
        for v, r in results.items()
    ]
    table = print_table(rows, ["positions", "test acc", "train acc", "params", "seconds"])
    plot_bars(
        {v: r["test_accuracy"] for v, r in results.items()},
        out / "accuracy.png",
        f"{cfg.task} vs in order, {len(test_segs)} held-out clips (chance 0.5)",
    )
    plot_curves(curves, out / "loss.png", "training loss (same seed, steps, batches)", every=log_interval(cfg.steps))
    metrics = {
        "recipe": "clip_order",
        "config": dataclasses.asdict(cfg),
        "results": results,
        "table": table,
        "num_frames": len(video),
        "train_clips": len(train_segs),
        "test_clips": len(test_segs),
        "wall_seconds": time.perf_counter() - t0,
        "environment": environment(),
        "mmpreproj_version": mmpreproj.__version__,
    }
    write_json(out / "metrics.json", metrics)
    print(f"wrote {out / 'metrics.json'} in {metrics['wall_seconds']:.0f} s")
    return metrics


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: `recipes.command`
    from recipes.command import run_main  # a refusal in one line naming its flags

    run_main(main)
