"""Frozen probe of a pretrained vision backbone on the shipped CIFAR-10 subset: a linear probe, the
pre-projection + content skip, and LoRA, each with the same trainable head, data, steps and seed.

Method, top to bottom:
  1. Backbone: a pretrained timm model ("timm:NAME") or open_clip image tower ("open_clip:ARCH:TAG"), from the
     Hub or from a local file (--checkpoint). All its weights are frozen. Offline with no checkpoint, the run
     stops at once with a one-line message; `--backbone random-tiny` (a random 4-block timm ViT on 32x32) or
     `random-tiny-clip` (the same shape as an open_clip tower) runs the whole pipeline without any download.
  2. Data: assets/cifar10/train.zip (300 per class) and test.zip (100 per class); random crop (pad 4) and
     flip for training; images resized to the backbone's input size and normalised with its statistics.
  3. Methods (a new linear head on the pooled features trains in every one):
       linear        the head alone (linear probe)
       preproj_skip  `mmpreproj.inject(backbone)`: pre-projection + content skip in every block, paper init
       lora          peft LoRA on attention only (timm: attn.qkv and attn.proj Linears; open_clip: the
                     nn.MultiheadAttention modules, which peft >= 0.14 wraps whole, in_proj and out_proj),
                     rank chosen so its parameter count matches the pre-projection's (the paper's rule)
  4. Training: AdamW, warmup + cosine, the same seed and batch order for every method; report test and
     train accuracy, trainable parameters, wall time, ||W_skip||_F per layer.

    .venv/bin/python recipes/vision/cifar_probe.py --backbone timm:vit_small_patch16_224   # needs the weights
    .venv/bin/python recipes/vision/cifar_probe.py --backbone random-tiny                  # offline pipeline run
    .venv/bin/python recipes/vision/cifar_probe.py --backbone random-tiny --quick          # ~10 s smoke run
Writes metrics.json, accuracy.png, loss.png (and skip_norms.png) under --out (default runs/cifar_probe/).
"""

from __future__ import annotations

import dataclasses
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: `recipes.kit`
import mmpreproj  # noqa: E402
from mmpreproj.analysis import plot_skip_norms, skip_norms  # noqa: E402
from mmpreproj.data import asset_path  # noqa: E402
from mmpreproj.hosts.spec import resolve_sites  # noqa: E402
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
from recipes.kit.backbones import Backbone, BackboneUnavailable, load_backbone  # noqa: E402

METHODS = ("linear", "preproj_skip", "lora")


@dataclass
class Config:
    """Every knob of the run; `--quick` shrinks data and steps for a smoke test."""

    backbone: str = "timm:vit_small_patch16_224"
    checkpoint: str | None = None
    methods: tuple[str, ...] = METHODS
    train_zip: str = str(asset_path("cifar10", "train.zip"))
    test_zip: str = str(asset_path("cifar10", "test.zip"))
    train_per_class: int = 300
    test_per_class: int = 100
    img_size: int = 0  # 0 = the backbone's own input size
    steps: int = 300
    batch_size: int = 32
    lr: float = 1e-3
    weight_decay: float = 0.0
    warmup_steps: int = 30
    lora_r: int = 0  # 0 = match the pre-projection's parameter count
    seed: int = 0
    threads: int = 2
    out: str = "runs/cifar_probe"
    quick: bool = False
    progress: bool = True

    def __post_init__(self) -> None:
        bad = [m for m in self.methods if m not in METHODS]
        if bad:
            raise ValueError(f"unknown methods {bad}; choose from {METHODS}")
        if self.quick:
            self.train_per_class, self.test_per_class, self.steps, self.batch_size, self.warmup_steps = 8, 4, 6, 16, 1


# 1. Backbone + head ------------------------------------------------------------------------------------------
class Probe(nn.Module):
    """images -> frozen backbone features (B, dim) -> trainable linear head (B, 10)."""

    def __init__(self, backbone: nn.Module, dim: int, num_classes: int = 10) -> None:
        super().__init__()
        self.backbone = backbone
        self.head = nn.Linear(dim, num_classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.head(self.backbone(images))


def lora_rank(backbone: Backbone, target_params: int) -> int:
    """The rank whose LoRA parameter count is closest to `target_params` (counted on a rank-1 copy)."""
    import copy

    from peft import LoraConfig, inject_adapter_in_model

    probe = inject_adapter_in_model(
        LoraConfig(r=1, target_modules=backbone.lora_targets), copy.deepcopy(backbone.model)
    )
    per_rank = sum(p.numel() for n, p in probe.named_parameters() if "lora_" in n)
    return max(1, round(target_params / per_rank))


def build(cfg: Config, method: str, preproj_params: int) -> tuple[Probe, Backbone, dict]:
    """A fresh backbone (same seed), frozen, with the method's trainable modules and a new head."""
    backbone = load_backbone(cfg.backbone, cfg.checkpoint, seed=cfg.seed)
    info: dict = {}
    if method == "preproj_skip":
        mmpreproj.inject(backbone.model, mmpreproj.PreProjConfig(freeze_base=True))
    else:
        backbone.model.requires_grad_(False)
    if method == "lora":
        from peft import LoraConfig, inject_adapter_in_model

        r = cfg.lora_r or lora_rank(backbone, preproj_params)
        config = LoraConfig(r=r, lora_alpha=2 * r, lora_dropout=0.0, target_modules=backbone.lora_targets)
        inject_adapter_in_model(config, backbone.model)
        for n, p in backbone.model.named_parameters():
            p.requires_grad_("lora_" in n)
        info["lora_r"] = r
    torch.manual_seed(cfg.seed + 1)  # the same head init for every method
    return Probe(backbone.model, backbone.dim), backbone, info


# 2. Data -----------------------------------------------------------------------------------------------------
def preparer(backbone: Backbone, size: int, train: bool):
    """uint8 (B, 3, 32, 32) -> normalised float (B, 3, size, size); training adds crop (pad 4) and flip."""
    mean = torch.tensor(backbone.mean).view(1, 3, 1, 1)
    std = torch.tensor(backbone.std).view(1, 3, 1, 1)

    def prepare(x: torch.Tensor, g: torch.Generator | None) -> torch.Tensor:
        x = (x.float() / 255.0 - mean) / std
        if train and g is not None:
            b = x.shape[0]
            padded = F.pad(x, (4, 4, 4, 4), mode="reflect")
            dy, dx = torch.randint(0, 9, (2, b), generator=g)
            x = torch.stack([padded[i, :, dy[i] : dy[i] + 32, dx[i] : dx[i] + 32] for i in range(b)])
            flip = torch.rand(b, generator=g) < 0.5
            x = torch.where(flip[:, None, None, None], x.flip(-1), x)
        if size != x.shape[-1]:
            x = F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False)
        return x

    return prepare


# 3-4. Train each method, report --------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> dict:
    cfg = parse_config(Config, argv, __doc__)
    torch.set_num_threads(cfg.threads)
    t0 = time.perf_counter()
    try:
        reference = load_backbone(cfg.backbone, cfg.checkpoint, seed=cfg.seed)
    except BackboneUnavailable as e:
        raise SystemExit(f"cifar_probe: {e}") from None
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    size = cfg.img_size or reference.img_size
    sites = resolve_sites(reference.model, mmpreproj.hosts.find_host(reference.model))
    n_blocks, width = len(sites), sites[0].width
    preproj_params = n_blocks * 2 * width * int(1.25 * width)  # W_up + W_down, the LoRA budget (paper's rule)
    del reference
    train = load_image_zip(cfg.train_zip, cfg.train_per_class)[:2]
    test = load_image_zip(cfg.test_zip, cfg.test_per_class)[:2]
    print(
        f"backbone {cfg.backbone} ({n_blocks} blocks, width {width}, input {size}px); "
        f"{len(train[0])} train / {len(test[0])} test images"
    )

    results, curves, norms = {}, {}, {}
    for method in cfg.methods:
        model, backbone, info = build(cfg, method, preproj_params)
        fit = fit_classifier(
            model,
            train,
            test,
            steps=cfg.steps,
            batch_size=cfg.batch_size,
            lr=cfg.lr,
            weight_decay=cfg.weight_decay,
            warmup_steps=cfg.warmup_steps,
            seed=cfg.seed,
            prepare_train=preparer(backbone, size, train=True),
            prepare_test=preparer(backbone, size, train=False),
            desc=method,
            progress=cfg.progress,
        )
        results[method] = {**dataclasses.asdict(fit), **info}
        curves[method] = fit.loss_curve
        write_json(out / "metrics.json", {"partial": True, "config": dataclasses.asdict(cfg), "results": results})
        if method == "preproj_skip":
            norms[method] = [v for _, v in sorted(skip_norms(model).items())]

    rows = [
        {
            "method": m,
            "test acc": r["test_accuracy"],
            "train acc": r["train_accuracy"],
            "trainable": f"{r['trainable_params']:,}",
            "seconds": r["seconds"],
        }
        for m, r in results.items()
    ]
    table = print_table(rows, ["method", "test acc", "train acc", "trainable", "seconds"])
    plot_bars(
        {m: r["test_accuracy"] for m, r in results.items()},
        out / "accuracy.png",
        f"frozen probe of {cfg.backbone}, CIFAR-10 subset",
    )
    plot_curves(curves, out / "loss.png", "training loss (same seed, steps, batches)", every=log_interval(cfg.steps))
    if norms:
        plot_skip_norms(norms, out / "skip_norms.png", title=f"||W_skip||_F per layer, {cfg.backbone}")
    metrics = {
        "recipe": "cifar_probe",
        "config": dataclasses.asdict(cfg),
        "results": results,
        "skip_norms": norms,
        "table": table,
        "img_size": size,
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
