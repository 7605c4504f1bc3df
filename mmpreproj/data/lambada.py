"""LAMBADA (OpenAI's detokenized test set, lm-eval's `lambada_openai`): text -> (context, target)."""

from __future__ import annotations

import json
import os

from .assets import asset_path, open_text
from .hub import load_hub_split

LAMBADA_FILE = ("data", "lambada_openai", "lambada_test.jsonl.gz")


def split_lambada(text: str) -> tuple[str, str] | None:
    """`(context, target)`: context is the text before the last space, target is " " + the last word.

    None when the text has no space (the paper's evaluator skips such examples; OpenAI's file has none).
    """
    parts = text.rsplit(" ", 1)
    if len(parts) != 2:
        return None
    return parts[0], " " + parts[1]


def lambada_examples(
    limit: int | None = None, source: str = "local", path: str | os.PathLike[str] | None = None
) -> list[dict[str, str | None]]:
    """The first `limit` test examples (all 5,153 when None) as `{"text", "context", "target"}` dicts.

    `source="local"` reads the shipped jsonl (or `path`); `source="hub"` loads `EleutherAI/lambada_openai`
    (`en`, test), the same texts. `context`/`target` are None when `split_lambada` cannot split the text.
    """
    if source == "hub":
        texts = list(load_hub_split("EleutherAI/lambada_openai", "en", "test")["text"])
    elif source == "local":
        with open_text(path or asset_path(*LAMBADA_FILE)) as f:
            texts = [json.loads(line)["text"] for line in f if line.strip()]
    else:
        raise ValueError(f"unknown data source {source!r}; expected 'local' or 'hub'")
    out: list[dict[str, str | None]] = []
    for text in texts[:limit]:
        context, target = split_lambada(text) or (None, None)
        out.append({"text": text, "context": context, "target": target})
    return out
