"""WikiText-103 raw: rows as the Hub's `wikitext-103-raw-v1` gives them, whole articles, lm-eval's detokenizer."""

from __future__ import annotations

import os
import re

from .assets import asset_path, open_text
from .hub import DataUnavailableError, load_hub_split

# The shipped files are WikiText-2's raw valid/test, which are also WikiText-103's (assets/data/README.md).
WIKITEXT_FILES = {"validation": "wiki.valid.raw.gz", "test": "wiki.test.raw.gz"}
_SPLITS = {"validation": "validation", "valid": "validation", "test": "test", "train": "train", "heldout": "heldout"}
# "heldout": the validation rows from this one on (520 rows, 228 of them longer than 50 characters). A preset
# that trains on validation lines and chooses its learning rates on held-out rows takes at most the first 1,500
# lines longer than 50 characters, which end at row 3,239 (`tests/test_gguf_source.py` checks the smollm2 one).
HELDOUT_FROM = 3240
# An article starts at a level-1 heading line: " = Title = " (a section is " = = Section = = ").
_ARTICLE_HEADING = re.compile(r"^ = [^=].* = $")


def _split_name(split: str) -> str:
    if split not in _SPLITS:
        raise ValueError(f"unknown WikiText split {split!r}; expected one of {sorted(set(_SPLITS.values()))}")
    return _SPLITS[split]


def wikitext_lines(
    split: str = "validation", source: str = "local", path: str | os.PathLike[str] | None = None
) -> list[str]:
    """Raw WikiText-103 rows, one per line of `wiki.<split>.raw`, in file order.

    Rows match the Hub's `wikitext`/`wikitext-103-raw-v1`: a row keeps its trailing "\\n" and a blank line is
    "" (the validation split has 3,760 rows, test 4,358). `split="heldout"` is the validation rows from
    `HELDOUT_FROM` on, for choosing learning rates on rows neither trained on nor tested. `source="local"` reads
    the shipped file (or `path`);
    `source="hub"` downloads with `datasets` (the only way to get `train`).
    """
    split = _split_name(split)
    if split == "heldout":
        return wikitext_lines("validation", source, path)[HELDOUT_FROM:]
    if source == "hub":
        return list(load_hub_split("wikitext", "wikitext-103-raw-v1", split)["text"])
    if source != "local":
        raise ValueError(f"unknown data source {source!r}; expected 'local' or 'hub'")
    if path is None:
        if split not in WIKITEXT_FILES:
            raise DataUnavailableError(f"WikiText-103 '{split}' is not shipped; use --data-source hub or pass a path")
        path = asset_path("data", "wikitext-103-raw", WIKITEXT_FILES[split])
    with open_text(path) as f:
        return [line if line.strip() else "" for line in f]


def wikitext_articles(
    split: str = "test", source: str = "local", path: str | os.PathLike[str] | None = None
) -> list[str]:
    """Whole articles: the rows from one ` = Title = ` heading up to the next, joined back into one text.

    Rows before the first heading (a blank line) are dropped. The test split gives 62 articles, the count
    lm-eval's document-level WikiText has (two of them are formula lines that look like headings).
    """
    articles: list[list[str]] = []
    for row in wikitext_lines(split, source, path):
        if _ARTICLE_HEADING.match(row.rstrip("\n")):
            articles.append([])
        if articles:
            articles[-1].append(row if row else " \n")  # a blank row is " \n" in the raw file
    return ["".join(rows) for rows in articles]


def wikitext_detokenize(text: str) -> str:
    """Undo WikiText's tokenization (`@-@`, spaced punctuation, ...), exactly as lm-eval's `wikitext` task does.

    This is the GPT-2 / Megatron-LM detokenizer that lm-eval's `preprocess_wikitext.wikitext_detokenizer` applies.
    """
    s = text
    # contractions
    s = s.replace("s '", "s'")
    s = re.sub(r"/' [0-9]/", r"/'[0-9]/", s)
    # number separators
    s = s.replace(" @-@ ", "-").replace(" @,@ ", ",").replace(" @.@ ", ".")
    # punctuation
    for p in (":", ";", ".", "!", "?", ","):
        s = s.replace(f" {p} ", f"{p} ")
    # brackets and quotes
    s = re.sub(r"\(\s*([^\)]*?)\s*\)", r"(\1)", s)
    s = re.sub(r"\[\s*([^\]]*?)\s*\]", r"[\1]", s)
    s = re.sub(r"{\s*([^}]*?)\s*}", r"{\1}", s)
    s = re.sub(r"\"\s*([^\"]*?)\s*\"", r'"\1"', s)
    s = re.sub(r"'\s*([^']*?)\s*'", r"'\1'", s)
    # miscellaneous
    s = s.replace("= = = =", "====").replace("= = =", "===").replace("= =", "==")
    s = s.replace(" " + chr(176) + " ", chr(176))
    s = s.replace(" \n", "\n").replace("\n ", "\n")
    s = s.replace(" N ", " 1 ")
    s = s.replace(" 's", "'s")
    return s
