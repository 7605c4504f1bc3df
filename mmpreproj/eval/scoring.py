"""The one place that does the logit math: log-likelihood of continuations given contexts, batched.

Every evaluator (line PPL, LAMBADA, HellaSwag, ARC-Easy, rolling document PPL) reduces its task to
`(context_ids, continuation_ids)` requests and calls `score_continuations`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch
from torch import nn
from tqdm.auto import tqdm

from .runtime import inference_mode, model_device

# b - batch, s - padded input length, v - vocabulary, n - continuation length


class ContinuationScore(NamedTuple):
    """Result for one request."""

    logprob: float  # sum over continuation tokens of log p(token | everything before it)
    n_tokens: int  # number of continuation tokens
    greedy: bool  # every continuation token is the argmax of its (teacher-forced) prediction


def _check(requests: Sequence[tuple[Sequence[int], Sequence[int]]]) -> None:
    for i, (ctx, cont) in enumerate(requests):
        if len(ctx) == 0 or len(cont) == 0:
            raise ValueError(f"request {i}: context and continuation must both be non-empty token lists")


def score_continuations(
    model: nn.Module,
    requests: Sequence[tuple[Sequence[int], Sequence[int]]],
    batch_size: int = 8,
    *,
    pad_id: int = 0,
    progress: bool = False,
    desc: str = "scoring",
) -> list[ContinuationScore]:
    """Score each `(context_ids, continuation_ids)` request with one teacher-forced forward pass.

    The model sees `(context + continuation)[:-1]`; the logits at the last `n` positions predict the `n`
    continuation tokens. Requests are sorted by length, right-padded with `pad_id` and masked, so the
    results equal one-at-a-time scoring up to float rounding. Log-softmax is taken in float32 whatever the
    model dtype. Nothing is truncated here: callers decide what fits. Results come back in request order.

    Args:
        model: a causal LM, `model(input_ids=..., attention_mask=...).logits` of shape (b, s, v).
        requests: token-id pairs, both non-empty.
        batch_size: sequences per forward pass.
        pad_id: id written into padded positions (they are masked and never scored).
        progress: show a tqdm bar over batches.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    _check(requests)
    order = sorted(range(len(requests)), key=lambda i: -(len(requests[i][0]) + len(requests[i][1])))
    results: list[ContinuationScore | None] = [None] * len(requests)
    device = model_device(model)
    batches = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
    with inference_mode(model):
        for batch in tqdm(batches, desc=desc, disable=not progress, leave=False):
            seqs = [list(requests[i][0]) + list(requests[i][1]) for i in batch]
            width = max(len(s) for s in seqs) - 1
            input_ids = torch.full((len(batch), width), pad_id, dtype=torch.long)  # (b, s)
            mask = torch.zeros((len(batch), width), dtype=torch.long)  # (b, s)
            for row, seq in enumerate(seqs):
                input_ids[row, : len(seq) - 1] = torch.tensor(seq[:-1])
                mask[row, : len(seq) - 1] = 1
            logits = model(input_ids=input_ids.to(device), attention_mask=mask.to(device)).logits  # (b, s, v)
            for row, i in enumerate(batch):
                cont = torch.tensor(list(requests[i][1]), device=logits.device)  # (n,)
                end = len(seqs[row]) - 1
                logprobs = torch.log_softmax(logits[row, end - len(cont) : end].float(), dim=-1)  # (n, v)
                token_lp = logprobs.gather(-1, cont[:, None]).squeeze(-1)  # (n,)
                greedy = bool((logprobs.argmax(dim=-1) == cont).all())
                results[i] = ContinuationScore(float(token_lp.sum()), len(cont), greedy)
    return results  # type: ignore[return-value]
