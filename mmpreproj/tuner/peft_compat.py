"""What differs between the peft versions mmpreproj supports (`peft_type.TESTED_PEFT`), in one place.

Each shim names the peft versions that need it and why; on the newest peft none is active, so the tuner's code
(`model.py`) is written once, against peft 0.21's interface. Within today's range (`peft_type.TESTED_PEFT`: 0.21)
none is active; the shim below is what takes peft 0.20 through the tuner's test subset (`make test-peft-floor
FLOOR_PEFT=0.20.0` with the guard relaxed), the first step towards 0.20 (`peft_type.py` lists what is left).

- `install_state_dict_dispatch` (peft < 0.21): peft 0.21 asks the tuner class which keys of a state dict are an
  adapter's and how they map to the model's (`BaseTuner._get_adapter_state_dict`,
  `_remove_adapter_name_from_key`, `_remap_adapter_state_dict_for_load`); older peft keeps one `if` per method in
  `get_peft_model_state_dict` / `set_peft_model_state_dict`, and for a registered method it keeps every key
  holding the method's prefix and moves the adapter name only where LoRA has it. So PREPROJ's keys would be saved
  with the adapter name in and its `modules_to_save` left out. On that peft, both functions are wrapped where peft
  bound them: a PREPROJ adapter goes through the tuner's hooks, as peft 0.21 does it; any other method goes to
  peft's own function unchanged.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

import peft
from packaging.version import Version
from peft.utils import save_and_load
from peft.utils.other import AuxiliaryTrainingWrapper
from torch import nn

from .peft_type import PREPROJ

PEFT_VERSION = Version(peft.__version__)
TUNER_STATE_DICT_HOOKS = Version("0.21")  # the first peft that asks the tuner class for the adapter's keys
PEFT_MODEL_PREFIX = "base_model.model."


def install_state_dict_dispatch(tuner_cls: type) -> None:
    """peft < 0.21: route a PREPROJ adapter's `get_peft_model_state_dict` / `set_peft_model_state_dict` through
    `tuner_cls`'s hooks, in every peft module that bound those functions; idempotent; a no-op on peft >= 0.21."""
    if PEFT_VERSION >= TUNER_STATE_DICT_HOOKS:
        return
    for name, make in (
        ("get_peft_model_state_dict", _get_through_hooks),
        ("set_peft_model_state_dict", _set_through_hooks),
    ):
        original = getattr(save_and_load, name)
        original = getattr(original, "__wrapped__", original)
        wrapped = make(original, tuner_cls)
        for module in list(sys.modules.values()):  # peft.utils, peft, peft.peft_model, ... bound it at import
            if (getattr(module, "__name__", "") or "").split(".")[0] == "peft":
                bound = vars(module).get(name)
                if bound is original or getattr(bound, "__wrapped__", None) is original:
                    setattr(module, name, wrapped)


def _get_through_hooks(original: Callable, tuner_cls: type) -> Callable:
    @functools.wraps(original)
    def get_peft_model_state_dict(
        model: nn.Module,
        state_dict: dict | None = None,
        adapter_name: str = "default",
        unwrap_compiled: bool = False,
        save_embedding_layers: bool | str = "auto",
    ) -> dict[str, Any]:
        inner = getattr(model, "_orig_mod", model) if unwrap_compiled else model  # as peft unwraps it
        config = inner.peft_config[adapter_name]
        if config.peft_type != PREPROJ:
            return original(model, state_dict, adapter_name, unwrap_compiled, save_embedding_layers)
        full = inner.state_dict() if state_dict is None else state_dict
        ours = tuner_cls._get_adapter_state_dict(
            model=inner,
            config=config,
            adapter_name=adapter_name,
            state_dict=full,
            unwanted_adapter_names=[n for n in inner.peft_config if n != adapter_name],
        )
        # peft's own function for the rest (its head wrappers, embeddings), given no key of any PREPROJ slot
        slots = tuple(f".{slot}." for slot in tuner_cls.tuner_layer_cls.adapter_layer_names)
        rest = {k: v for k, v in full.items() if k not in ours and not any(s in k for s in slots)}
        kept = original(inner, rest, adapter_name, False, save_embedding_layers)
        return {**kept, **{tuner_cls._remove_adapter_name_from_key(k, adapter_name): v for k, v in ours.items()}}

    return get_peft_model_state_dict


def _set_through_hooks(original: Callable, tuner_cls: type) -> Callable:
    @functools.wraps(original)
    def set_peft_model_state_dict(
        model: nn.Module,
        peft_model_state_dict: dict[str, Any],
        adapter_name: str = "default",
        ignore_mismatched_sizes: bool = False,
        low_cpu_mem_usage: bool = False,
    ) -> Any:
        config = model.peft_config[adapter_name]
        if config.peft_type != PREPROJ:
            return original(model, peft_model_state_dict, adapter_name, ignore_mismatched_sizes, low_cpu_mem_usage)
        # peft 0.21's steps: its head wrappers' keys first, then the tuner's remap (which checks every key and
        # shape, so `ignore_mismatched_sizes` has nothing left to ignore), then one non-strict load
        state_dict = dict(peft_model_state_dict)
        for name, module in model.named_modules():
            if isinstance(module, AuxiliaryTrainingWrapper):
                for key, target in module.adapter_state_dict_load_map(adapter_name).items():
                    state_dict[f"{name}.{target}"] = state_dict.pop(f"{name}.{key}")
        remapped = tuner_cls._remap_adapter_state_dict_for_load(
            model=model, config=config, adapter_name=adapter_name, state_dict=state_dict
        )
        if not any(n.startswith(PEFT_MODEL_PREFIX) for n, _ in model.named_parameters()):
            remapped = {k.removeprefix(PEFT_MODEL_PREFIX): v for k, v in remapped.items()}
        result = model.load_state_dict(remapped, strict=False, assign=low_cpu_mem_usage)
        if low_cpu_mem_usage:
            for module in model.modules():
                if hasattr(module, "_move_adapter_to_device_of_base_layer"):
                    module._move_adapter_to_device_of_base_layer(adapter_name)
        return result

    return set_peft_model_state_dict
