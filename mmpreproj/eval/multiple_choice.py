"""The paper's multiple-choice scoring (HellaSwag, ARC-Easy): the highest mean log-prob per choice token wins."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from torch import nn

from .runtime import encode
from .scoring import score_continuations


def choice_requests(tokenizer, context: str, choice: str, max_length: int = 512) -> tuple[list[int], list[int]]:
    """`(context_ids, choice_ids)` the way the paper's evaluators split `context + " " + choice`.

    The joined text is tokenized once and cut to `max_length`; the first len(tokenize(context)) ids are the
    context and the rest are the choice (empty if truncation left nothing of it).
    """
    full = encode(tokenizer, context + " " + choice)[:max_length]
    n_ctx = len(encode(tokenizer, context))
    return full[:n_ctx], full[n_ctx:]


def multiple_choice_accuracy(
    model: nn.Module,
    tokenizer,
    items: Sequence[tuple[str, Sequence[str], int]],
    *,
    max_length: int = 512,
    batch_size: int = 8,
    progress: bool = True,
    desc: str = "multiple choice",
    per_item: bool = False,
) -> dict[str, Any]:
    """Accuracy over `(context, choices, label)` items: each choice is scored as `context + " " + choice` by
    its mean token log-prob and the prediction is the first argmax. A choice with nothing left to score
    scores 0.0, as in the paper's code (`sum / max(n, 1)`).

    Returns `{"acc", "correct", "total"}`, plus `"item_correct"` (0/1 per item) when `per_item`.
    """
    requests: list[tuple[list[int], list[int]]] = []
    slots: list[tuple[int, int]] = []  # (item, choice) of each request
    for i, (context, choices, _) in enumerate(items):
        for j, choice in enumerate(choices):
            ctx_ids, cont_ids = choice_requests(tokenizer, context, choice, max_length)
            if ctx_ids and cont_ids:
                requests.append((ctx_ids, cont_ids))
                slots.append((i, j))
    scores = score_continuations(model, requests, batch_size, progress=progress, desc=desc)
    table = [[0.0] * len(choices) for _, choices, _ in items]
    for (i, j), s in zip(slots, scores):
        table[i][j] = s.logprob / s.n_tokens
    preds = [max(range(len(row)), key=row.__getitem__) for row in table]
    hits = [int(p == label) for p, (_, _, label) in zip(preds, items)]
    correct, total = sum(hits), len(items)
    out = {"acc": correct / total if total else 0.0, "correct": correct, "total": total}
    return {**out, "item_correct": hits} if per_item else out


def hellaswag_accuracy(
    model: nn.Module, tokenizer, examples: Sequence[Mapping[str, Any]], **kwargs: Any
) -> dict[str, Any]:
    """The paper's HellaSwag: each of the 4 endings scored as `ctx + " " + ending` (raw `ctx`, no activity
    label, no lm-eval preprocessing). Keyword arguments go to `multiple_choice_accuracy`."""
    items = [(ex["ctx"], ex["endings"], int(ex["label"])) for ex in examples]
    return multiple_choice_accuracy(model, tokenizer, items, desc="hellaswag", **kwargs)


def arc_easy_accuracy(
    model: nn.Module, tokenizer, examples: Sequence[Mapping[str, Any]], **kwargs: Any
) -> dict[str, Any]:
    """The paper's ARC-Easy: `question + " " + choice`, mean token log-prob of the choice. Questions whose
    answer key is not among the choice labels (`label` None) are skipped, as in the paper."""
    items = [(ex["question"], ex["choices"], int(ex["label"])) for ex in examples if ex.get("label") is not None]
    result = multiple_choice_accuracy(model, tokenizer, items, desc="arc_easy", **kwargs)
    result["skipped"] = len(examples) - len(items)
    return result
