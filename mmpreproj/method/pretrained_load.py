"""`from_pretrained`: the base (`AutoModelForCausalLM` or `model_cls`) from a folder or hub id with its adapter
loaded, the one `save_pretrained` wrote beside it (`pretrained_save.py`, refused when the two halves come from
different saves) or one named explicitly.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from huggingface_hub import hf_hub_download
from huggingface_hub.utils import EntryNotFoundError, LocalEntryNotFoundError
from torch import nn
from transformers import AutoModelForCausalLM

from ..data.model_source import corrupt_weights_error, pretrained_source
from ..util.file_sets import committed_files
from .files import ADAPTER_CONFIG_NAME, ADAPTER_WEIGHTS_NAME, BASE_SAVE_TOKEN, PRETRAINED_ADAPTER_DIR, adapter_folder
from .load import load_adapter  # the one loader of a trained folder
from .pretrained_save import check_saved_pair, config_save_token


def _adapter_token(folder: Path) -> str | None:
    """The `base_save_token` of the adapter in `folder` (its committed config); None if absent or unreadable
    (`load_adapter` then names what is wrong with the file)."""
    with committed_files(folder, (ADAPTER_CONFIG_NAME,)) as files:
        try:
            desc = json.loads(files[ADAPTER_CONFIG_NAME].read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
    if isinstance(desc, dict) and isinstance(desc.get("injection"), dict):  # peft layout (method/files.py)
        desc = desc["injection"]
    return desc.get(BASE_SAVE_TOKEN) if isinstance(desc, dict) else None


def _hub_adapter(repo: str, subfolders: tuple[str, ...], local_only: bool, **download: Any) -> Path | None:
    """The local folder of a hub repo's adapter files (first of `subfolders` that has them), or None."""
    for sub in subfolders:
        try:
            cfg = hf_hub_download(repo, sub + ADAPTER_CONFIG_NAME, local_files_only=local_only, **download)
            hf_hub_download(repo, sub + ADAPTER_WEIGHTS_NAME, local_files_only=local_only, **download)
        except (EntryNotFoundError, LocalEntryNotFoundError):
            continue
        return Path(cfg).parent
    return None


def from_pretrained(
    path_or_hub_id: str | Path, adapter: str | Path | bool | None = None, model_cls: Any = None, **kwargs: Any
) -> nn.Module:
    """The base (`model_cls.from_pretrained`, default `AutoModelForCausalLM`) with an adapter put on by the one
    loader, `mmpreproj.load_adapter` (`method/load.py`).

    `adapter`: an adapter folder or hub id; None = the one `save_pretrained` wrote beside the base (its
    `adapter/` subfolder), which must be there: a folder or hub repo without it raises FileNotFoundError
    (never the plain base in place of the trained model), and the two must come from one save
    (`check_saved_pair`); False = the base alone. `kwargs` go to `from_pretrained` (`dtype=`, `revision=`...).
    When the Hub cannot be reached (or `HF_HUB_OFFLINE=1`), a hub id must be cached, else one-line
    FileNotFoundError. A weights file that cannot be read (truncated) is named.
    """
    if model_cls is None:
        model_cls = AutoModelForCausalLM
    source, extra = pretrained_source(str(path_or_hub_id))
    download = {k: kwargs[k] for k in ("revision", "cache_dir", "token") if k in kwargs}
    local_only = bool(extra.get("local_files_only") or kwargs.get("local_files_only"))
    if adapter is None:
        if Path(source).is_dir():
            folder = adapter_folder(source)
            folder = folder if (folder / ADAPTER_CONFIG_NAME).is_file() else None
        else:
            folder = _hub_adapter(source, (PRETRAINED_ADAPTER_DIR + "/",), local_only, **download)
        if folder is None:
            raise FileNotFoundError(
                f"from_pretrained: {str(path_or_hub_id)!r} holds no mmpreproj adapter (no "
                f"{PRETRAINED_ADAPTER_DIR}/{ADAPTER_CONFIG_NAME}); pass adapter=False to load only the base, or "
                "adapter=FOLDER for an adapter saved elsewhere"
            )
    elif adapter is False:
        folder = None
    else:
        a_source, a_extra = pretrained_source(str(adapter))
        folder = (
            adapter_folder(a_source)
            if Path(a_source).is_dir()
            else _hub_adapter(
                a_source,
                ("", PRETRAINED_ADAPTER_DIR + "/"),
                bool(a_extra.get("local_files_only")),
                **download,
            )
        )
        if folder is None or not (folder / ADAPTER_CONFIG_NAME).is_file():
            where = Path(str(adapter)) / ADAPTER_CONFIG_NAME if folder is None else folder / ADAPTER_CONFIG_NAME
            raise FileNotFoundError(
                f"from_pretrained: no mmpreproj adapter files in {str(adapter)!r}: {where} is missing (nor in its "
                f"{PRETRAINED_ADAPTER_DIR}/)"
            )
    if folder is not None and not (folder / ADAPTER_WEIGHTS_NAME).is_file():  # before the base is loaded
        raise FileNotFoundError(f"adapter file missing: {folder / ADAPTER_WEIGHTS_NAME}")
    if adapter is None and folder is not None and folder != Path(source):  # the pair save_pretrained wrote
        check_saved_pair(_base_token(source, local_only, download), _adapter_token(folder), path_or_hub_id)
    try:
        model = model_cls.from_pretrained(source, **{**extra, **kwargs})
    except Exception as err:
        broken = corrupt_weights_error(source, err)
        if broken is None:
            raise
        raise broken from None
    return model if folder is None else load_adapter(model, folder)


def _base_token(source: str, local_only: bool, download: dict[str, Any]) -> str | None:
    """The save token in the config.json of a local folder or a hub repo."""
    if Path(source).is_dir():
        return config_save_token(Path(source) / "config.json")
    try:
        return config_save_token(hf_hub_download(source, "config.json", local_files_only=local_only, **download))
    except (EntryNotFoundError, LocalEntryNotFoundError):
        return None
