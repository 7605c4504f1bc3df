"""Numerics of a run: bf16 autocast around the forward pass, and the paper's pure-bf16 trainable weights.

Under `autocast` the injected weights stay fp32 (master weights); matmuls run in bf16 and AdamW updates the
fp32 copy, so an update of lr=1e-5 on a weight of size ~0.01 is kept. `cast_trainable_` reproduces the
paper's setting where the new weights themselves are bf16: such an update is below half a bf16 ulp
(2^-14 ~ 6e-5 at 0.01) and most of them round away.
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn


def autocast(precision: str, device: torch.device) -> contextlib.AbstractContextManager:
    """`torch.autocast(device.type, bfloat16)` for precision "bf16" (CPU too), a no-op for "fp32"."""
    if precision == "bf16":
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    if precision == "fp32":
        return contextlib.nullcontext()
    raise ValueError(f"precision={precision!r}; allowed values: ['bf16', 'fp32']")


@torch.no_grad()
def cast_trainable_(model: nn.Module, dtype: torch.dtype = torch.bfloat16) -> int:
    """Cast every trainable parameter of `model` to `dtype` in place; returns how many tensors changed."""
    n = 0
    for p in model.parameters():
        if p.requires_grad and p.dtype != dtype:
            p.data = p.data.to(dtype)
            n += 1
    return n


def trainable_dtypes(model: nn.Module) -> set[torch.dtype]:
    """The dtypes of the trainable parameters."""
    return {p.dtype for p in model.parameters() if p.requires_grad}
