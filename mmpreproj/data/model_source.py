"""Where a pretrained model comes from: a local folder, a model shipped inside a package and converted once
into a cached folder (`gguf_source.py`: `smollm2-135m` or a `.gguf` path; `onnx_source.py`: `dinov2-small`), or a
hub id (offline-aware, through the one hub probe
`hub.py`), a name written as a path that does not exist refused at once, and the weights file of a failed
load that cannot be read named (`corrupt_weights_error`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from huggingface_hub import try_to_load_from_cache
from safetensors import safe_open

from mmpreproj_tables.packaged import is_gguf_name
from mmpreproj_tables.sources import hub_cached, looks_like_model_path

from . import gguf_source, hub, onnx_source
from .assets import resolve_path


def check_local_model(name: str, what: str = "model folder") -> None:
    """FileNotFoundError when `name` is written as a local path (it starts with `/`, `.` or `~`, or has more
    than one `/`, which no hub id `org/name` has) and no such file or folder exists: said at once, instead of
    a hub lookup of a name that cannot be a hub id."""
    if not name.strip():
        raise FileNotFoundError(f"{what}: empty name; pass a hub id or a local folder")
    if is_gguf_name(name) or onnx_source.is_onnx_name(name):
        return  # a packaged model or a .gguf path: `pretrained_source` finds it or says how to install it
    if looks_like_model_path(name) and resolve_path(name) is None:
        raise FileNotFoundError(f"{what} not found: {name} (no such file or folder; a hub id looks like org/name)")


def pretrained_source(name: str) -> tuple[str, dict[str, Any]]:
    """(what to pass to from_pretrained, extra kwargs): a local folder as is; a hub id with
    `local_files_only=True` when the Hub cannot be reached, so an offline run fails (or uses the cache) at
    once instead of retrying the network. A name written as a local path that does not exist fails at once
    (`check_local_model`)."""
    check_local_model(name)
    if is_gguf_name(name):
        return str(gguf_source.plain_folder(name)), {}
    if onnx_source.is_onnx_name(name):
        return str(onnx_source.plain_folder(name)), {}
    local = resolve_path(name)
    if local is not None:
        return str(local), {}
    if not (hub.hub_offline() or not hub.hub_reachable()):
        return name, {}
    if not hub_cached(name):
        why = f"hub downloads are off ({hub.offline_flags()})" if hub.hub_offline() else "the Hub cannot be reached"
        raise FileNotFoundError(f"{why} and {name!r} is neither cached nor a local folder")
    return name, {"local_files_only": True}


def convert_packaged(name: str) -> None:
    """Convert a packaged model file (a GGUF, an ONNX backbone) into its cached plain folder now, if `name` is
    one and the cache is missing or stale; any other name: nothing. A run calls it before it seeds, so the
    conversion's own draws never shift the run's stream (the first run on a machine equals every later one)."""
    if is_gguf_name(name):
        gguf_source.plain_folder(name)
    elif onnx_source.is_onnx_name(name):
        onnx_source.plain_folder(name)


_WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")


def corrupt_weights_error(source: str, err: Exception) -> ValueError | None:
    """When loading `source` failed with `err`, the one-line error naming the weights file that cannot be read
    (truncated by an interrupted download or copy, or not a weights file at all), or None when every weights
    file of it reads. Read: a local folder's `model*.safetensors` (their headers) and `pytorch_model*.bin`
    (memory-mapped), or a hub id's cached `model.safetensors` / `pytorch_model.bin`."""
    folder = Path(source)
    if folder.is_dir():
        files = sorted(folder.glob("model*.safetensors")) + sorted(folder.glob("pytorch_model*.bin"))
    else:
        try:
            found = [try_to_load_from_cache(source, f) for f in _WEIGHT_FILES]
        except Exception:  # not a valid repo id: nothing cached to look at
            return None
        files = [Path(f) for f in found if isinstance(f, str)]
    for f in files:
        why = _unreadable(f)
        if why is not None:
            return ValueError(
                f"corrupt model weights {f}: {why} (truncated or not a weights file? download or save it again); "
                f"loading failed with {type(err).__name__}"
            )
    return None


def _unreadable(path: Path) -> str | None:
    """Why the weights file `path` cannot be read (its header, and for a zip its directory), or None."""
    try:
        if path.suffix == ".safetensors":
            with safe_open(str(path), "pt"):
                pass
        else:
            try:
                torch.load(path, map_location="cpu", weights_only=True, mmap=True)
            except RuntimeError as e:  # an old non-zip .bin cannot be mapped: read it whole
                if "mmap" not in str(e):
                    raise
                torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # safetensors' SafetensorError, torch's RuntimeError/UnpicklingError, OSError
        return (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
    return None
