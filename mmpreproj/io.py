"""Atomic file writes: a temp file in the same folder, then `os.replace`, so a crash never leaves a torn file."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

__all__ = ["atomic_write"]


def atomic_write(path: str | Path, write: Callable[[str], object]) -> Path:
    """Call `write(tmp_path)` to fill a temp file beside `path`, then rename it onto `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return path
