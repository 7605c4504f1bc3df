"""A small supervised training loop for the vision recipes: AdamW, warmup + cosine, accuracy on a test set."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn
from tqdm import tqdm

__all__ = ["FitResult", "accuracy", "correct_items", "fit_classifier", "log_interval"]

Batch = Callable[[torch.Tensor, torch.Generator | None], torch.Tensor]  # uint8 batch -> model input


@dataclass
class FitResult:
    """What one training run gives back (JSON-able via `dataclasses.asdict`)."""

    test_accuracy: float
    train_accuracy: float
    final_train_loss: float
    seconds: float
    trainable_params: int
    loss_curve: list[float] = field(default_factory=list)  # mean train loss per logging window


def log_interval(steps: int, log_every: int = 20) -> int:
    """Steps per logged loss point: `log_every`, shortened so a run of `steps` logs at least 8 points (a smoke
    run of 8 steps logs every step; a curve of one point would draw nothing)."""
    return max(1, min(log_every, steps // 8))


@torch.no_grad()
def correct_items(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, prepare: Batch, batch_size: int = 256
) -> torch.Tensor:
    """Per-image top-1 correctness of `model(prepare(x))` against labels y (bool (N,)), in eval mode."""
    was_training = model.training
    model.eval()
    hits = [
        model(prepare(x[i : i + batch_size], None)).argmax(-1) == y[i : i + batch_size]
        for i in range(0, len(x), batch_size)
    ]
    model.train(was_training)
    return torch.cat(hits) if hits else torch.zeros(0, dtype=torch.bool)


def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor, prepare: Batch, batch_size: int = 256) -> float:
    """Top-1 accuracy of `model(prepare(x))` against labels y, in eval mode."""
    return correct_items(model, x, y, prepare, batch_size).sum().item() / max(len(x), 1)


def fit_classifier(
    model: nn.Module,
    train: tuple[torch.Tensor, torch.Tensor],
    test: tuple[torch.Tensor, torch.Tensor] | None,
    *,
    steps: int,
    batch_size: int,
    lr: float,
    prepare_train: Batch,
    prepare_test: Batch,
    weight_decay: float = 0.05,
    warmup_steps: int = 0,
    seed: int = 0,
    log_every: int = 20,  # shortened for short runs (`log_interval`)
    desc: str = "train",
    progress: bool = True,
    score_train: bool = True,
    on_step: Callable[[int, float, float, float], None] | None = None,
    head: nn.Module | None = None,
    head_lr: float | None = None,
) -> FitResult:
    """Train the parameters of `model` that require grad with cross-entropy, then measure accuracy.

    Batches are drawn by a seeded generator (epochs of a random permutation), so two runs with the same
    seed see the same images in the same order whatever the model. The LR warms up linearly for
    `warmup_steps` and then follows a cosine to 0.

    `test=None` or `score_train=False` skip that accuracy (NaN in the result: a caller scoring per item itself
    need not pay for a second pass). `on_step(step, loss, wall_seconds, cpu_seconds)` is called after every
    optimizer step with that step's own times (`time.perf_counter`, `time.process_time`). `head` and
    `head_lr`: the parameters of `head` (a submodule of `model`) train at `head_lr` instead of `lr`, on the same
    schedule (a probe's head at the linear probe's LR, the adapter at its own).
    """
    x, y = train
    params = [p for p in model.parameters() if p.requires_grad]
    own = {id(p) for p in head.parameters()} if head is not None and head_lr is not None else set()
    groups = []
    for group_lr, members in (
        (lr, [p for p in params if id(p) not in own]),
        (head_lr, [p for p in params if id(p) in own]),
    ):
        for decays in (True, False):
            chosen = [p for p in members if (p.ndim >= 2) == decays]
            if chosen:
                groups.append({"params": chosen, "weight_decay": weight_decay if decays else 0, "lr": group_lr})
    for group in groups:
        group["base_lr"] = group["lr"]
    opt = torch.optim.AdamW(groups, lr=lr)

    def lr_at(step: int, base: float) -> float:
        """A group's LR at `step`: linear warm-up from base / warmup_steps, then a cosine to 0."""
        if step < warmup_steps:
            return base * (step + 1) / warmup_steps
        t = (step - warmup_steps) / max(steps - warmup_steps, 1)
        return base * 0.5 * (1 + math.cos(math.pi * t))

    g = torch.Generator().manual_seed(seed)
    order, cursor = torch.randperm(len(x), generator=g), 0
    model.train()
    log_every = log_interval(steps, log_every)
    curve, window = [], []
    start = time.perf_counter()
    bar = tqdm(range(steps), desc=desc, disable=not progress, mininterval=2.0)
    for step in bar:
        wall0, cpu0 = time.perf_counter(), time.process_time()
        if cursor + batch_size > len(x):
            order, cursor = torch.randperm(len(x), generator=g), 0
        idx = order[cursor : cursor + batch_size]
        cursor += batch_size
        for group in opt.param_groups:
            group["lr"] = lr_at(step, group["base_lr"])
        loss = F.cross_entropy(model(prepare_train(x[idx], g)), y[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        window.append(loss.item())
        if on_step is not None:
            on_step(step, window[-1], time.perf_counter() - wall0, time.process_time() - cpu0)
        if len(window) == log_every or step == steps - 1:
            curve.append(sum(window) / len(window))
            bar.set_postfix(loss=f"{curve[-1]:.3f}")
            window = []
    seconds = time.perf_counter() - start
    return FitResult(
        test_accuracy=accuracy(model, *test, prepare_test) if test is not None else float("nan"),
        train_accuracy=accuracy(model, *train, prepare_test) if score_train else float("nan"),
        final_train_loss=curve[-1] if curve else float("nan"),
        seconds=seconds,
        trainable_params=sum(p.numel() for p in params),
        loss_curve=curve,
    )
