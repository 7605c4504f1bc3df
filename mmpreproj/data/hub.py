"""Loading a split from the Hugging Face Hub with `datasets`, failing fast and in one line when offline."""

from __future__ import annotations

import os
import socket
from typing import Any
from urllib.parse import urlparse

from mmpreproj_tables.offline import hub_offline as hub_offline  # re-exported
from mmpreproj_tables.offline import offline_flags as offline_flags  # re-exported


class DataUnavailableError(RuntimeError):
    """A data set cannot be read from where it was asked for (no network, not shipped, not cached)."""


def hub_reachable(timeout: float = 3.0) -> bool:
    """True when a TCP connection to the Hub endpoint (`HF_ENDPOINT`, default huggingface.co) opens in time."""
    url = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    port = url.port or (80 if url.scheme == "http" else 443)
    try:
        with socket.create_connection((url.hostname or "huggingface.co", port), timeout=timeout):
            return True
    except OSError:
        return False


def load_hub_split(path: str, name: str | None, split: str, *, timeout: float = 3.0) -> Any:
    """`datasets.load_dataset(path, name, split=split)`, or a one-line `DataUnavailableError`.

    In offline mode (`HF_DATASETS_OFFLINE=1`) only the local `datasets` cache is tried. Otherwise the Hub is
    probed first (`timeout` seconds) so that a machine without network fails at once instead of retrying.
    """
    label = f"{path}/{name}" if name else path
    hint = "use --data-source local or pass a local path"
    if not hub_offline() and not hub_reachable(timeout):
        raise DataUnavailableError(f"cannot download '{label}' (no network?); {hint}")
    try:
        import datasets
    except ImportError as err:
        raise DataUnavailableError(f"cannot load '{label}': the `datasets` package is not installed; {hint}") from err
    try:
        return datasets.load_dataset(path, name, split=split)
    except Exception as err:  # datasets raises ConnectionError, FileNotFoundError, ValueError, ... offline
        why = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
        raise DataUnavailableError(f"cannot download '{label}' (no network?): {why}; {hint}") from None
