"""The frozen vision tower: DINOv2-S/14 patch tokens of every CIFAR image, computed once and cached.

Each 32 px image is upsampled to 112 px (bicubic), normalised with ImageNet's mean/std and run through the
tower; its 8 x 8 patch tokens (`last_hidden_state` less the class token) are average-pooled `pool` x `pool`
(2: a 4 x 4 grid of 384-wide tokens). The tower never trains, so every arm reads the same cached features:
one file per (tower weights, size, pool) under the run folder, keyed by a digest of the tower's weights.

    tower = load_tower("dinov2-small")       # real weights (mmpreproj.data.model_source), or "random-small"
    feats = cached_features(tower, "runs/vlm/features", images_by_split, log=times)   # {split: (N, 4, 4, D)}
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn

IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
TOWERS = ("dinov2-small", "random-small", "random-tiny")


def load_tower(name: str) -> nn.Module:
    """A frozen `transformers.Dinov2Model` in eval mode: "dinov2-small" (the real DINOv2-S/14 from
    `mmpreproj.data.model_source.pretrained_source`), "random-small" (its shape, random weights: a dry run
    before the weights are installed) or "random-tiny" (width 32, 2 layers: tests)."""
    from transformers import Dinov2Config, Dinov2Model

    if name == "dinov2-small":
        from mmpreproj.data.model_source import pretrained_source

        folder, kwargs = pretrained_source("dinov2-small")
        tower = Dinov2Model.from_pretrained(folder, **kwargs)
    elif name in ("random-small", "random-tiny"):
        small = name == "random-small"
        torch.manual_seed(0)
        tower = Dinov2Model(
            Dinov2Config(
                hidden_size=384 if small else 32,
                num_hidden_layers=12 if small else 2,
                num_attention_heads=6 if small else 2,
                patch_size=14,
                image_size=518 if small else 112,
            )
        )
    else:
        raise ValueError(f"tower must be one of {TOWERS}, got {name!r}")
    tower.requires_grad_(False)
    return tower.eval()


def weights_digest(module: nn.Module) -> str:
    """sha256 over the state dict (names, shapes, dtypes and bytes), 12 hex digits: the cache key."""
    h = hashlib.sha256()
    for name, t in sorted(module.state_dict().items()):
        h.update(f"{name}{tuple(t.shape)}{t.dtype}".encode())
        h.update(t.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:12]


@torch.no_grad()
def patch_grid(tower: nn.Module, images: torch.Tensor, size: int = 112, pool: int = 2) -> torch.Tensor:
    """uint8 images (N, 3, H, W) -> pooled patch tokens (N, G, G, D) float32, G = size / patch / pool."""
    patch = tower.config.patch_size
    if size % patch or (size // patch) % pool:
        raise ValueError(f"size {size} must be a multiple of patch {patch} * pool {pool}")
    side = size // patch  # patches per side (8)
    device = next(tower.parameters()).device  # the tower's device; the tokens come back to the CPU (the cache)
    x = images.to(device).float() / 255
    x = F.interpolate(x, size=(size, size), mode="bicubic", align_corners=False).clamp(0, 1)
    mean = torch.tensor(IMAGENET_MEAN, device=device).view(1, 3, 1, 1)
    std = torch.tensor(IMAGENET_STD, device=device).view(1, 3, 1, 1)
    h = tower(pixel_values=(x - mean) / std).last_hidden_state[:, 1:]  # (N, side*side, D): class token dropped
    grid = h.reshape(-1, side, side, h.shape[-1]).permute(0, 3, 1, 2)  # (N, D, side, side)
    return F.avg_pool2d(grid, pool).permute(0, 2, 3, 1).contiguous().cpu()  # (N, G, G, D)


def cached_features(
    tower: nn.Module,
    folder: str | Path,
    splits: dict[str, torch.Tensor],
    *,
    name: str,
    size: int = 112,
    pool: int = 2,
    batch: int = 50,
    times: Path | None = None,
) -> dict[str, torch.Tensor]:
    """{split: (N, G, G, D)} for each split's uint8 images, read from `folder` or computed once and saved.

    `times`: a JSONL file that gets one line per batch computed ({"kind": "features", "cpu_s", "wall_s"}),
    so the feature pass counts in the study's CPU-hours.
    """
    key = f"{name}-{weights_digest(tower)}-s{size}-p{pool}"
    path = Path(folder) / f"{key}.safetensors"
    counts = {s: int(x.shape[0]) for s, x in splits.items()}
    if path.is_file():
        saved = load_file(path)
        if all(s in saved and saved[s].shape[0] == n for s, n in counts.items()):
            return {s: saved[s] for s in splits}
    out = {}
    for split, images in splits.items():
        chunks = []
        for i in range(0, images.shape[0], batch):
            t0, c0 = time.perf_counter(), time.process_time()
            chunks.append(patch_grid(tower, images[i : i + batch], size, pool))
            if times is not None:
                line = {"kind": "features", "split": split, "n": len(chunks[-1])}
                line.update(cpu_s=time.process_time() - c0, wall_s=time.perf_counter() - t0)
                with open(times, "a") as f:
                    f.write(json.dumps(line) + "\n")
        out[split] = torch.cat(chunks)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    save_file(out, str(tmp), metadata={"key": key, **{k: str(v) for k, v in counts.items()}})
    tmp.replace(path)
    return out
