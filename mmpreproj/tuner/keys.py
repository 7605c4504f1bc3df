"""The adapter file's two layouts and the one converter between them.

On disk an adapter is a peft adapter: `adapter_config.json` holds the flat `PreProjConfig` (with
`peft_type: "PREPROJ"`) and `injection`, what the injection resolved; `adapter_model.safetensors` keys each
weight by peft's convention, the module path in the model behind peft's `base_model.model.` prefix:

    base_model.model.gpt_neox.layers.3.attention.preproj.up.weight     (an injected weight)
    base_model.model.multi_modal_projector.linear_1.weight             (a base module of modules_to_save)

In memory (and in folders written by mmpreproj <= 0.3, `adapter_type: "mmpreproj"`) the same weights are keyed
by the host's block index, which needs no model to read (`state.adapter_key`):

    blocks.3.preproj.up.weight          modules.projector.linear_1.weight

`injection["modules"]` lists the wrapper's path for each injected block (aligned with `injection["layers"]`),
and `injection["modules_to_save"]` each saved module's path, so the conversion is a table lookup on strings
from the file, checked for form (`hosts.paths.check_path`) and never resolved against a model here.
"""

from __future__ import annotations

from typing import Any

import torch

from ..hosts.paths import check_path
from ..hosts.spec import HostError
from .state import adapter_key, parse_adapter_key

__all__ = [
    "PEFT_PREFIX",
    "SLOTS",
    "as_description",
    "is_other_peft_method",
    "block_keys_from_peft",
    "block_keys_to_peft",
    "description_from_peft_config",
    "injection_of",
    "is_legacy_description",
    "peft_config_from_description",
]

PEFT_PREFIX = "base_model.model."  # what peft puts before a module path in its files
SLOTS = ("preproj", "skip")  # the adapter slots of a wrapper, by attribute name (the layer's adapter_layer_names)


def is_other_peft_method(cfg: dict[str, Any]) -> bool:
    """Whether an `adapter_config.json` object is another peft method's (LoRA, ...): a `peft_type` not PREPROJ."""
    return "peft_type" in cfg and cfg["peft_type"] != "PREPROJ"


def as_description(cfg: dict[str, Any], where: str) -> dict[str, Any]:
    """The in-memory description of either layout of our `adapter_config.json` (the converter's entry)."""
    return cfg if is_legacy_description(cfg) else description_from_peft_config(cfg, where)


def is_legacy_description(cfg: dict[str, Any]) -> bool:
    """Whether an `adapter_config.json` object is mmpreproj's old layout (a nested `config`, no `peft_type`)."""
    return "peft_type" not in cfg and "config" in cfg


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


def _module_table(desc: dict[str, Any], where: str) -> tuple[dict[int, str], dict[str, str]]:
    """({block index: wrapper path}, {saved module name: path}) from a description, each path checked for form."""
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
        for i, path in enumerate(modules):
            check_path(path, f"injection.modules[{i}]")
        for name, path in saved.items():
            check_path(path, f"injection.modules_to_save[{name!r}]")
    except (HostError, AttributeError) as e:
        raise ValueError(f"{where}: {e}") from None
    return dict(zip(layers, modules)), dict(saved)


def block_keys_to_peft(
    tensors: dict[str, torch.Tensor], desc: dict[str, Any], prefix: str = PEFT_PREFIX, where: str = "adapter"
) -> dict[str, torch.Tensor]:
    """Block-index keys (`blocks.{i}.{slot}.{param}`, `modules.{name}.{param}`) -> peft keys."""
    blocks, saved = _module_table(desc, where)
    out = {}
    for key, value in tensors.items():
        index, module, param = parse_adapter_key(key)
        if index is None:  # a saved module's name may be an attribute path ("gpt_neox.final_layer_norm")
            module = _saved_name(key, saved, where)
            param = key[len(f"modules.{module}.") :]
        path = saved[module] if index is None else f"{blocks[index]}.{module}"
        out[f"{prefix}{path}.{param}"] = value
    return out


def _saved_name(key: str, saved: dict[str, str], where: str) -> str:
    """The `modules_to_save` name a `modules.{name}.{param}` key belongs to: the longest name that prefixes it
    (a name may hold dots, so the key alone cannot be split)."""
    name = max((n for n in saved if key.startswith(f"modules.{n}.")), key=len, default=None)
    if name is None:
        raise ValueError(f"{where}: weight {key!r} belongs to no saved module of this adapter ({sorted(saved)})")
    return name


def block_keys_from_peft(
    tensors: dict[str, torch.Tensor], desc: dict[str, Any], where: str = "adapter"
) -> dict[str, torch.Tensor]:
    """peft keys (with or without the `base_model.model.` prefix) -> block-index keys; ValueError naming a key
    that is no weight of this adapter."""
    blocks, saved = _module_table(desc, where)
    table = {f"{path}.{slot}.": (index, slot) for index, path in blocks.items() for slot in SLOTS}
    table.update({f"{path}.": (None, name) for name, path in saved.items()})
    out = {}
    for key, value in tensors.items():
        bare = key.removeprefix(PEFT_PREFIX)
        head = max((h for h in table if bare.startswith(h)), key=len, default=None)
        if head is None:
            raise ValueError(f"{where}: weight {key!r} belongs to no injected block nor saved module of this adapter")
        index, module = table[head]
        out[adapter_key(index, module, bare[len(head) :])] = value
    return out
