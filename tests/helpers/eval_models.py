"""Shared pieces of the evaluator tests: a tiny Pythia-shaped model and a logit-forcing wrapper."""

from __future__ import annotations

from types import SimpleNamespace

import torch
from torch import nn


def tiny_pythia(seed: int = 0) -> nn.Module:
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    cfg = GPTNeoXConfig(
        vocab_size=50304, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
        rotary_pct=0.25, max_position_embeddings=1024,
    )  # fmt: skip
    torch.manual_seed(seed)
    return GPTNeoXForCausalLM(cfg).eval()


class ForcedNext(nn.Module):
    """Wraps a causal LM; after the exact prefix `p` it adds `bonus` to the logit of `forced[p]`. Has what
    lm-eval's HFLM needs of an in-memory model: `config`, `device`, `tie_weights`."""

    def __init__(self, model: nn.Module, forced: dict[tuple[int, ...], int], bonus: float = 100.0):
        super().__init__()
        self.model, self.forced, self.bonus = model, forced, bonus
        self.config = model.config

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    def tie_weights(self) -> None:
        pass

    def forward(self, input_ids, attention_mask=None, **_):
        logits = self.model(input_ids=input_ids, attention_mask=attention_mask).logits.clone()
        for b in range(input_ids.shape[0]):
            for t in range(input_ids.shape[1]):
                tok = self.forced.get(tuple(input_ids[b, : t + 1].tolist()))
                if tok is not None:
                    logits[b, t, tok] += self.bonus
        return SimpleNamespace(logits=logits)
