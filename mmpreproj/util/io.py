"""Atomic file writes: a temp file in the same folder, flushed to disk, then `os.replace`, so a crash never
leaves a torn file. Every file lands with the mode the user's umask gives a new file (0644 under umask 022,
0600 under 077), whatever the temp file (`mkstemp`: 0600) or the writer (safetensors: 0600) made it."""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
import tempfile
from collections.abc import Callable
from glob import escape as glob_escape
from pathlib import Path


def umask() -> int:
    """This process's umask, read without changing it.

    Linux reports it in /proc/self/status ("Umask:", kernel 4.7+). Elsewhere a probe file is created in the
    temp folder and its mode read back. Never `os.umask(0)` and back: the umask is process-wide, and another
    thread creating a file in between would get mode 0666. Read per write: a program may change its umask.
    """
    with contextlib.suppress(OSError, ValueError), open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("Umask:"):
                return int(line.split()[1], 8) & 0o777
    probe = os.path.join(tempfile.gettempdir(), f".mmpreproj-umask.{secrets.token_hex(8)}")
    fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o777)  # O_EXCL: never through a symlink
    try:
        return 0o777 & ~stat.S_IMODE(os.fstat(fd).st_mode)
    finally:
        os.close(fd)
        os.unlink(probe)


def new_file_mode() -> int:
    """The permission bits a new file gets under this process's umask: 0o666 & ~umask."""
    return 0o666 & ~umask()


def set_new_file_mode(path: str | Path) -> None:
    """Give a file we wrote the mode a plain `open(path, "w")` would have given it (see `new_file_mode`)."""
    os.chmod(path, new_file_mode())


def set_new_file_modes(folder: str | Path, names: tuple[str, ...]) -> None:
    """`set_new_file_mode` for those of `names` in `folder` that are regular files (a symlink is left alone):
    for files another library just wrote there (peft's `adapter_model.safetensors` is 0600)."""
    for name in names:
        path = Path(folder) / name
        if path.is_file() and not path.is_symlink():
            set_new_file_mode(path)


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
    """Call `write(tmp_path)` to fill a temp file beside `path`, then rename it onto `path` (with the mode
    `new_file_mode()`, the one the user's umask gives)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        set_new_file_mode(tmp)
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
