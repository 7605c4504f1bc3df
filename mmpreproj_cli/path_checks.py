"""The command's checks of what a name points at, without the library: adapter and run folders, a causal LM's
name (packaged, a local folder or `.gguf` file, or a hub id), training data, and the files it will write.

Each raises ValueError in one line naming the option, the value and what it takes. A hub id is passed on: the
library looks it up in the local hub cache when downloads are off (`run.py`), before anything loads.
"""

from __future__ import annotations

import difflib
import json
from pathlib import Path

from mmpreproj_tables.packaged import GGUF_MODELS, ONNX_MODELS
from mmpreproj_tables.sources import (
    adapter_folder,
    assets_root,
    looks_like_data_path,
    looks_like_model_path,
    resolve_path,
)
from mmpreproj_tables.tables import ADAPTER_CONFIG_NAME

MODEL_CONFIG = "config.json"  # what a transformers model folder holds (its `model_type` says the architecture)


def check_exists(flag: str, value: str | None) -> None:
    if value is not None and not Path(value).exists():
        raise ValueError(f"{flag} {value}: no such file or folder")


def check_adapter_folder(flag: str, value: str) -> None:
    """An existing run or adapter folder that holds an adapter (its `adapter_config.json`, or in `adapter/`)."""
    check_exists(flag, value)
    if not (adapter_folder(value) / ADAPTER_CONFIG_NAME).is_file():
        raise ValueError(
            f"{flag} {value}: holds no adapter ({ADAPTER_CONFIG_NAME} missing); pass a run folder or an adapter folder"
        )


def known_models() -> dict[str, str]:
    """The model names the command knows by heart, for "did you mean": short name -> what to pass (the packaged
    models, and the shipped model folders under assets/ by their folder name)."""
    known = {name: name for name in (*GGUF_MODELS, *ONNX_MODELS)}
    root = assets_root()
    if root.is_dir():
        known.update({p.name: f"assets/{p.name}" for p in sorted(root.iterdir()) if (p / MODEL_CONFIG).is_file()})
    return known


def check_causal_lm(label: str, name: str) -> None:
    """`name` can be a causal LM to load: a packaged LM that is installed, an existing `.gguf` file or
    transformers folder, or a hub id (`org/name`). `label` says where the name came from ("--model X")."""
    if name in ONNX_MODELS:
        raise ValueError(
            f"{label}: an image backbone (transformers Dinov2Model), not a causal LM; the command trains and scores "
            "causal LMs (for this one: recipes/vision/dinov2_probe.py)"
        )
    if name in GGUF_MODELS:
        try:
            GGUF_MODELS[name].path(name)
        except FileNotFoundError:
            raise ValueError(f"{label}: not installed; install it with: {GGUF_MODELS[name].install}") from None
        return
    local = resolve_path(name)
    if name.lower().endswith(".gguf"):
        if local is None or not local.is_file():
            raise ValueError(f"{label}: no such .gguf file; pass an existing file or one of {', '.join(GGUF_MODELS)}")
        return
    if local is not None:
        _check_model_folder(label, local)
        return
    if looks_like_model_path(name):
        raise ValueError(f"{label}: no such folder (a local path; a hub id looks like org/name)")
    near = difflib.get_close_matches(name, known_models(), n=1, cutoff=0.8) if "/" not in name else []
    if near:
        meant = known_models()[near[0]]
        raise ValueError(f"{label}: unknown model name; did you mean {meant}? (a hub id looks like org/name)")


def _check_model_folder(label: str, folder: Path) -> None:
    config = folder / MODEL_CONFIG
    if not folder.is_dir():
        raise ValueError(f"{label}: is a file; pass a model folder (or a .gguf file)")
    try:
        fields = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        raise ValueError(f"{label}: holds no readable {MODEL_CONFIG}; pass a transformers model folder") from None
    if not isinstance(fields, dict) or not (fields.get("model_type") or fields.get("architectures")):
        raise ValueError(
            f"{label}: its {MODEL_CONFIG} names no model_type or architectures (not a transformers model folder)"
        )


def check_data(label: str, value: str) -> None:
    """A data name written as a local path must be an existing file (else it is a hub dataset id)."""
    local = resolve_path(value)
    if local is None and looks_like_data_path(value):
        raise ValueError(f"{label}: no such file (a local text file, one example per line; or a hub dataset id)")
    if local is not None and not local.is_file():
        raise ValueError(f"{label}: is a folder; pass a text file, one example per line")


def output_file(flag: str, value: str | None) -> None:
    """A file the command will write: not an existing folder, and its folder not an existing file."""
    if value is None:
        return
    p = Path(value)
    if p.is_dir():
        raise ValueError(f"{flag} {value}: is a folder; pass a file name")
    parent = next((a for a in p.parents if a.exists()), None)
    if parent is not None and not parent.is_dir():
        raise ValueError(f"{flag} {value}: {parent} is a file, not a folder")


def output_folder(flag: str, value: str | None) -> None:
    if value is not None and Path(value).exists() and not Path(value).is_dir():
        raise ValueError(f"{flag} {value}: is a file; pass a folder")
