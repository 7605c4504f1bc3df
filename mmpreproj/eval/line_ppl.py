"""The paper's perplexity: every row scored alone, PPL = exp(mean over rows of the row's mean token loss)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from torch import nn

from .runtime import encode
from .scoring import score_continuations


def line_perplexity(
    model: nn.Module,
    tokenizer,
    rows: Sequence[str],
    *,
    max_length: int = 512,
    min_chars: int = 50,
    min_tokens: int = 10,
    batch_size: int = 8,
    progress: bool = True,
    per_item: bool = False,
) -> dict[str, Any]:
    """Line-level perplexity as in the paper's `evaluate_perplexity` (arXiv 2604.10791; the protocol is spelled
    out below).

    Pass the first N rows (paper: 300 of `wikitext-103-raw-v1` validation). A row with fewer than
    `min_chars` characters once stripped, or fewer than `min_tokens` tokens, is skipped; the rest are
    truncated to `max_length` tokens. A row's loss is the mean negative log-likelihood of its tokens after
    the first, and PPL = exp(mean of row losses): rows count equally, whatever their length, which is why
    this is much higher than token-weighted document PPL.

    Returns `{"ppl", "mean_loss", "rows" (scored), "skipped", "tokens" (scored)}`, plus `"row_loss"` (each
    scored row's mean loss, for bootstrap intervals) when `per_item`.
    """
    requests = []
    skipped = 0
    for row in rows:
        ids = encode(tokenizer, row)[:max_length] if len(row.strip()) >= min_chars else []
        if len(ids) < max(min_tokens, 2):
            skipped += 1
            continue
        requests.append((ids[:1], ids[1:]))
    if not requests:
        raise ValueError(
            f"line ppl: none of the {len(rows)} rows given passed the filters (>= {min_chars} chars, >= {min_tokens} "
            "tokens); score more rows (`limit`, --limit; the paper's protocol reads the first 300)"
        )
    scores = score_continuations(model, requests, batch_size, progress=progress, desc="line ppl")
    losses = [-s.logprob / s.n_tokens for s in scores]
    mean_loss = sum(losses) / len(losses)
    out = {
        "ppl": math.exp(mean_loss),
        "mean_loss": mean_loss,
        "rows": len(losses),
        "skipped": skipped,
        "tokens": sum(s.n_tokens for s in scores),
    }
    return {**out, "row_loss": losses} if per_item else out
