"""Standard perplexity: whole documents, token-weighted, with rolling windows (lm-eval's `wikitext` metrics)."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from typing import Any

from torch import nn

from .runtime import encode
from .scoring import score_continuations


def rolling_windows(
    tokens: Sequence[int], max_length: int, prefix_token: int, stride: int | None = None
) -> list[tuple[list[int], list[int]]]:
    """Split one document into `(context_ids, continuation_ids)` windows that score every token once.

    The document is prefixed with `prefix_token` (BOS, else EOS) so its first token is scored too. The first
    window scores up to `max_length` tokens; each later one scores the next `stride` tokens (default
    `max_length`) with as much preceding context as fits in `max_length` inputs.

    With the default stride the windows are disjoint and the last one is given a full context: exactly
    lm-eval's `loglikelihood_rolling` (`get_rolling_token_windows` + `make_disjoint_window`, context_len=1).
    A smaller stride is the overlapping "sliding window" of the transformers perplexity guide: every window
    but the first sees `max_length - stride` tokens of extra context, and only its new tokens are scored.
    """
    stride = max_length if stride is None else stride
    if not 1 <= stride <= max_length:
        raise ValueError(f"stride must be in [1, max_length={max_length}], got {stride}")
    seq = [prefix_token, *tokens]  # targets are seq[1:]
    windows = []
    begin, end = 1, min(1 + max_length, len(seq))
    while begin < len(seq):
        start = max(0, end - 1 - max_length)  # the model sees seq[start:end-1], at most max_length ids
        windows.append((seq[start:begin], seq[begin:end]))
        begin, end = end, min(end + stride, len(seq))
    return windows


def _word_count(text: str) -> int:
    return len(re.split(r"\s+", text))  # lm-eval's count, on the original (not detokenized) document


def document_perplexity(
    model: nn.Module,
    tokenizer,
    documents: Sequence[str],
    *,
    max_length: int | None = None,
    stride: int | None = None,
    detokenize: Callable[[str], str] | None = None,
    batch_size: int = 8,
    progress: bool = True,
) -> dict[str, Any]:
    """Token-weighted perplexity over whole documents (e.g. `data.wikitext_articles("test")`).

    Each document (after `detokenize`, e.g. `data.wikitext_detokenize`, as lm-eval's `wikitext` does) is
    tokenized without special tokens and scored with `rolling_windows`; its total log-likelihood LL is summed
    over documents. Word and byte counts are taken on the original documents, as lm-eval does.

    `max_length` defaults to the model's `config.max_position_embeddings` (else 2048), lm-eval's default.

    Equal to lm-eval's `loglikelihood_rolling` for a tokenizer that adds no special tokens (Pythia's, every shipped
    number). For one that adds a BOS (Llama's), lm-eval 0.4.13 by default also scores the document's own BOS token
    after the prefix, one more token per document; it equals this with `HFLM(..., add_bos_token=False)`
    (`bench/eval_audit.py`, case `bos`).

    Returns `{"token_perplexity" = exp(-LL / tokens), "word_perplexity" = exp(-LL / words),
    "byte_perplexity" = exp(-LL / bytes), "bits_per_byte" = -LL / bytes / ln 2, "loglikelihood", "tokens",
    "words", "bytes", "documents"}`.
    """
    if max_length is None:
        max_length = int(getattr(getattr(model, "config", None), "max_position_embeddings", 0) or 2048)
    prefix = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
    requests = []
    for doc in documents:
        ids = encode(tokenizer, detokenize(doc) if detokenize else doc, special_tokens=False)
        requests.extend(rolling_windows(ids, max_length, prefix, stride))
    scores = score_continuations(model, requests, batch_size, progress=progress, desc="document ppl")
    ll = sum(s.logprob for s in scores)
    tokens = sum(s.n_tokens for s in scores)
    words = sum(_word_count(d) for d in documents)
    n_bytes = sum(len(d.encode("utf-8")) for d in documents)
    return {
        "token_perplexity": math.exp(-ll / tokens),
        "word_perplexity": math.exp(-ll / words),
        "byte_perplexity": math.exp(-ll / n_bytes),
        "bits_per_byte": -ll / n_bytes / math.log(2),
        "loglikelihood": ll,
        "tokens": tokens,
        "words": words,
        "bytes": n_bytes,
        "documents": len(documents),
    }
