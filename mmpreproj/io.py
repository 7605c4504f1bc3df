"""Atomic file writes: a temp file in the same folder, flushed to disk, then `os.replace`, so a crash never
leaves a torn file."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable
from glob import escape as glob_escape
from pathlib import Path

__all__ = ["atomic_write", "fsync_dir", "fsync_file", "remove_stale_temps"]


def fsync_file(path: str | Path) -> None:
    """Flush a written file's data to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: str | Path) -> None:
    """Flush a folder's entries (renames, deletions) to disk; a no-op where folders cannot be opened."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        with contextlib.suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: str | Path, write: Callable[[str], object]) -> Path:
    """Call `write(tmp_path)` to fill a temp file beside `path`, then rename it onto `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        fsync_file(tmp)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)
    return path


def remove_stale_temps(path: str | Path) -> list[Path]:
    """Delete the temp files that killed `atomic_write`s of `path` left beside it; call only while no other
    process writes `path`. Returns what was removed."""
    path = Path(path)
    removed = []
    if path.parent.is_dir():
        for p in path.parent.glob(f".{glob_escape(path.name)}.*.tmp"):
            with contextlib.suppress(FileNotFoundError):
                p.unlink()
                removed.append(p)
    return removed
