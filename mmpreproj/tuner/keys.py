"""The adapter file's config: peft's `adapter_config.json` object <-> the in-memory description.

On disk an adapter is a peft adapter: `adapter_config.json` holds the flat `PreProjConfig` (with
`peft_type: "PREPROJ"`) and `injection`, what the injection resolved; `adapter_model.safetensors` keys each
weight as the model's `state_dict()` does without the adapter name, behind peft's `base_model.model.` prefix:

    base_model.model.gpt_neox.layers.3.attention.preproj.up.weight     (an injected weight)
    base_model.model.multi_modal_projector.linear_1.weight             (a base module of modules_to_save)

In memory the description is `InjectionState.describe()` with the adapter's `config` nested
(`describe_for_save`: what the tuner hands peft and `save_adapter` writes); older layouts
(`adapter_type: "mmpreproj"`, block-index keys) are read by `legacy.py`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

import torch
from torch import nn

from ..adapter_files.model_card import card_fields
from ..timm_rope.saved import describe_rope
from .config import ADAPTER_FORMAT
from .legacy import is_legacy_description
from .state import InjectionState, named_adapter
from .state_dict import is_slot_key, named_adapter_tensors
from .unwrap import STATE_ATTR


def is_other_peft_method(cfg: dict[str, Any]) -> bool:
    """Whether an `adapter_config.json` object is another peft method's (LoRA, ...): a `peft_type` not PREPROJ."""
    return "peft_type" in cfg and cfg["peft_type"] != "PREPROJ"


def config_kind(cfg_file: Path) -> Literal["ours", "other"] | None:
    """Whose `adapter_config.json` `cfg_file` is: "other" (another peft method's: LoRA, ...), "ours" (any other
    JSON object: our loader names what may be wrong with it), None when it cannot be read as a JSON object."""
    try:
        cfg = json.loads(cfg_file.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(cfg, dict):
        return None
    return "other" if is_other_peft_method(cfg) else "ours"


def as_description(cfg: dict[str, Any], where: str) -> dict[str, Any]:
    """The in-memory description of either layout of our `adapter_config.json` (the converter's entry)."""
    return cfg if is_legacy_description(cfg) else description_from_peft_config(cfg, where)


def injection_of(desc: dict[str, Any]) -> dict[str, Any]:
    """A description without its `config`: the `injection` record of the peft layout."""
    return {k: v for k, v in desc.items() if k != "config"}


def peft_config_from_description(desc: dict[str, Any]) -> dict[str, Any]:
    """The peft `adapter_config.json` object of an in-memory description (`InjectionState.describe` plus the
    writer's keys): the config's fields at the top level, everything else under `injection`."""
    config = dict(desc["config"])
    config["injection"] = injection_of(desc)
    config["base_model_name_or_path"] = config.get("base_model_name_or_path") or desc.get("base_model_name_or_path")
    return config


def description_from_peft_config(cfg: dict[str, Any], where: str) -> dict[str, Any]:
    """The in-memory description of a peft-layout `adapter_config.json` object (inverse of
    `peft_config_from_description`); ValueError naming `where` when it is not a PREPROJ adapter."""
    if cfg.get("peft_type") != "PREPROJ":
        raise ValueError(
            f"{where}: peft_type={cfg.get('peft_type')!r}, not a pre-projection adapter (peft_type 'PREPROJ'); "
            "load other peft methods with peft"
        )
    injection = cfg.get("injection")
    if not isinstance(injection, dict):
        raise ValueError(f"{where}: 'injection' must be the object the tuner wrote, got {type(injection).__name__}")
    desc = dict(injection)
    desc["config"] = {k: v for k, v in cfg.items() if k != "injection"}
    return desc


def describe_for_save(owner: nn.Module, name: str, tensors: dict[str, torch.Tensor] | None = None) -> dict:
    """The description written beside adapter `name`'s weights: the injection (`InjectionState.describe`),
    the adapter's config, the `add_rope` positions and the model card's fields."""
    state: InjectionState = vars(owner)[STATE_ATTR]
    name, config = named_adapter(state, name)
    desc = state.describe()
    rope = describe_rope(owner)
    if rope is not None:  # add_rope positions: load_adapter restores or checks them
        desc["rope"] = rope
    desc["config"] = {**config.to_dict(), "format_version": ADAPTER_FORMAT}  # the keys are written as today
    tensors = named_adapter_tensors(owner, name) if tensors is None else tensors
    # every tensor's shape, by its key: a loader checks the model's against it before injecting
    desc["tensor_shapes"] = {k: list(v.shape) for k, v in sorted(tensors.items())}
    injected = sum(v.numel() for k, v in tensors.items() if is_slot_key(k))
    to_save = sum(v.numel() for k, v in tensors.items() if not is_slot_key(k))
    for k, v in card_fields(owner, name, injected, to_save).items():
        desc.setdefault(k, v)  # keys another writer already put in describe() win
    return desc
