"""One training process per run folder: `out/.mmpreproj-run.lock` names the process that holds the folder.

    with run_lock(out):      # RunInUseError when a live process holds it; a dead holder's lock is taken over
        ...

The lock file is created complete in one step (written under a temp name, then hard-linked onto the lock
name, which fails if it exists), so a reader never sees a half-written one. A lock whose process is gone
(same host, pid not running) is stale and replaced; a lock from another host cannot be checked and is
respected. The lock is the one file the library keeps in a run folder while it runs (removed when the run
ends; a killed run's is taken over by the next); it gets the mode the user's umask gives, like every file.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import stat
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..util.io import set_new_file_mode

RUN_LOCK_NAME = ".mmpreproj-run.lock"


class RunInUseError(RuntimeError):
    """Another live process is training into the same run folder."""


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def _read_holder(path: Path) -> dict[str, Any] | None:
    """The lock's content (None: no lock). A symlink there, or anything that is not a small JSON object,
    reads as an unknown holder (`{}`: respected, never taken over); nothing is read through a symlink."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        return None
    except OSError:  # a symlink (ELOOP), unreadable
        return {}
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return {}
        holder = json.loads(os.read(fd, 1 << 16).decode("utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        return {}
    finally:
        os.close(fd)
    return holder if isinstance(holder, dict) else {}


def _is_stale(holder: dict[str, Any]) -> bool:
    pid = holder.get("pid")
    if holder.get("host") != socket.gethostname() or not isinstance(pid, int) or isinstance(pid, bool):
        return False
    return not _pid_alive(pid)


def _try_create(path: Path, content: str) -> bool:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f"{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(content)
        set_new_file_mode(tmp)  # mkstemp made it 0600
        try:
            # os.link never follows a symlink at `path`: one there is "taken", read as data, never written
            os.link(tmp, path)
        except FileExistsError:
            return False
        return True
    finally:
        os.unlink(tmp)


def acquire_run_lock(out: Path) -> Path:
    """Create the lock in `out` (which must exist) or raise `RunInUseError` naming its live holder."""
    path = out / RUN_LOCK_NAME
    content = json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "started": time.time()})
    for _ in range(3):
        if _try_create(path, content):
            return path
        holder = _read_holder(path)
        if holder is None:
            continue  # released meanwhile
        if not _is_stale(holder):
            who = f"process {holder.get('pid', '?')} on {holder.get('host', '?')}"
            raise RunInUseError(
                f"{out} is in use by {who} (lock file {path}); wait for that run to finish, choose another "
                "folder, or delete the lock file if that process is no longer running"
            )
        with contextlib.suppress(FileNotFoundError):
            path.unlink()  # its process is gone
    raise RunInUseError(f"{out}: could not take the lock {path} (other processes keep taking it)")


@contextlib.contextmanager
def run_lock(out: str | Path) -> Iterator[Path]:
    """Hold the run folder's lock for the block (the folder is created; removed again if it stays empty)."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise NotADirectoryError(f"run folder {out} is a file; pass a folder for out (--out)")
    created = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    try:
        path = acquire_run_lock(out)
    except BaseException:
        if created:
            with contextlib.suppress(OSError):
                out.rmdir()
        raise
    try:
        yield path
    finally:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        if created:
            with contextlib.suppress(OSError):
                out.rmdir()  # only when empty: a run that failed before writing anything leaves no folder
