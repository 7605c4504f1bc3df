"""Running a model for evaluation: eval mode and no_grad, restoring every module's training flag afterwards."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch
from torch import nn


@contextmanager
def inference_mode(model: nn.Module) -> Iterator[nn.Module]:
    """`model.eval()` under `torch.no_grad()`; on exit each submodule gets back its own `training` flag."""
    flags = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        with torch.no_grad():
            yield model
    finally:
        for m, training in flags:
            m.training = training


def model_device(model: nn.Module) -> torch.device:
    """The device inputs must go to: `model.device` when defined, else that of the first parameter."""
    device = getattr(model, "device", None)
    if isinstance(device, torch.device):
        return device
    param = next(model.parameters(), None)
    return param.device if param is not None else torch.device("cpu")


def encode(tokenizer, text: str, *, special_tokens: bool = True) -> list[int]:
    """Token ids of `text`. `special_tokens=True` lets the tokenizer add what it adds to a whole input (a BOS
    for Llama-style tokenizers, nothing for Pythia's); continuations are encoded with `special_tokens=False`.
    """
    # verbose=False: the evaluators window or cut long texts themselves, so transformers' "sequence length is
    # longer than the specified maximum ... indexing errors" warning would be noise
    ids: Sequence[int] = tokenizer(text, add_special_tokens=special_tokens, verbose=False)["input_ids"]
    return list(ids)
