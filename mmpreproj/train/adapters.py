"""Saving a trained method's weights into `out/adapter/`, and putting them back onto a fresh base model.

- preproj / skip / preproj_skip: `mmpreproj.save_adapter` -> adapter/{adapter_model.safetensors, adapter_config.json}
- lora: peft `save_pretrained` -> adapter/ (peft's own format, loadable with `PeftModel.from_pretrained`)
- preproj_lora: the mmpreproj adapter in adapter/ and the peft adapter in adapter/lora/

A model sharded by FSDP is saved in two steps: every rank calls `gather_run_adapter` (full tensors), then
one rank passes the result to `save_run_adapter(..., state=...)`, so the files hold full weights.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from peft import PeftModel
from torch import nn

from .. import tuner as _adapter
from ..tuner.config import PreProjConfig
from ..tuner.keys import as_description, is_other_peft_method
from ..util.io import set_new_file_modes
from .errors import CheckpointWriteError
from .methods import METHOD_SPECS, METHODS
from .runlog import CONFIG_NAME

PREPROJ_SUBDIR = "preproj"  # where a Trainer checkpoint of preproj_lora keeps our adapter (peft's LoRA at the top)

__all__ = [
    "ADAPTER_DIR",
    "LORA_SUBDIR",
    "gather_run_adapter",
    "load_run_adapter",
    "run_adapter_dir",
    "save_run_adapter",
]

ADAPTER_DIR = "adapter"
LORA_SUBDIR = "lora"


def gather_run_adapter(model: nn.Module, method: str) -> dict[str, Any]:
    """The weights `save_run_adapter` writes, as full tensors (FSDP2 shards gathered: call on every rank).

    {"adapter": `mmpreproj.adapter_state_dict`} for the injected methods, plus {"lora": {name: tensor}} of
    the trainable parameters (peft keeps the LoRA ones) for the LoRA methods.
    """
    spec = METHOD_SPECS[method]
    state: dict[str, Any] = {}
    if spec.preproj or spec.skip:
        state["adapter"] = _adapter.adapter_state_dict(model)
    if spec.lora:
        state["lora"] = {n: _full(p) for n, p in model.named_parameters() if p.requires_grad}
    return state


def _full(p: torch.Tensor) -> torch.Tensor:
    return (p.full_tensor() if hasattr(p, "full_tensor") else p).detach()


def save_run_adapter(
    model: nn.Module, method: str, path: str | Path, *, state: dict[str, Any] | None = None
) -> Path:
    """Write the trainable weights of `model` (trained with `method`) to the folder `path`.

    `state`: what `gather_run_adapter` returned (needed for a sharded model); default: read from `model`.
    """
    spec = METHOD_SPECS[method]
    state = state or {}
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
        if spec.preproj or spec.skip:  # both files replaced together or not at all (`adapter_files`)
            _adapter.save_adapter(model, path, state_dict=state.get("adapter"))
    except OSError as err:
        raise CheckpointWriteError(
            f"cannot write the adapter to {path}: {_why(err)}; nothing there was replaced (the previous adapter "
            "files, if any, are kept). Free space (or choose another output folder) and run again"
        ) from err
    if spec.lora:
        lora_dir = path / LORA_SUBDIR if (spec.preproj or spec.skip) else path
        try:
            model.save_pretrained(str(lora_dir), state_dict=state.get("lora"))
        except OSError as err:  # peft writes in place: its files may be torn
            raise CheckpointWriteError(
                f"cannot write the LoRA adapter to {lora_dir}: {_why(err)}; peft's files there may be incomplete. "
                "Free space (or choose another output folder) and run again"
            ) from err
        set_new_file_modes(lora_dir, (_adapter.ADAPTER_WEIGHTS_NAME,))  # peft's safetensors are 0600 whatever the umask
    return path


def _why(err: OSError) -> str:
    return f"{type(err).__name__}: " + ((err.strerror or str(err)).strip().splitlines() or [""])[0][:200]


def run_adapter_dir(path: str | Path) -> Path:
    """The adapter folder of a run folder (`path/adapter`), or `path` itself when it is an adapter folder."""
    path = Path(path)
    return path / ADAPTER_DIR if (path / ADAPTER_DIR).is_dir() else path


def _kind(method: str) -> tuple[bool, bool, bool]:
    spec = METHOD_SPECS[method]
    return spec.preproj, spec.skip, spec.lora


def load_run_adapter(model: nn.Module, path: str | Path, method: str | None = None) -> nn.Module:
    """Add the weights saved by `save_run_adapter` to a base `model`; `path` is a run folder or its adapter/.

    `method` defaults to the one in the run folder's `train_config.json`. Returns the model to use (a
    `PeftModel` for LoRA methods); the base stays frozen.
    """
    path = Path(path)
    named_by = "method="
    if (path / ADAPTER_DIR).is_dir():  # a run folder
        if method is None and (path / CONFIG_NAME).is_file():
            method, named_by = _read_json(path / CONFIG_NAME).get("method"), f"{path / CONFIG_NAME} names method "
        path = path / ADAPTER_DIR
    found = _method_of(path)
    if method is None:
        method = found
    if method not in METHODS:
        raise ValueError(f"{named_by}{method!r}; allowed values: {list(METHODS)}")
    if _kind(method) != _kind(found):  # lora and lora_matched hold the same kind of weights
        raise ValueError(f"{named_by}{method!r}, but the adapter in {path} holds {found!r} weights; nothing was loaded")
    spec = METHOD_SPECS[method]
    ours, lora = path, path / LORA_SUBDIR  # train()'s layout; a Trainer checkpoint has them the other way round
    if spec.lora and (path / PREPROJ_SUBDIR / _adapter.ADAPTER_CONFIG_NAME).is_file():
        ours, lora = path / PREPROJ_SUBDIR, path
    if spec.preproj or spec.skip:
        model = _adapter.load_adapter(model, ours)
    if spec.lora:
        model = PeftModel.from_pretrained(model, str(lora if (spec.preproj or spec.skip) else path))
    return model


def _read_json(path: Path) -> dict[str, Any]:
    try:
        d = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise ValueError(f"{path} is not valid JSON ({e})") from None
    except RecursionError:  # json.loads of a file nested thousands of levels deep
        what = "adapter config" if path.name == _adapter.ADAPTER_CONFIG_NAME else "JSON file"
        raise ValueError(f"corrupt {what} {path}: nested too deeply") from None
    if not isinstance(d, dict):
        raise ValueError(f"{path} holds a JSON {type(d).__name__}, expected an object")
    return d


def _method_of(path: Path) -> str:
    """The method an adapter folder holds, from its tags: peft's `peft_type`, ours `adapter_type` + `method`
    (files written before the tag: read from the config's preproj/skip flags)."""
    cfg_file = path / _adapter.ADAPTER_CONFIG_NAME
    if not cfg_file.is_file():
        raise FileNotFoundError(f"no adapter in {path} (missing {cfg_file.name})")
    desc = _read_json(cfg_file)
    if is_other_peft_method(desc):  # LoRA at the top: alone, or a Trainer checkpoint of preproj_lora (ours below)
        return "preproj_lora" if (path / PREPROJ_SUBDIR / _adapter.ADAPTER_CONFIG_NAME).is_file() else "lora"
    desc = as_description(desc, f"adapter config {cfg_file}")
    cfg = desc.get("config")
    if not isinstance(cfg, dict):
        raise ValueError(f"corrupt adapter config {cfg_file}: 'config' must be an object, got {type(cfg).__name__}")
    method = desc.get("method")
    if method is None:  # an adapter saved before the tag
        parts = (cfg.get("preproj") is True, cfg.get("skip") is True)
        if parts == (False, False):
            raise ValueError(f"corrupt adapter config {cfg_file}: neither preproj nor skip is true")
        method = PreProjConfig(preproj=parts[0], skip=parts[1]).method
    if method not in METHOD_SPECS or METHOD_SPECS[method].lora:
        raise ValueError(f"corrupt adapter config {cfg_file}: method={method!r} is not an mmpreproj adapter method")
    if (path / LORA_SUBDIR).is_dir():
        return "preproj_lora"
    return method
