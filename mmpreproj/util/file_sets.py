"""Several files in one folder replaced together: a reader sees the old set or the new set, never a mix.

    write_files(folder, {"a.safetensors": write_a, "a.json": write_b})
    with committed_files(folder, ["a.safetensors", "a.json"]) as paths: read(paths["a.json"])

How a write goes (each file atomic on its own is not enough: a kill between two renames would pair new
weights with an old config):
  1. every new file is written to a hidden pending name `.NAME.TOKEN.pending` and flushed to disk;
  2. a commit marker `.mmpreproj-commit.json` naming TOKEN and the files is written atomically: from this
     moment the new set is the committed one;
  3. each pending file is renamed onto its final name; 4. the marker is removed.
A reader that finds a marker rolls it forward (step 3-4) before reading, so a kill at any point leaves
either the old set (before 2) or the new set (from 2 on). Writers and readers of one folder hold an
exclusive `flock` on the folder itself (released by the OS when a process dies), so no lock file is ever
left in an adapter folder, a checkpoint or an upload (`_locked`); a writer first removes the pending and
temp files that killed writers left, so they never accumulate. Every file gets the mode the user's umask
gives (`io.new_file_mode`), not the 0600 of safetensors or of a temp file.

The marker is data: its token must be the 16 hex digits a writer makes and its names plain file names,
so no marker can name a path outside the folder; a reader or writer that finds another one refuses it.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import secrets
import stat
import tempfile
from collections.abc import Callable, Iterator, Sequence
from glob import escape as glob_escape
from pathlib import Path

from .io import atomic_write, fsync_dir, fsync_file, remove_stale_temps, set_new_file_mode

COMMIT_MARKER = ".mmpreproj-commit.json"
_TOKEN = re.compile(r"[0-9a-f]{16}")  # what `secrets.token_hex(8)` writes


def _fault_point(point: str) -> None:
    """Called at each step of a write ("written:NAME", "committed", "renamed:NAME"); tests replace it to kill
    the process at a chosen point."""


def _pending(folder: Path, name: str, token: str) -> Path:
    return folder / f".{name}.{token}.pending"


def _lock_dir() -> Path:
    """The per-user folder of the lock files for folders that cannot be locked themselves (see `_locked`):
    `<tempdir>/mmpreproj-locks-<uid>`, created 0700; refused unless it is a real folder of this user that
    no one else can write."""
    path = Path(tempfile.gettempdir()) / f"mmpreproj-locks-{os.getuid()}"
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise PermissionError(
            f"lock folder {path} is not a private folder of this user (a symlink, another owner, or group/other "
            "access); remove it, or set TMPDIR to another temp folder"
        )
    return path


def _outside_lock(folder: Path) -> int:
    """An open lock file for `folder` in `_lock_dir()`, named by a hash of the folder's resolved path; a
    symlink there is refused (O_NOFOLLOW), never followed."""
    key = hashlib.sha256(str(folder.resolve()).encode("utf-8", "surrogateescape")).hexdigest()[:32]
    path = _lock_dir() / f"{key}.lock"
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o666)
    except OSError:
        if os.path.islink(path):
            raise PermissionError(f"lock file {path} is a symlink; refusing to follow it (remove it)") from None
        raise


def _folder_lock(folder: Path, fcntl) -> int | None:
    """An fd of `folder` itself holding its exclusive `flock`; None where a folder cannot be opened or
    locked (NFS locks only files open for writing)."""
    try:
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
    except OSError:
        os.close(fd)
        return None
    except BaseException:
        os.close(fd)
        raise
    return fd


def _lock_fd(folder: Path, fcntl) -> int:
    """An fd holding the exclusive lock of `folder`: the folder's own (`_folder_lock`), else that of its lock
    file outside it (`_outside_lock`)."""
    fd = _folder_lock(folder, fcntl)
    if fd is not None:
        return fd
    fd = _outside_lock(folder)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
    except BaseException:
        os.close(fd)
        raise
    return fd


@contextlib.contextmanager
def _locked(folder: Path, *, writer: bool) -> Iterator[bool]:
    """Hold the folder's exclusive lock; yields whether it is held. Nothing is created in the folder.

    The lock is shared by every process (and user) that can open the folder, whatever path it was given by.
    A reader that cannot take it reads without it; a writer raises.
    """
    try:
        import fcntl
    except ImportError:  # no flock (Windows): single writer assumed
        yield False
        return
    try:
        fd = _lock_fd(folder, fcntl)
    except OSError:
        if writer:
            raise
        yield False
        return
    try:
        yield True
    finally:
        os.close(fd)  # releases the lock


def _read_marker(folder: Path) -> tuple[str, list[str]] | None:
    """(token, names) of the folder's commit marker, None without one; a marker whose token is not 16 hex
    digits or whose names are not plain file names is refused before anything is renamed."""
    marker = folder / COMMIT_MARKER
    if not marker.is_file():
        return None
    try:
        info = json.loads(marker.read_text(encoding="utf-8"))
        if not isinstance(info, dict):
            raise ValueError(f"expected an object, got {type(info).__name__}")
        token, names = info["token"], info["files"]
        if not (isinstance(token, str) and _TOKEN.fullmatch(token)):
            raise ValueError(f"token must be 16 hex digits, got {token!r}")
        if not (isinstance(names, list) and all(_plain_name(n) for n in names)):
            raise ValueError(f"files must be a list of plain file names, got {names!r}")
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as e:
        raise ValueError(
            f"corrupt commit marker {marker}: {e}; no file was changed; delete the marker to keep the files as "
            "they are"
        ) from None
    return token, names


def _plain_name(name: object) -> bool:
    """A file name in the folder: no separator, not "." or "..", no NUL."""
    return (
        isinstance(name, str)
        and name not in ("", ".", "..")
        and not any(c in name for c in ("/", os.sep, os.altsep or "/", "\0"))
    )


def _roll_forward(folder: Path) -> None:
    """Finish a committed write that a kill interrupted (steps 3-4); a no-op without a marker."""
    found = _read_marker(folder)
    if found is None:
        return
    token, names = found
    for name in names:
        src = _pending(folder, name, token)
        if src.exists():
            os.replace(src, folder / name)
            _fault_point(f"renamed:{name}")
    fsync_dir(folder)
    (folder / COMMIT_MARKER).unlink()
    fsync_dir(folder)


def _remove_leftovers(folder: Path, names: Sequence[str]) -> None:
    """Pending files of killed writers, and temp files of killed `atomic_write`s, for these names."""
    for name in names:
        for p in folder.glob(f".{glob_escape(name)}.*.pending"):
            with contextlib.suppress(FileNotFoundError):
                p.unlink()
    for name in (*names, COMMIT_MARKER):
        remove_stale_temps(folder / name)


def write_files(folder: str | Path, writers: dict[str, Callable[[str], object]]) -> Path:
    """Replace the files `writers` names in `folder` together; `writers[name](tmp_path)` fills one file."""
    folder = Path(folder)
    bad = [n for n in writers if not _plain_name(n)]
    if bad:
        raise ValueError(f"write_files: file names must be plain names inside the folder, got {bad}")
    folder.mkdir(parents=True, exist_ok=True)
    with _locked(folder, writer=True):
        _roll_forward(folder)
        _remove_leftovers(folder, list(writers))
        token = secrets.token_hex(8)
        pending = {name: _pending(folder, name, token) for name in writers}
        try:
            for name, write in writers.items():
                write(str(pending[name]))
                set_new_file_mode(pending[name])  # safetensors writes 0600
                fsync_file(pending[name])
                _fault_point(f"written:{name}")
        except BaseException:
            for p in pending.values():
                with contextlib.suppress(FileNotFoundError):
                    p.unlink()
            raise
        marker = json.dumps({"token": token, "files": list(writers)})
        atomic_write(folder / COMMIT_MARKER, lambda f: Path(f).write_text(marker, encoding="utf-8"))
        _fault_point("committed")
        _roll_forward(folder)
    return folder


@contextlib.contextmanager
def committed_files(folder: str | Path, names: Sequence[str]) -> Iterator[dict[str, Path]]:
    """{name: path to read} of the committed set, held stable (locked) while the block runs.

    A write that a kill interrupted after its commit is finished first; in a folder this process cannot
    write to, the pending files of such a write are read in place.
    """
    folder = Path(folder)
    if not folder.is_dir():
        yield {name: folder / name for name in names}
        return
    with _locked(folder, writer=False) as held:
        if held:
            try:
                _roll_forward(folder)
            except OSError as e:  # a read-only folder (or mount): read the committed files where they are
                if not isinstance(e, PermissionError) and e.errno != errno.EROFS:
                    raise
        found = _read_marker(folder)
        paths = {name: folder / name for name in names}
        # Not rolled forward (a read-only folder): the committed files are the pending ones.
        if found is not None:
            token, committed = found
            for name in names:
                if name in committed and _pending(folder, name, token).exists():
                    paths[name] = _pending(folder, name, token)
        yield paths
