"""transformers' and the hub's own progress bars (loading weights, downloads), switched off for a call."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from transformers.utils import logging as hf_logging


@contextlib.contextmanager
def library_progress_bars(enabled: bool) -> Iterator[None]:
    """Inside, transformers' and huggingface_hub's bars are off unless `enabled`; after, as they were (the
    command's `--no-progress` covers them too, not only ours)."""
    was_on = hf_logging.is_progress_bar_enabled()
    if not enabled:
        hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_on and not enabled:
            hf_logging.enable_progress_bar()
