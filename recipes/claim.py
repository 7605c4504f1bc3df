"""A checked sentence: a template whose numbers, filled from committed files, must appear verbatim in its page.

Shared by `recipes/headline.py` and `recipes/numbers_pages.py` (kept apart so neither imports the other's module
to get it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Claim:
    """`template.format(**values())` must occur in `page`; `sources` are the files `values` reads."""

    page: str
    template: str
    values: Callable[[], dict[str, float | str]]
    sources: tuple[str, ...]

    def text(self) -> str:
        return self.template.format(**self.values())
