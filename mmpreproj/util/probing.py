"""`probing`: eval mode on a forked RNG for a probe forward (trace_seams, `inject(example_input=...)`)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn


@contextlib.contextmanager
def probing(model: nn.Module) -> Iterator[None]:
    """Eval mode and a forked RNG (CPU and the model's CUDA devices) for the block; every submodule's
    `training` flag and the caller's RNG state are put back afterwards."""
    training = [(m, m.training) for m in model.modules()]
    cuda = sorted(
        {
            torch.cuda.current_device() if t.device.index is None else t.device.index
            for t in (*model.parameters(), *model.buffers())
            if t.device.type == "cuda"
        }
    )
    with torch.random.fork_rng(devices=cuda):
        try:
            model.eval()
            yield
        finally:
            for m, flag in training:
                m.training = flag
