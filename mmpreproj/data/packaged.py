"""What the models shipped inside packages on the package index share: finding the file in an installed package
without importing it, the cache they are converted into, and a conversion that is done once and never half.

    path = GGUF_MODELS["smollm2-135m"].path("smollm2-135m")   # a PackagedModel row of a source's table
    folder = convert_once(cache_root("gguf") / f"{path.stem}-{file_digest(path)}", SOURCE_FILE, write)

The rows (`PackagedModel`, `package_file`) live in the light `mmpreproj_tables.packaged`, which the command reads
before torch loads. Used by `gguf_source.py` (`smollm2-135m`) and `onnx_source.py` (`dinov2-small`).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from mmpreproj_tables.packaged import PackagedModel as PackagedModel  # re-exported: the rows live in the plain tables
from mmpreproj_tables.packaged import package_file as package_file

from ..util.io import set_new_file_modes, umask

CACHE_ENV = "MMPREPROJ_CACHE"
SOURCE_FILE = "mmpreproj_source.json"
"""The file a converted folder holds (where it came from); written last, so its presence means "complete"."""


def cache_root(kind: str) -> Path:
    """`$MMPREPROJ_CACHE/<kind>`, else `$XDG_CACHE_HOME/mmpreproj/<kind>`, else `~/.cache/mmpreproj/<kind>`."""
    root = os.environ.get(CACHE_ENV)
    if root:
        return Path(root).expanduser() / kind
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "mmpreproj" / kind


def file_digest(path: Path) -> str:
    """blake2b of the file's bytes, 16 hex digits (the whole file: 0.2 s for 100 MB)."""
    h = hashlib.blake2b(digest_size=8)
    with path.open("rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def convert_once(target: Path, write: Callable[[Path], None]) -> Path:
    """`target`, made by `write(folder)` on first use: into a temporary sibling that is renamed when complete
    (a killed conversion leaves no half folder; two processes converting at once keep the first). `write` must
    write `SOURCE_FILE` last."""
    if (target / SOURCE_FILE).is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp"))
    try:
        write(tmp)
        os.chmod(tmp, 0o777 & ~umask())  # mkdtemp made it 0700: give it the mode a plain mkdir would
        for folder in [tmp, *(p for p in tmp.rglob("*") if p.is_dir())]:
            set_new_file_modes(folder, tuple(p.name for p in folder.iterdir()))
        try:
            os.replace(tmp, target)
        except OSError:  # another process finished the same conversion first: keep its folder
            if not (target / SOURCE_FILE).is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target
