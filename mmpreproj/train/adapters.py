"""Saving a trained method's weights into `out/adapter/` (`mmpreproj.load_adapter` puts them back onto a base).

- preproj / skip / preproj_skip: `mmpreproj.save_adapter` -> adapter/{adapter_model.safetensors, adapter_config.json}
- lora: peft `save_pretrained` -> adapter/ (peft's own format, loadable with `PeftModel.from_pretrained`)
- preproj_lora: its `save_pretrained` (`method/stacked.py`): peft's LoRA in adapter/, ours in adapter/preproj/,
  the layout a Trainer's checkpoints have

A model sharded by FSDP is saved in two steps: every rank calls `gather_run_adapter` (full tensors), then
one rank passes the result to `save_run_adapter(..., state=...)`, so the files hold full weights.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from mmpreproj_tables.tables import ADAPTER_DIR

from ..method.files import ADAPTER_WEIGHTS_NAME, save_adapter
from ..method.state_dict import adapter_state_dict
from ..util.io import set_new_file_modes
from .errors import CheckpointWriteError
from .methods import METHOD_SPECS


def gather_run_adapter(model: nn.Module, method: str) -> dict[str, Any]:
    """The weights `save_run_adapter` writes, as full tensors (FSDP2 shards gathered: call on every rank).

    {"lora": {name: tensor}} of the trainable parameters for the LoRA methods (peft's LoRA weights, and for
    preproj_lora ours, which its `save_pretrained` reads from them), else {"adapter":
    `mmpreproj.adapter_state_dict`}.
    """
    if METHOD_SPECS[method].lora:
        return {"lora": {n: _full(p) for n, p in model.named_parameters() if p.requires_grad}}
    return {"adapter": adapter_state_dict(model)}


def _full(p: torch.Tensor) -> torch.Tensor:
    return (p.full_tensor() if hasattr(p, "full_tensor") else p).detach()


def save_run_adapter(model: nn.Module, method: str, path: str | Path, *, state: dict[str, Any] | None = None) -> Path:
    """Write the trainable weights of `model` (trained with `method`) to the folder `path`.

    `state`: what `gather_run_adapter` returned (needed for a sharded model); default: read from `model`.
    """
    state = state or {}
    path = Path(path)
    if METHOD_SPECS[method].lora:  # preproj_lora: ours in path/preproj/ too, written by the same call
        try:
            model.save_pretrained(str(path), state_dict=state.get("lora"))
        except OSError as err:  # peft writes in place: its files may be torn
            raise CheckpointWriteError(
                f"cannot write the LoRA adapter to {path}: {_why(err)}; peft's files there may be incomplete. "
                "Free space (or choose another output folder) and run again"
            ) from err
        set_new_file_modes(path, (ADAPTER_WEIGHTS_NAME,))  # peft's safetensors are 0600 whatever the umask
        return path
    try:
        path.mkdir(parents=True, exist_ok=True)  # both files replaced together or not at all (`util/file_sets.py`)
        save_adapter(model, path, state_dict=state.get("adapter"))
    except OSError as err:
        raise CheckpointWriteError(
            f"cannot write the adapter to {path}: {_why(err)}; nothing there was replaced (the previous adapter "
            "files, if any, are kept). Free space (or choose another output folder) and run again"
        ) from err
    return path


def _why(err: OSError) -> str:
    return f"{type(err).__name__}: " + ((err.strerror or str(err)).strip().splitlines() or [""])[0][:200]


def run_adapter_dir(path: str | Path) -> Path:
    """The adapter folder of a run folder (`path/adapter`), or `path` itself when it is an adapter folder."""
    path = Path(path)
    return path / ADAPTER_DIR if (path / ADAPTER_DIR).is_dir() else path
