"""Greedy decoding with a KV cache over a mixed prompt.

The prompt's rope offsets travel in the batch (`MixedBatch.next_position`), never on a module, so two calls
never share state. Generated token k of sample b sits at next_position[b] + k on all three axes
(= its prompt length + k + delta, Qwen2-VL's rule).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from .sequence import MixedBatch

__all__ = ["GenerateOutput", "generate"]


@dataclass
class GenerateOutput:
    """tokens (B, T) generated ids; logits (B, T, vocab) the scores each was picked from."""

    tokens: torch.Tensor
    logits: torch.Tensor


@torch.no_grad()
def generate(
    model: nn.Module, batch: MixedBatch, max_new_tokens: int, eos_token_id: int | None = None
) -> GenerateOutput:
    """Greedy decoding: one prefill of the left-padded prompt, then one cached step per new token.

    After a sample emits `eos_token_id`, it keeps emitting it (the batch runs until every sample is done
    or `max_new_tokens` is reached).
    """
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    decoder = model.decoder
    cache = decoder.new_cache()
    mask = batch.attention_mask
    logits, cache = model(**batch.decoder_inputs(), cache=cache)
    step = logits[:, -1]  # (B, vocab)
    tokens, scores = [], []
    done = torch.zeros(step.shape[0], dtype=torch.bool, device=step.device)
    for k in range(max_new_tokens):
        nxt = step.argmax(-1)  # (B,)
        if eos_token_id is not None:
            nxt = torch.where(done, torch.full_like(nxt, eos_token_id), nxt)
            done |= nxt == eos_token_id
        tokens.append(nxt)
        scores.append(step)
        if k == max_new_tokens - 1 or bool(done.all()):
            break
        mask = torch.cat([mask, mask.new_ones(mask.shape[0], 1)], dim=1)  # (B, S + k + 1)
        pos = (batch.next_position + k)[:, None, None].expand(-1, 1, 3)  # (B, 1, 3)
        logits, cache = model(decoder.embed(nxt[:, None]), mask, pos, cache=cache)
        step = logits[:, -1]
    return GenerateOutput(torch.stack(tokens, 1), torch.stack(scores, 1))
