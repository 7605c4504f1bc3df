"""Where the shipped assets live, how a default path such as "assets/mini-pythia" is found, and how to read one.

One locator for the whole package: `asset_path` (an asset by name), `resolve_path` (a user path or a default,
relative to the working directory or the repository root), both honouring `MMPREPROJ_ASSETS`.
"""

from __future__ import annotations

import gzip
import os
from pathlib import Path
from typing import IO

ASSETS_ENV = "MMPREPROJ_ASSETS"
"""The environment variable that points the shipped-data locator at another assets folder."""


def repo_root() -> Path:
    """The checkout (or editable install) this package sits in: `mmpreproj/data/` -> `../..`."""
    return Path(__file__).resolve().parents[2]


def assets_root() -> Path:
    """`$MMPREPROJ_ASSETS` if set, else `<repo>/assets` (works from a source checkout or an editable install;
    for any other install point `MMPREPROJ_ASSETS` at a copy)."""
    root = os.environ.get(ASSETS_ENV)
    return Path(root).expanduser() if root else repo_root() / "assets"


def asset_path(*parts: str) -> Path:
    """Path of a shipped asset: `assets_root() / <parts>` (it may not exist)."""
    return assets_root().joinpath(*parts)


def resolve_path(path: str | os.PathLike[str]) -> Path | None:
    """An existing file or folder for `path`, or None (then the caller may try the Hub).

    A relative path whose first part is `assets` (the presets' and CLI's defaults, "assets/mini-pythia") names
    an asset: with `MMPREPROJ_ASSETS` set it is looked up there first. Then `path` as given (relative to the
    working directory), then relative to the repository root.
    """
    p = Path(path).expanduser()
    if not p.is_absolute() and p.parts[:1] == ("assets",) and os.environ.get(ASSETS_ENV):
        candidate = asset_path(*p.parts[1:])
        if candidate.exists():
            return candidate
    if p.exists():
        return p
    if not p.is_absolute() and (repo_root() / p).exists():
        return repo_root() / p
    return None


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
