"""HellaSwag validation examples in the original `rowanz/hellaswag` schema."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from typing import Any

from .assets import asset_path, open_text
from .hub import load_hub_split

# A fixed 1,000-example subset of the 10,042 validation examples, in random order (assets/data/README.md).
HELLASWAG_FILE = ("data", "hellaswag", "hellaswag_val_subset1000.jsonl.gz")
_FIELDS = ("ctx", "endings", "label", "activity_label", "ctx_a", "ctx_b")


def _example(row: Mapping[str, Any]) -> dict[str, Any]:
    ex = {k: row[k] for k in _FIELDS}
    ex["label"] = int(ex["label"])  # the Hub stores it as a string
    ex["endings"] = list(ex["endings"])
    return ex


def hellaswag_examples(
    limit: int | None = None, source: str = "local", path: str | os.PathLike[str] | None = None
) -> list[dict[str, Any]]:
    """The first `limit` examples as dicts with `ctx, endings (4), label (int), activity_label, ctx_a, ctx_b`.

    `source="hub"` loads `Rowan/hellaswag` validation, whose first 500 are the paper's. `source="local"` reads
    the shipped 1,000-example subset (or `path`, any jsonl in this schema): its rows are a random sample of
    the validation set, so its "first 500" are not the paper's 500.
    """
    rows: Iterable[Mapping[str, Any]]
    if source == "hub":
        rows = load_hub_split("Rowan/hellaswag", None, "validation")
    elif source == "local":
        with open_text(path or asset_path(*HELLASWAG_FILE)) as f:
            rows = [json.loads(line) for line in f if line.strip()]
    else:
        raise ValueError(f"unknown data source {source!r}; expected 'local' or 'hub'")
    out = []
    for row in rows:
        if limit is not None and len(out) >= limit:
            break
        out.append(_example(row))
    return out
