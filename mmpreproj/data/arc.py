"""ARC-Easy validation (AI2 Reasoning Challenge), from the Hub only: no copy ships with mmpreproj."""

from __future__ import annotations

from typing import Any

from .hub import DataUnavailableError, load_hub_split


def arc_easy_examples(limit: int | None = None, source: str = "hub") -> list[dict[str, Any]]:
    """The first `limit` ARC-Easy validation questions from `allenai/ai2_arc` (`ARC-Easy`).

    Each is `{"question", "choices" (texts), "choice_labels", "answer_key", "label"}`, where `label` is the
    index of `answer_key` in `choice_labels`, or None when the key is missing (the paper skips those).
    """
    if source == "local":
        raise DataUnavailableError(
            "ARC-Easy is not shipped with mmpreproj; it needs the Hugging Face Hub "
            "('allenai/ai2_arc', 'ARC-Easy'): use --data-source hub with network access"
        )
    if source != "hub":
        raise ValueError(f"unknown data source {source!r}; expected 'local' or 'hub'")
    out = []
    for row in load_hub_split("allenai/ai2_arc", "ARC-Easy", "validation"):
        if limit is not None and len(out) >= limit:
            break
        labels = list(row["choices"]["label"])
        key = row["answerKey"]
        out.append(
            {
                "question": row["question"],
                "choices": list(row["choices"]["text"]),
                "choice_labels": labels,
                "answer_key": key,
                "label": labels.index(key) if key in labels else None,
            }
        )
    return out
