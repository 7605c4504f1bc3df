"""Where the shipped assets live, and how to read one (plain or gzip-compressed)."""

from __future__ import annotations

import gzip
import os
from pathlib import Path
from typing import IO

__all__ = ["ASSETS_ENV", "asset_path", "open_text"]

ASSETS_ENV = "MMPREPROJ_ASSETS"


def asset_path(*parts: str) -> Path:
    """Path of a shipped asset: `$MMPREPROJ_ASSETS/<parts>` if set, else `<repo>/assets/<parts>`.

    The default is found relative to this package (`mmpreproj/data/` -> `../../assets`), so it works from a
    source checkout or an editable install; for any other install point `MMPREPROJ_ASSETS` at a copy.
    """
    root = os.environ.get(ASSETS_ENV)
    base = Path(root).expanduser() if root else Path(__file__).resolve().parents[2] / "assets"
    return base.joinpath(*parts)


def open_text(path: str | os.PathLike[str]) -> IO[str]:
    """Open a UTF-8 text file for reading, transparently decompressing `*.gz`.

    Raises a one-line `FileNotFoundError` naming the path when it is missing.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"data file not found: {path} (set {ASSETS_ENV} or pass a path)")
    if path.suffix == ".gz":
        return gzip.open(path, "rt", encoding="utf-8")
    return path.open("r", encoding="utf-8")
