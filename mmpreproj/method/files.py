"""The one adapter format, and its writer and reader: `save_adapter` writes an adapter folder, `read_adapter`
reads it back (description, tensors), the two files replaced together (`util.file_sets`).

On disk an adapter is a peft adapter: `adapter_config.json` holds the flat `PreProjConfig` (with
`peft_type: "PREPROJ"`) and `injection`, what the injection resolved; `adapter_model.safetensors` keys each
weight as the model's `state_dict()` does without the adapter name, behind peft's `base_model.model.` prefix:

    base_model.model.gpt_neox.layers.3.attention.preproj.up.weight     (an injected weight)
    base_model.model.multi_modal_projector.linear_1.weight             (a base module of modules_to_save)

In memory the description is `InjectionState.describe()` with the adapter's `config` nested
(`describe_for_save`: what the tuner hands peft and `save_adapter` writes); older layouts
(`adapter_type: "mmpreproj"`, block-index keys) are read by `convert.py`. `check_file_keys` checks a file's keys
against its own description before any of it meets a model.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Literal

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn

from mmpreproj_tables.sources import adapter_folder
from mmpreproj_tables.tables import ADAPTER_CONFIG_NAME, ADAPTER_DIR, ADAPTER_WEIGHTS_NAME

from ..hosts.paths import check_path
from ..hosts.spec import HostError
from ..timm_rope.saved import describe_rope
from ..util.file_sets import committed_files, write_files
from ..util.validate import check_flags
from ..version import __version__
from .config import ADAPTER_FORMAT
from .convert import OLD_SLOTS, is_legacy_description, model_keys
from .file_check import (
    ADAPTER_TYPE,
    DIGEST_KEY,
    PEFT_HEAD_TASKS,
    PEFT_PREFIX,
    check_weights_digest,
    record_sites,
    weights_digest,
)
from .model_card import card_fields, model_card
from .state import STATE_ATTR, InjectionState, active_name, injected_owner, named_adapter
from .state_dict import (
    SLOTS,
    adapter_state_dict,
    injected_paths,
    is_slot_key,
    named_adapter_tensors,
    refuse_empty,
    refuse_non_finite,
    refuse_peft_heads,
)


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
    name, config = named_adapter(owner, name)
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


PRETRAINED_ADAPTER_DIR = ADAPTER_DIR  # where `save_pretrained` (and a training run) keeps the adapter
BASE_SAVE_TOKEN = "base_save_token"  # in the adapter's config: the token of the base written beside it


def save_adapter(
    model: nn.Module,
    path: str | Path,
    *,
    state_dict: dict[str, torch.Tensor] | None = None,
    adapter_name: str | None = None,
    readme: bool = False,
    base_save_token: str | None = None,
) -> Path:
    """Write only the injected weights (`adapter_model.safetensors`) and `adapter_config.json` to `path`.

    `state_dict` is what to write (default `adapter_state_dict(model)`, keyed by block index): on a model
    sharded by FSDP2 the default gathers, a collective every rank must call; when only one rank writes, pass
    what every rank gathered (`adapter_state_dict`, or `adapter_tensors_from_state_dict` of the model's full
    state dict). Each file is written to a temporary name and renamed,
    so a crash never leaves a torn file, and the two files are replaced together (`util.file_sets`): a
    reader sees the old pair or the new one, never a mix. `model` may be wrapped (peft, DDP, a container,
    `torch.compile`). Non-finite weights are refused before anything is written.

    `adapter_name` saves one of several loaded adapters (default: the active one, `method/adapters.py`);
    `readme=True` also writes a short model card, README.md (`method/model_card.py`), in the same commit.
    `base_save_token`: the token `save_pretrained` wrote into the base beside this adapter (`pretrained_save.py`).
    """
    check_flags("save_adapter", readme=readme)
    owner, state = injected_owner(model, "save_adapter")
    refuse_peft_heads(owner, "save_adapter")
    if not isinstance(path, (str, os.PathLike)) or not str(path):
        raise ValueError(f"save_adapter: path={path!r}; must be a folder path (a non-empty str or os.PathLike)")
    path = Path(path)
    name, _ = named_adapter(owner, adapter_name)
    if state_dict is None:  # the active adapter's gathered from FSDP2 shards (a collective: every rank calls)
        active = name == active_name(owner)
        state_dict = adapter_state_dict(owner) if active else named_adapter_tensors(owner, name)
    state_dict = model_keys(state_dict, injected_paths(owner), state.modules_to_save)  # older keys: convert.py
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in state_dict.items()}
    refuse_non_finite(tensors, f"save_adapter: refusing to write {path}")
    try:
        refuse_empty(tensors, "the weights to save")
    except ValueError as e:
        raise ValueError(f"save_adapter: refusing to write {path}: {e}") from None
    meta = {"format": "pt", "mmpreproj_version": __version__}
    desc = describe_for_save(owner, name, tensors)
    if base_save_token is not None:
        desc[BASE_SAVE_TOKEN] = base_save_token
    desc[DIGEST_KEY] = weights_digest(tensors)  # as the tuner records it: a torn pair is refused on load
    tensors = {f"{PEFT_PREFIX}{k}": v for k, v in tensors.items()}  # peft's file keys
    text = json.dumps(peft_config_from_description(desc), indent=2, sort_keys=True) + "\n"
    writers = {
        ADAPTER_WEIGHTS_NAME: lambda f: save_file(tensors, f, metadata=meta),
        ADAPTER_CONFIG_NAME: lambda f: Path(f).write_text(text, encoding="utf-8"),
    }
    if readme:
        card = model_card(desc)
        writers["README.md"] = lambda f: Path(f).write_text(card, encoding="utf-8")
    write_files(path, writers)
    return path


def read_adapter(path: str | Path) -> tuple[dict, dict[str, torch.Tensor]]:
    """Read and parse an adapter folder: (description, tensors keyed as `adapter_state_dict` keys them, or in the
    block-index keys of an older folder: `convert.model_keys` maps those onto the model). Clear errors for
    missing/corrupt files, a config that is not an object and weights that are not finite (the tensor is named).

    `path` is an adapter folder or a folder holding one as `adapter/` (`adapter_folder`)."""
    path = adapter_folder(path)
    with committed_files(path, (ADAPTER_CONFIG_NAME, ADAPTER_WEIGHTS_NAME)) as files:
        cfg_file, weights_file = files[ADAPTER_CONFIG_NAME], files[ADAPTER_WEIGHTS_NAME]
        for f in (cfg_file, weights_file):
            if not f.is_file():
                raise FileNotFoundError(f"adapter file missing: {path / f.name}")
        try:
            desc = json.loads(cfg_file.read_text(encoding="utf-8"))
            peft_layout = isinstance(desc, dict) and not is_legacy_description(desc)
            if peft_layout:
                desc = description_from_peft_config(desc, "peft adapter")
            if isinstance(desc, dict) and desc.get("adapter_type", ADAPTER_TYPE) != ADAPTER_TYPE:
                raise ValueError(f"adapter_type={desc['adapter_type']!r}, expected {ADAPTER_TYPE!r}")
            if not isinstance(desc, dict) or "config" not in desc:
                raise ValueError("no 'config' key")
            if not isinstance(desc["config"], dict):
                raise ValueError(
                    f"'config' must be an object of PreProjConfig fields, got {type(desc['config']).__name__}"
                )
            if not isinstance(desc.get("modules_to_save") or {}, dict):
                raise ValueError(
                    f"injection.modules_to_save={desc['modules_to_save']!r:.60} is not an object of name -> path"
                )
        except (json.JSONDecodeError, ValueError, UnicodeDecodeError) as e:
            raise ValueError(f"corrupt adapter config {path / ADAPTER_CONFIG_NAME}: {e}") from None
        except RecursionError:  # json.loads of a file nested thousands of levels deep
            raise ValueError(f"corrupt adapter config {path / ADAPTER_CONFIG_NAME}: nested too deeply") from None
        try:
            tensors = load_file(str(weights_file))
        except (SafetensorError, OSError, ValueError) as e:
            raise ValueError(f"corrupt adapter weights {path / ADAPTER_WEIGHTS_NAME}: {e}") from None
        file_tensors = tensors
        refuse_non_finite(tensors, f"adapter weights {path / ADAPTER_WEIGHTS_NAME}")  # named by the file's keys
        if peft_layout:
            tensors = {k.removeprefix(PEFT_PREFIX): v for k, v in tensors.items()}
            check_file_keys(tensors, desc, f"adapter weights {path / ADAPTER_WEIGHTS_NAME}")
        # last, so a specific fault above is named first: a save cut short, or tensors renamed or edited
        check_weights_digest(desc.get(DIGEST_KEY), file_tensors, path / ADAPTER_WEIGHTS_NAME)
    return desc, tensors


def check_file_keys(tensors: dict[str, torch.Tensor], desc: dict, where: str) -> None:
    """ValueError naming `where` unless the description's `layers` and `modules` are aligned lists of block
    indices and paths, every path (and each `modules_to_save` one) is well-formed (`hosts.paths.check_path`),
    and every key (peft's prefix removed) lies under an injected block's slot or a saved module. Strings from
    the file, compared as strings: nothing is resolved against a model here."""
    modules = record_sites(desc, where)
    saved = desc.get("modules_to_save") or {}
    try:
        for i, module_path in enumerate(modules):
            check_path(module_path, f"injection.modules[{i}]")
        for name, module_path in saved.items():
            check_path(module_path, f"injection.modules_to_save[{name!r}]")
    except (HostError, AttributeError) as e:
        raise ValueError(f"{where}: {e}") from None
    slots = (*SLOTS, *OLD_SLOTS)
    heads = tuple(f"{p}.{slot}." for p in modules for slot in slots) + tuple(f"{p}." for p in saved.values())
    task = (desc.get("config") or {}).get("task_type")
    for key in tensors:
        if not key.startswith(heads):
            hint = (
                f"; it is a head peft's task class (task_type {task!r}) wrapped and saved beside the adapter: load "
                "this folder with peft (PeftModel.from_pretrained(base, DIR), AutoPeftModelFor...), which restores it"
                if task in PEFT_HEAD_TASKS
                else ""
            )
            raise ValueError(
                f"{where}: weight {PEFT_PREFIX + key!r} belongs to no injected block nor saved module of this "
                f"adapter{hint}"
            )
