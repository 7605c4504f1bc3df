"""Where a name given for a model, data or an adapter points, decided without the library: the one locator
(`resolve_path`, honouring `MMPREPROJ_ASSETS`) and the rules that tell a local path from a hub id.

Plain standard library, so the command checks its path arguments before torch loads; the library reads the
same functions (`data.assets`, `data.model_source`, `train.sources`, `method.files`).
"""

from __future__ import annotations

import os
from pathlib import Path

from .offline import hub_offline, offline_flags
from .packaged import ONNX_MODELS, is_gguf_name
from .tables import ADAPTER_CONFIG_NAME, ADAPTER_DIR

ASSETS_ENV = "MMPREPROJ_ASSETS"
"""The environment variable that points the shipped-data locator at another assets folder."""


def repo_root() -> Path:
    """The checkout (or editable install) the packages sit in: `mmpreproj_tables/` -> `..`."""
    return Path(__file__).resolve().parents[1]


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


def looks_like_model_path(name: str) -> bool:
    """Whether a model name is written as a local path: it starts with `/`, `.` or `~`, ends with `/`, holds a
    backslash, or has more than one `/` (no hub id `org/name` has)."""
    return name.startswith(("/", ".", "~")) or name.count("/") > 1 or name.endswith("/") or "\\" in name


def hub_cached(name: str) -> bool:
    """Whether the hub id `name` has a config.json in the local hub cache (an id that is no valid repo id: no).
    Imports huggingface_hub (no torch)."""
    from huggingface_hub import try_to_load_from_cache

    try:
        return isinstance(try_to_load_from_cache(name, "config.json"), str)
    except ValueError:  # huggingface_hub's HFValidationError: not a repo id at all
        return False


def check_hub_model(name: str, label: str) -> None:
    """With hub downloads off (`HF_HUB_OFFLINE`), ValueError in one line when `name` is a hub id that is not in
    the local hub cache: said before anything loads, no network tried. Local paths, packaged names (GGUF, ONNX,
    `.gguf` files) and any name while downloads are on pass."""
    if not hub_offline() or is_gguf_name(name) or name in ONNX_MODELS:
        return
    if resolve_path(name) is None and not hub_cached(name):
        raise ValueError(
            f"{label}: not in the local hub cache, and hub downloads are off ({offline_flags()}); pass "
            "--online to download it, or a local folder"
        )


def looks_like_data_path(source: str) -> bool:
    """Whether a data name is written as a local file (`./x`, `/x`, `~/x`, `dir/x.txt`), not a hub dataset id."""
    return source.startswith((".", "/", "~")) or (os.sep in source and Path(source).suffix != "")


def adapter_folder(path: str | Path) -> Path:
    """The folder holding an adapter's files: `path` itself, or the `adapter/` subfolder a
    `save_pretrained` folder (and a training run folder) keeps them in."""
    path = Path(path)
    sub = path / ADAPTER_DIR
    if not (path / ADAPTER_CONFIG_NAME).is_file() and (sub / ADAPTER_CONFIG_NAME).is_file():
        return sub
    return path
