"""Pretrain a mini ViT (timm VisionTransformer, 32x32 input, 8x8 patches) on CIFAR-10 classes 0-4, on CPU.

The frozen probe (`recipes/vision/mini_vit_probe.py`) needs a pretrained backbone with no download, and a
task it never saw: this trains one on airplane / automobile / bird / cat / deer only, so that the probe's
classes (dog, frog, horse, ship, truck) are new to it. The method, top to bottom:
  1. data: assets/cifar10/pretrain-train.zip (500 train images per class, classes 0-4) and pretrain-test.zip
     (300 held-out test images per class, the same classes), packed by `pack_cifar_split.py`;
  2. model: `timm.create_model(ARCH, img_size=32, patch_size=8, embed_dim=128, depth=6, num_heads=4,
     num_classes=5)`, learned absolute positions and a class token (timm's defaults), random init;
  3. training: AdamW, linear warmup then cosine to 0, random crop (reflect-pad 4) and horizontal flip,
     the same loop as the other vision recipes (`recipes.kit.fit_classifier`), fp32;
  4. save a real timm checkpoint with `timm.models.save_for_hf` (model.safetensors in bf16 + config.json),
     reload it through timm as a user would, score the held-out test images, store reference logits of the
     first images (`reference_logits.json`, checked by the tests) and write TRAINING.md.

Reload: `timm.create_model("local-dir:assets/mini-vit", pretrained=True)`, or
`timm.create_model(ARCH, pretrained=True, \
pretrained_cfg_overlay=dict(file="assets/mini-vit/model.safetensors", num_classes=5),
**model_args)` with model_args from config.json.

    .venv/bin/python recipes/vision/pretrain_mini_vit.py --out assets/mini-vit     # the shipped checkpoint
    .venv/bin/python recipes/vision/pretrain_mini_vit.py --quick --out /tmp/vit    # seconds, a smoke run
"""

from __future__ import annotations

import copy
import dataclasses
import json
import shlex
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: `recipes.kit`
from mmpreproj.data import asset_path  # noqa: E402
from recipes.kit import accuracy, environment, fit_classifier, load_image_zip, parse_config  # noqa: E402

ARCH = "vit_tiny_patch16_224"  # the timm architecture name; its size is overridden by model_args below
MEAN = (0.4914, 0.4822, 0.4465)  # CIFAR-10 channel statistics
STD = (0.2470, 0.2435, 0.2616)
PRETRAIN_CLASSES = ("airplane", "automobile", "bird", "cat", "deer")
N_REFERENCE = 8  # test images whose logits are stored beside the checkpoint


@dataclass
class Config:
    """Every knob of the run; `--quick` shrinks data and steps for a smoke test."""

    train_zip: str = str(asset_path("cifar10", "pretrain-train.zip"))
    test_zip: str = str(asset_path("cifar10", "pretrain-test.zip"))
    out: str = "runs/mini-vit"
    patch_size: int = 8
    embed_dim: int = 128
    depth: int = 6
    num_heads: int = 4
    mlp_ratio: float = 4.0
    steps: int = 1600
    batch_size: int = 128
    lr: float = 1e-3
    weight_decay: float = 0.05
    warmup_steps: int = 80
    seed: int = 0
    threads: int = 1
    quick: bool = False
    progress: bool = True

    def __post_init__(self) -> None:
        if self.embed_dim % self.num_heads:
            raise ValueError(f"embed_dim {self.embed_dim} is not divisible by num_heads {self.num_heads}")
        if 32 % self.patch_size:
            raise ValueError(f"patch_size must divide 32, got {self.patch_size}")
        if self.quick:
            self.steps, self.batch_size, self.warmup_steps, self.depth = 4, 16, 1, 2

    def model_args(self) -> dict:
        """The timm constructor overrides (saved in config.json as `model_args`)."""
        return {
            "img_size": 32,
            "patch_size": self.patch_size,
            "embed_dim": self.embed_dim,
            "depth": self.depth,
            "num_heads": self.num_heads,
            "mlp_ratio": self.mlp_ratio,
        }


# 1-2. Data and model -----------------------------------------------------------------------------------------
def prepare(train: bool):
    """uint8 (B, 3, 32, 32) -> normalised float (B, 3, 32, 32); training adds crop (reflect-pad 4) and flip."""
    mean, std = torch.tensor(MEAN).view(1, 3, 1, 1), torch.tensor(STD).view(1, 3, 1, 1)

    def run(x: torch.Tensor, g: torch.Generator | None) -> torch.Tensor:
        x = (x.float() / 255.0 - mean) / std
        if train and g is not None:
            b = x.shape[0]
            padded = F.pad(x, (4, 4, 4, 4), mode="reflect")  # (B, 3, 40, 40)
            dy, dx = torch.randint(0, 9, (2, b), generator=g)
            x = torch.stack([padded[i, :, dy[i] : dy[i] + 32, dx[i] : dx[i] + 32] for i in range(b)])
            flip = torch.rand(b, generator=g) < 0.5
            x = torch.where(flip[:, None, None, None], x.flip(-1), x)
        return x

    return run


def build_model(cfg: Config) -> nn.Module:
    """A randomly initialised timm VisionTransformer of the configured size, 5 classes."""
    import timm

    torch.manual_seed(cfg.seed)
    return timm.create_model(ARCH, pretrained=False, num_classes=len(PRETRAIN_CLASSES), **cfg.model_args())


# 4. Save, reload, check, document -----------------------------------------------------------------------------
def save_checkpoint(model: nn.Module, folder: Path, cfg: Config) -> None:
    """model.safetensors (bf16) + config.json in timm's Hub format, preprocessing for 32x32 CIFAR."""
    from timm.models import save_for_hf

    bf16 = copy.deepcopy(model).to(torch.bfloat16)  # the trained model itself stays fp32
    save_for_hf(
        bf16,
        str(folder),
        safe_serialization=True,
        model_args=cfg.model_args(),
        model_config={
            "label_names": list(PRETRAIN_CLASSES),
            "pretrained_cfg": {
                "mean": MEAN,
                "std": STD,
                "crop_pct": 1.0,
                "interpolation": "bilinear",
                "license": "mit",
                "hf_hub_id": None,
                "tag": "mmpreproj-mini",
                "description": "mmpreproj mini-ViT, CIFAR-10 classes 0-4, recipes/vision/pretrain_mini_vit.py",
            },
        },
        data_config={
            "input_size": (3, 32, 32),
            "mean": MEAN,
            "std": STD,
            "crop_pct": 1.0,
            "interpolation": "bilinear",
        },
    )


def load_checkpoint(folder: Path) -> nn.Module:
    """The saved folder reloaded through timm (fp32, eval), as a user would."""
    import timm

    return timm.create_model(f"local-dir:{folder}", pretrained=True).eval()


def reference_logits(model: nn.Module, test_zip: str) -> dict:
    """Logits (fp32) of the first N_REFERENCE test images of each class, for the reload test."""
    import zipfile

    with zipfile.ZipFile(test_zip) as z:
        names = sorted(n for n in z.namelist() if n.endswith(".jpg"))
    x, _, _ = load_image_zip(test_zip, per_class=2)  # the first 2 of each class, member order
    members = [n for c in PRETRAIN_CLASSES for n in [m for m in names if f"/{c}/" in m][:2]][:N_REFERENCE]
    with torch.no_grad():
        logits = model(prepare(train=False)(x[:N_REFERENCE], None))  # (N, 5)
    return {
        "members": members,
        "zip": Path(test_zip).name,
        "mean": MEAN,
        "std": STD,
        "logits": [[round(v, 6) for v in row] for row in logits.tolist()],
    }


def training_md(
    cfg: Config, argv: list[str], fit: dict, reloaded: float, n: dict, wall: float, env: dict, params: int
) -> str:
    """TRAINING.md: command, data, schedule, accuracy, time and load."""
    epochs = cfg.steps * cfg.batch_size / n["train"]
    curve = ", ".join(f"{v:.3f}" for v in fit["loss_curve"][:: max(1, len(fit["loss_curve"]) // 10)])
    return f"""# mini-vit: training record

A timm `VisionTransformer` ({ARCH} with {json.dumps(cfg.model_args())}: {params:,} parameters, learned
absolute positions + class token, timm's defaults) trained from scratch on CIFAR-10 **classes 0-4 only**
({", ".join(PRETRAIN_CLASSES)}), so that classes 5-9 are new to it (the frozen probe's task). Weights in bf16
safetensors, config in timm's Hub format. Written by `recipes/vision/pretrain_mini_vit.py`.

## Command

```
OMP_NUM_THREADS=1 nice -n 10 .venv/bin/python recipes/vision/pretrain_mini_vit.py {shlex.join(argv)}
```

Seed {cfg.seed}; `torch.set_num_threads({cfg.threads})`; fp32 training on CPU.

## Data

- train: `assets/cifar10/{Path(cfg.train_zip).name}`, {n["train"]:,} images (500 per class, the first 500 of
  each class of the CIFAR-10 train split); random crop (reflect-pad 4) and horizontal flip
- held-out test: `assets/cifar10/{Path(cfg.test_zip).name}`, {n["test"]:,} images (the first 300 per class of
  the CIFAR-10 test split, the same 5 classes)
- normalisation: CIFAR-10 mean {MEAN}, std {STD}

## Training

- {cfg.steps:,} steps x {cfg.batch_size} images = {cfg.steps * cfg.batch_size:,} images ({epochs:.1f} epochs)
- AdamW lr {cfg.lr:g}, {cfg.warmup_steps} linear warmup steps then cosine to 0, weight decay
  {cfg.weight_decay} (matrices only), no label smoothing, no dropout
- train loss (every tenth logged window): {curve}
- training wall time {fit["seconds"]:.0f} s ({cfg.steps * cfg.batch_size / fit["seconds"]:.0f} images/s);
  whole script {wall:.0f} s; load average at the end (1, 5, 15 min) {env["load_avg_1_5_15"]} on
  {env["cpus"]} shared CPU cores

## Accuracy (classes 0-4)

| split | images | accuracy |
|---|---|---|
| held-out test | {n["test"]:,} | **{100 * fit["test_accuracy"]:.1f}%** |
| train (no augmentation) | {n["train"]:,} | {100 * fit["train_accuracy"]:.1f}% |
| held-out test, reloaded from this folder (bf16 weights, fp32 compute) | {n["test"]:,} | {100 * reloaded:.1f}% |

Chance is 20%.

## Reload

```python
import timm
model = timm.create_model("local-dir:assets/mini-vit", pretrained=True)               # 5-class head
backbone = timm.create_model("local-dir:assets/mini-vit", pretrained=True, num_classes=0)  \
# features (B, {cfg.embed_dim})
# or by name, with the weights file and the model_args of config.json (num_classes also in the overlay,
# else timm compares it with the 1000 classes of the name's own config and drops the head):
model = timm.create_model("{ARCH}", pretrained=True, num_classes=5,
                          pretrained_cfg_overlay=dict(file="assets/mini-vit/model.safetensors", num_classes=5),
                          **{json.dumps(cfg.model_args()).replace('"', "'")})
```

Inputs: 32x32 RGB scaled to [0, 1], then normalised with the mean and std above (they are in config.json's
`pretrained_cfg`). `reference_logits.json` holds the logits of {N_REFERENCE} test images (`tests/test_mini_vit.py`
checks that a reload reproduces them).
"""


def main(argv: list[str] | None = None) -> dict:
    argv = list(sys.argv[1:] if argv is None else argv)
    cfg = parse_config(Config, argv, __doc__)
    torch.set_num_threads(cfg.threads)
    t0 = time.perf_counter()
    per_class = 8 if cfg.quick else None
    train = load_image_zip(cfg.train_zip, per_class)[:2]
    test = load_image_zip(cfg.test_zip, per_class)[:2]
    model = build_model(cfg)
    params = sum(p.numel() for p in model.parameters())
    print(f"{ARCH} {cfg.model_args()}: {params:,} parameters; {len(train[0])} train / {len(test[0])} test images")
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
        prepare_train=prepare(train=True),
        prepare_test=prepare(train=False),
        desc="pretrain",
        progress=cfg.progress,
    )
    fit_d = dataclasses.asdict(fit)
    print(f"test accuracy {fit.test_accuracy:.4f}, train {fit.train_accuracy:.4f}, {fit.seconds:.0f} s")

    out = Path(cfg.out).resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        save_checkpoint(model.eval(), tmp, cfg)
        reloaded_model = load_checkpoint(tmp)
        reloaded = accuracy(reloaded_model, *test, prepare(train=False))
        ref = reference_logits(reloaded_model, cfg.test_zip)
        (tmp / "reference_logits.json").write_text(json.dumps(ref, indent=1) + "\n")
        env = environment()
        md = training_md(
            cfg,
            argv,
            fit_d,
            reloaded,
            {"train": len(train[0]), "test": len(test[0])},
            time.perf_counter() - t0,
            env,
            params,
        )
        (tmp / "TRAINING.md").write_text(md, encoding="utf-8")
        (tmp / "training_log.json").write_text(
            json.dumps(
                {
                    "config": dataclasses.asdict(cfg),
                    "fit": fit_d,
                    "reloaded_test_accuracy": reloaded,
                    "environment": env,
                    "wall_seconds": time.perf_counter() - t0,
                },
                indent=1,
            )
            + "\n"
        )
        for path in [tmp, *tmp.iterdir()]:  # mkdtemp makes the folder private
            path.chmod(0o755 if path.is_dir() else 0o644)
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    print(f"saved {out} (reloaded test accuracy {reloaded:.4f}) in {time.perf_counter() - t0:.0f} s")
    return {"fit": fit_d, "reloaded_test_accuracy": reloaded, "out": str(out)}


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: `recipes.command`
    from recipes.command import run_main  # a refusal in one line naming its flags

    run_main(main)
