"""The paper's LAMBADA accuracy: the target word must be the greedy prediction at every one of its tokens."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from torch import nn

from .runtime import encode
from .scoring import score_continuations


def lambada_accuracy(
    model: nn.Module,
    tokenizer,
    examples: Sequence[Mapping[str, Any]],
    *,
    max_length: int = 512,
    batch_size: int = 8,
    progress: bool = True,
    per_item: bool = False,
) -> dict[str, Any]:
    """Accuracy over `{"context", "target"}` examples (from `mmpreproj.data.lambada_examples`).

    As in the paper's `evaluate_lambada`: the context and the target (" " + last word) are tokenized
    separately and their ids concatenated, so a multi-token target is teacher-forced token by token; an
    example is correct iff the argmax equals every target token. (A joint tokenization of the whole text
    can merge differently at the boundary; the paper, and we, do not use it.) Examples whose context and
    target together exceed `max_length` tokens, or that have no context/target, are skipped and not counted.

    Returns `{"acc", "ppl", "correct", "total", "skipped"}` with acc = correct / total and ppl =
    exp(-mean over examples of the summed log-likelihood of the target), lm-eval's `lambada_openai`
    perplexity (informative where a small model's accuracy is 0). With `per_item`, also `"item_logprob"` and
    `"item_correct"` per counted example (for bootstrap intervals).
    """
    requests = []
    skipped = 0
    for ex in examples:
        context, target = ex.get("context"), ex.get("target")
        ctx_ids = encode(tokenizer, context) if context else []
        tgt_ids = encode(tokenizer, target, special_tokens=False) if target else []
        if not ctx_ids or not tgt_ids or len(ctx_ids) + len(tgt_ids) > max_length:
            skipped += 1
            continue
        requests.append((ctx_ids, tgt_ids))
    scores = score_continuations(model, requests, batch_size, progress=progress, desc="lambada")
    correct = sum(s.greedy for s in scores)
    total = len(scores)
    ppl = math.exp(-sum(s.logprob for s in scores) / total) if total else float("nan")
    out = {
        "acc": correct / total if total else 0.0,
        "ppl": ppl,
        "correct": correct,
        "total": total,
        "skipped": skipped,
    }
    if per_item:
        out.update(item_logprob=[s.logprob for s in scores], item_correct=[int(s.greedy) for s in scores])
    return out
