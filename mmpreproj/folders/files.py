"""An adapter folder: `save_adapter` writes it, `read_adapter` reads it back (description, tensors), in peft's
layout (`tuner/keys.py`: the config; weights keyed as the model keys them, peft's prefix added) with the two
files replaced together (`util.file_sets`); `check_file_keys` checks a file's keys against its own description
before any of it meets a model. The writer sits beside the loaders, above the tuner, as peft's own
`save_and_load` sits outside `peft/tuners/`."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn

from mmpreproj_cli.sources import adapter_folder
from mmpreproj_cli.tables import ADAPTER_CONFIG_NAME, ADAPTER_DIR, ADAPTER_WEIGHTS_NAME

from ..adapter_files.digest import DIGEST_KEY, check_weights_digest, weights_digest
from ..adapter_files.file_check import PEFT_HEAD_TASKS, PEFT_PREFIX
from ..adapter_files.model_card import model_card
from ..hosts.paths import check_path
from ..hosts.spec import HostError
from ..tuner.keys import describe_for_save, description_from_peft_config, peft_config_from_description
from ..tuner.legacy import OLD_SLOTS, is_legacy_description, model_keys
from ..tuner.state import ADAPTER_TYPE, named_adapter
from ..tuner.state_dict import (
    SLOTS,
    adapter_state_dict,
    injected_paths,
    named_adapter_tensors,
    refuse_empty,
    refuse_non_finite,
    refuse_peft_heads,
)
from ..tuner.unwrap import injected_owner
from ..util.file_sets import committed_files, write_files
from ..version import __version__

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

    `adapter_name` saves one of several loaded adapters (default: the active one, `tuner/named.py`);
    `readme=True` also writes a short model card, README.md (`adapter_files/model_card.py`), in the same commit.
    `base_save_token`: the token `save_pretrained` wrote into the base beside this adapter (`pretrained_save.py`).
    """
    owner, state = injected_owner(model, "save_adapter")
    refuse_peft_heads(owner, "save_adapter")
    path = Path(path)
    name, _ = named_adapter(state, adapter_name)
    if state_dict is None:  # the active adapter's gathered from FSDP2 shards (a collective: every rank calls)
        state_dict = adapter_state_dict(owner) if name == state.active_adapter else named_adapter_tensors(owner, name)
    state_dict = model_keys(state_dict, injected_paths(owner), state.modules_to_save)  # older keys: legacy.py
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
    block-index keys of an older folder: `tuner/legacy.model_keys` maps those onto the model). Clear errors for
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
    layers, modules = desc.get("layers"), desc.get("modules")
    if not (
        isinstance(layers, list)
        and isinstance(modules, list)
        and len(layers) == len(modules)
        and all(type(i) is int for i in layers)
    ):
        raise ValueError(
            f"{where}: 'injection' needs 'layers' (block indices) and 'modules' (their paths), "
            f"aligned lists; got layers={layers!r:.60}, modules={modules!r:.60}"
        )
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
