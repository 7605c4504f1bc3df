"""The learning-rate schedule: linear warmup, then cosine decay (or constant).

The warmup starts at `lr / (W + 1)`, not 0 (as nanoGPT's): every optimizer step trains, so `--steps 2` is
not half a run at lr 0. From step W on the factor is `transformers.get_cosine_schedule_with_warmup`'s (the
paper's Trainer, whose first step takes lr 0), with an optional floor `min_ratio`:

    f(s) = (s + 1) / (W + 1)                                     s < W
    f(s) = m + (1 - m) * 0.5 * (1 + cos(pi * (s - W) / (T - W)))  s >= W   (cosine; 1 for constant)

Runs made before 0.6.0 (the mini tables and the SmolLM2 CPU study of 0.5.0) used `f(s) = s / W` in warmup.
"""

from __future__ import annotations

import functools
import math

import torch


def lr_factor(step: int, *, warmup: int, total: int, kind: str = "cosine", min_ratio: float = 0.0) -> float:
    """Multiplier of the base LR for the optimizer step with 0-based index `step`."""
    if step < warmup:
        return (step + 1) / (warmup + 1)
    if kind == "constant":
        return 1.0
    if kind != "cosine":
        raise ValueError(f"schedule={kind!r}; allowed values: ['cosine', 'constant']")
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def make_scheduler(
    optimizer: torch.optim.Optimizer, *, warmup: int, total: int, kind: str = "cosine", min_ratio: float = 0.0
) -> torch.optim.lr_scheduler.LambdaLR:
    """A `LambdaLR` applying `lr_factor`; its state_dict is plain numbers (checkpointable)."""
    factor = functools.partial(lr_factor, warmup=warmup, total=total, kind=kind, min_ratio=min_ratio)
    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
