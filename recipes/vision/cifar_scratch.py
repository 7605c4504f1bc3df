"""A small ViT trained from scratch on the shipped CIFAR-10 subset, on CPU: learned absolute positions,
+ 2D RoPE, + pre-projection & content skip, and both, at the same budget.

Method, top to bottom:
  1. Data: assets/cifar10/train.zip (first 300 images per class, 3,000) and test.zip (first 100 per class of
     the official test split, 1,000), 32x32 JPEGs. Training batches: random crop after 4-pixel reflect
     padding and horizontal flip; both splits normalised with the CIFAR-10 channel statistics.
  2. Model: `mmpreproj.models.ViT`, patch 4 (8x8 grid + class token), width 96, depth 4, 4 heads, MLP
     ratio 2, built from `mmpreproj.modules.Block`. Variants (names joined by '+'):
       learned                  a learned absolute position table (the ViT baseline)
       learned+rope2d           the same table, plus 2D axial RoPE (theta 100) on q/k of the patch tokens
       learned+preproj          the baseline with the pre-projection + content skip injected in every block
                                (`mmpreproj.inject`, paper init, trained jointly with the base)
       learned+rope2d+preproj   both
  3. Training: the same seed, steps, batch order, AdamW (wd 0.05) and warmup + cosine LR for every variant.
  4. Report: test and train accuracy, parameters, wall time; ||W_skip||_F per layer where there is a skip.

    .venv/bin/python recipes/vision/cifar_scratch.py                 # default run (see --help)
    .venv/bin/python recipes/vision/cifar_scratch.py --quick         # ~15 s smoke run
Writes metrics.json, accuracy.png, loss.png and skip_norms.png under --out (default runs/cifar_scratch/).
"""

from __future__ import annotations

import dataclasses
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: `recipes.kit`
import mmpreproj  # noqa: E402
from mmpreproj.analysis import plot_skip_norms, skip_norms  # noqa: E402
from mmpreproj.data import asset_path  # noqa: E402
from mmpreproj.models import ViT  # noqa: E402
from recipes.kit import (  # noqa: E402
    environment,
    fit_classifier,
    load_image_zip,
    log_interval,
    parse_config,
    plot_bars,
    plot_curves,
    print_table,
    write_json,
)

MEAN = torch.tensor([0.4914, 0.4822, 0.4465]).view(1, 3, 1, 1)
STD = torch.tensor([0.2470, 0.2435, 0.2616]).view(1, 3, 1, 1)


@dataclass
class Config:
    """Every knob of the run; `--quick` shrinks data, model and steps for a smoke test."""

    train_zip: str = str(asset_path("cifar10", "train.zip"))
    test_zip: str = str(asset_path("cifar10", "test.zip"))
    variants: tuple[str, ...] = ("learned", "learned+rope2d", "learned+preproj", "learned+rope2d+preproj")
    train_per_class: int = 300
    test_per_class: int = 100
    dim: int = 96
    depth: int = 4
    num_heads: int = 4
    patch_size: int = 4
    mlp_ratio: float = 2.0
    theta: float = 100.0
    steps: int = 400
    batch_size: int = 64
    lr: float = 1e-3
    weight_decay: float = 0.05
    warmup_steps: int = 40
    seed: int = 0
    threads: int = 2
    out: str = "runs/cifar_scratch"
    quick: bool = False
    progress: bool = True

    def __post_init__(self) -> None:
        for v in self.variants:
            parts = v.split("+")
            if not parts or any(p not in ("learned", "rope2d", "rope1d", "none", "preproj") for p in parts):
                raise ValueError(f"variant {v!r}: join 'learned', 'rope2d', 'rope1d', 'none', 'preproj' with '+'")
        if self.quick:  # a smoke run: a sliver of the data, a tiny model, a few steps
            self.train_per_class, self.test_per_class = 16, 8
            self.dim, self.depth, self.num_heads, self.steps, self.batch_size, self.warmup_steps = 32, 2, 2, 8, 16, 2


# 1. Data ---------------------------------------------------------------------------------------------------
def normalise(x: torch.Tensor) -> torch.Tensor:
    return (x.float() / 255.0 - MEAN) / STD


def augment(x: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    """uint8 (B, 3, 32, 32) -> normalised float, random 32x32 crop of the reflect-padded image, random flip."""
    b, _, h, w = x.shape
    padded = F.pad(normalise(x), (4, 4, 4, 4), mode="reflect")
    dy, dx = torch.randint(0, 9, (2, b), generator=g)
    out = torch.stack([padded[i, :, dy[i] : dy[i] + h, dx[i] : dx[i] + w] for i in range(b)])
    flip = torch.rand(b, generator=g) < 0.5
    return torch.where(flip[:, None, None, None], out.flip(-1), out)


# 2. Model --------------------------------------------------------------------------------------------------
def build(cfg: Config, variant: str) -> torch.nn.Module:
    """The ViT of a variant; the same seed gives every variant the same base initialisation."""
    parts = variant.split("+")
    positions = "+".join(p for p in parts if p != "preproj") or "none"
    torch.manual_seed(cfg.seed)
    model = ViT(
        img_size=32,
        patch_size=cfg.patch_size,
        num_classes=10,
        dim=cfg.dim,
        depth=cfg.depth,
        num_heads=cfg.num_heads,
        mlp_ratio=cfg.mlp_ratio,
        positions=positions,
        theta=cfg.theta,
    )
    if "preproj" in parts:  # trained jointly with the base: nothing frozen
        mmpreproj.inject(model, mmpreproj.PreProjConfig(freeze_base=False))
    return model


# 3-4. Train every variant at the same budget, report ---------------------------------------------------------
def main(argv: list[str] | None = None) -> dict:
    cfg = parse_config(Config, argv, __doc__)
    torch.set_num_threads(cfg.threads)
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    train_x, train_y, classes = load_image_zip(cfg.train_zip, cfg.train_per_class)
    test_x, test_y, _ = load_image_zip(cfg.test_zip, cfg.test_per_class)
    print(f"CIFAR-10 subset: {len(train_x)} train / {len(test_x)} test images, {len(classes)} classes")

    results, norms, curves = {}, {}, {}
    for variant in cfg.variants:
        model = build(cfg, variant)
        fit = fit_classifier(
            model,
            (train_x, train_y),
            (test_x, test_y),
            steps=cfg.steps,
            batch_size=cfg.batch_size,
            lr=cfg.lr,
            weight_decay=cfg.weight_decay,
            warmup_steps=cfg.warmup_steps,
            seed=cfg.seed,
            prepare_train=augment,
            prepare_test=lambda x, g: normalise(x),
            desc=variant,
            progress=cfg.progress,
        )
        results[variant] = dataclasses.asdict(fit)
        curves[variant] = fit.loss_curve
        write_json(out / "metrics.json", {"partial": True, "config": dataclasses.asdict(cfg), "results": results})
        if mmpreproj.is_injected(model):
            norms[variant] = [v for _, v in sorted(skip_norms(model).items())]

    rows = [
        {
            "variant": v,
            "test acc": r["test_accuracy"],
            "train acc": r["train_accuracy"],
            "params": f"{r['trainable_params']:,}",
            "seconds": r["seconds"],
        }
        for v, r in results.items()
    ]
    table = print_table(rows, ["variant", "test acc", "train acc", "params", "seconds"])
    for v, n in norms.items():
        print(f"||W_skip||_F per layer, {v}: " + ", ".join(f"{x:.3f}" for x in n))

    plot_bars(
        {v: r["test_accuracy"] for v, r in results.items()},
        out / "accuracy.png",
        f"ViT from scratch, CIFAR-10 subset ({len(train_x)} train / {len(test_x)} test)",
    )
    plot_curves(curves, out / "loss.png", "training loss (same seed, steps, batches)", every=log_interval(cfg.steps))
    if norms:
        plot_skip_norms(norms, out / "skip_norms.png", title="||W_skip||_F per layer, trained from scratch")
    metrics = {
        "recipe": "cifar_scratch",
        "config": dataclasses.asdict(cfg),
        "results": results,
        "skip_norms": norms,
        "table": table,
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
