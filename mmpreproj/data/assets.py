"""Where the shipped assets live, how a default path such as "assets/mini-pythia" is found, and how to read one.

One locator for the whole package: `asset_path` (an asset by name), `resolve_path` (a user path or a default,
relative to the working directory or the repository root), both honouring `MMPREPROJ_ASSETS`. They live in
the light `mmpreproj_tables.sources` (the command checks its paths with them before torch loads) and are
re-exported here.
"""

from __future__ import annotations

import gzip
import os
from pathlib import Path
from typing import IO

from mmpreproj_tables.sources import ASSETS_ENV as ASSETS_ENV  # re-exported: the locator lives in the plain tables
from mmpreproj_tables.sources import asset_path as asset_path
from mmpreproj_tables.sources import assets_root as assets_root
from mmpreproj_tables.sources import repo_root as repo_root
from mmpreproj_tables.sources import resolve_path as resolve_path


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
