"""`mmpreproj.save_pretrained(model, DIR)`: the whole-model folder of an injected transformers model (read back
by `from_pretrained`, `pretrained_load.py`): the base checkpoint that plain `from_pretrained` reloads bit-exact,
and the adapter beside it.

    mmpreproj.save_pretrained(model, DIR)           # DIR: the base (config.json, model.safetensors, ...)
                                                    # DIR/adapter/: adapter_config.json + adapter_model.safetensors
    base = AutoModelForCausalLM.from_pretrained(DIR)            # the base, no missing or unexpected keys
    mmpreproj.load_adapter(base, DIR)                           # the injected model again, bit-exact
    model = mmpreproj.from_pretrained(DIR)                      # both in one call
    mmpreproj.save_pretrained(model, DIR, adapter_only=True)    # DIR: only the adapter files (a Trainer checkpoint)

Why `adapter/` and not DIR itself: transformers' `from_pretrained` takes a model folder that holds an
`adapter_config.json` for a peft adapter (with peft installed) and fails on ours, so the plain reload of the
base would break. A training run folder keeps its adapter in `adapter/` too; `load_adapter` reads either.

How: for the length of the call the wrappers are swapped for the attention modules they hold and the
`modules_to_save` get their inject-time values back, so transformers saves exactly the base with its own
machinery (tied weights, shards, quantizer, weight-name conversions); everything is put back afterwards,
also when the save fails. The trained `modules_to_save` values go to the adapter. A `state_dict=` the
caller passes (the Trainer does, under some launchers) is translated the same way (`split_state_dict`).

Only this function writes such a folder: `inject` and `load_adapter` put nothing on the model instance (as peft's
`inject_adapter_in_model` does not), so an injected model's own `model.save_pretrained` is its class's, which
writes the wrapped model's keys (`base_layer.`, the adapter's) that a plain `from_pretrained` does not read as
the base. A `PeftModel` (`peft.get_peft_model`) saves itself, adapter only; that is the model for a `Trainer`.

The two halves are two writes (transformers', then ours), so each records which save it belongs to: a fresh
token goes into the base's `config.json` (`mmpreproj_save_token`, written with the config, before the
weights) and into the adapter's config (`base_save_token`). A save killed between the halves leaves a new
base beside an old adapter; `load_adapter(model, DIR)` and `from_pretrained(DIR)` refuse such a pair
(`check_saved_pair`) instead of loading it. A folder saved before tokens existed has none in either half.
"""

from __future__ import annotations

import contextlib
import json
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..util.io import set_new_file_modes
from ..util.validate import check_flags
from .file_check import BASE_FILES, refuse_links
from .files import BASE_SAVE_TOKEN, PRETRAINED_ADAPTER_DIR, save_adapter
from .layer import PreProjAttention
from .state import STATE_ATTR, named_adapter, wrappers_aside
from .state_dict import (
    SLOTS,
    adapter_state_dict,
    copy_adapter_weights,
    local_adapter_state_dict,
    refuse_non_finite,
    refuse_peft_heads,
    restore_saved_modules,
    saved_module_tensors,
)

SAVE_TOKEN_KEY = "mmpreproj_save_token"  # in the base's config.json: the save_pretrained call that wrote it

_WRAPPER_OWN = tuple(f"{slot}." for slot in SLOTS)  # wrapper state that is not the base's


def _wrappers_by_name(model: nn.Module) -> dict[str, PreProjAttention]:
    return {name: m for name, m in model.named_modules() if isinstance(m, PreProjAttention)}


def split_state_dict(
    model: nn.Module, state_dict: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, torch.Tensor] | None]:
    """A full state dict of the injected `model` -> (the base's, keyed and valued as before `inject`;
    the adapter's, keyed as `adapter_state_dict` keys it, or None when `state_dict` lacks some of it).

    Under a wrapper `P`: `P.base_layer.X` -> `P.X`, the active adapter's `P.preproj.{name}.*` /
    `P.preproj_skip.{name}.*` -> the adapter (`P.preproj.*`), the other adapters are dropped. A `modules_to_save`
    module's keys keep their names with the inject-time values in the base, the given values go to the adapter.
    ValueError naming any other key under a wrapper.
    """
    state = vars(model)[STATE_ATTR]
    wrappers = _wrappers_by_name(model)
    saved = {path: name for name, path in state.modules_to_save.items()}
    base: dict[str, Any] = {}
    adapter: dict[str, torch.Tensor] = {}
    for key, value in state_dict.items():
        parts = key.split(".")
        prefix = next((".".join(parts[:i]) for i in range(1, len(parts)) if ".".join(parts[:i]) in wrappers), None)
        if prefix is not None:
            rest = key[len(prefix) + 1 :]
            if rest.startswith("base_layer."):
                base[f"{prefix}.{rest[len('base_layer.') :]}"] = value
            elif rest.startswith(_WRAPPER_OWN):
                slot, _, named = rest.partition(".")
                name, _, param = named.partition(".")
                if name == wrappers[prefix].active_adapters[0]:
                    adapter[f"{prefix}.{slot}.{param}"] = value
            else:
                raise ValueError(f"save_pretrained: state_dict key {key!r} is neither the base's nor the adapter's")
            continue
        path = next((p for p in saved if key.startswith(p + ".")), None)
        if path is not None:
            rest = key[len(path) + 1 :]
            adapter[key] = value
            value = state.saved_originals[f"{saved[path]}.{rest}"]
        base[key] = value
    complete = set(adapter) == set(local_adapter_state_dict(model))  # keys only: no gather
    return base, adapter if complete else None


@contextlib.contextmanager
def base_view(model: nn.Module) -> Iterator[nn.Module]:
    """The injected `model` as its base inside the block: every wrapper swapped for the attention module
    it holds, `modules_to_save` at their inject-time values. Put back afterwards, bit-exact, also on error."""
    state = vars(model)[STATE_ATTR]
    kept = [(v, v.detach().clone()) for v in saved_module_tensors(model, state.modules_to_save).values()]
    with wrappers_aside(model):
        try:
            restore_saved_modules(model, state)
            yield model
        finally:
            copy_adapter_weights(kept)


@contextlib.contextmanager
def _save_token_in_config(model: nn.Module) -> Iterator[str | None]:
    """A fresh token on `model.config` (so transformers writes it into config.json) for the block; the
    config is put back afterwards. None when the model has no transformers-style config."""
    cfg = getattr(model, "config", None)
    if cfg is None or not callable(getattr(cfg, "to_json_string", None)):
        yield None
        return
    had, old = SAVE_TOKEN_KEY in vars(cfg), vars(cfg).get(SAVE_TOKEN_KEY)
    token = secrets.token_hex(8)
    setattr(cfg, SAVE_TOKEN_KEY, token)
    try:
        yield token
    finally:
        if had:
            setattr(cfg, SAVE_TOKEN_KEY, old)
        else:
            delattr(cfg, SAVE_TOKEN_KEY)


def config_save_token(config_file: str | Path) -> str | None:
    """The `mmpreproj_save_token` of a base's config.json; None when the file, or the key, is absent."""
    try:
        cfg = json.loads(Path(config_file).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return cfg.get(SAVE_TOKEN_KEY) if isinstance(cfg, dict) else None


def check_saved_pair(base_token: str | None, adapter_token: str | None, where: str | Path) -> None:
    """ValueError unless the base and the adapter of a `save_pretrained` folder come from one save."""
    if base_token != adapter_token:
        raise ValueError(
            f"{where}: the base and the adapter in its {PRETRAINED_ADAPTER_DIR}/ were written by different "
            f"save_pretrained calls (config.json {SAVE_TOKEN_KEY}={base_token!r}, adapter {BASE_SAVE_TOKEN}="
            f"{adapter_token!r}): a save was interrupted between its two halves, or one half was replaced. "
            "Nothing was loaded; save the model again, or name the adapter to use explicitly "
            "(from_pretrained(DIR, adapter=...), load_adapter(model, DIR/adapter))"
        )


def save_pretrained(
    model: nn.Module,
    save_directory: str | Path,
    *,
    adapter_only: bool = False,
    state_dict: dict[str, Any] | None = None,
    is_main_process: bool = True,
    **kwargs: Any,
) -> None:
    """The whole-model folder of an injected transformers `model`: the base in `save_directory` (plain
    `from_pretrained` reloads it) and the adapter in `save_directory/adapter/`; with `adapter_only=True` only the
    adapter files, in `save_directory` itself. `kwargs` go to the class's `save_pretrained` (shards, variant, ...).

    `state_dict`: the model's full one (translated by `split_state_dict`) or the adapter's alone (keyed as
    `adapter_state_dict` keys it; the base is then read from the model). A sharded model (FSDP2) saved by
    the main process alone needs it (the full state dict every rank gathered, as the Trainer passes it):
    without it the adapter is gathered from the model, a collective every rank must call."""
    check_flags("save_pretrained", adapter_only=adapter_only)
    cls_save = getattr(type(model), "save_pretrained", None)
    if not isinstance(model, nn.Module) or STATE_ATTR not in vars(model) or not callable(cls_save):
        raise ValueError(
            f"mmpreproj.save_pretrained: {type(model).__name__} is not an inject()ed transformers model (no injection "
            "of its own, or no save_pretrained on its class); save a PeftModel with its own save_pretrained, an "
            "adapter alone with mmpreproj.save_adapter; nothing was written"
        )
    refuse_peft_heads(model, "save_pretrained")
    named_adapter(model, None)  # an injection whose adapters were all deleted has none to save
    if kwargs.get("push_to_hub"):
        raise ValueError(
            "save_pretrained(push_to_hub=True) of an injected model is not supported: save to a folder, then "
            "upload it with huggingface_hub.upload_folder (the adapter is in its adapter/ subfolder)"
        )
    folder = Path(save_directory)
    if folder.is_file():
        raise ValueError(f"save_pretrained: {folder} is a file; pass a folder")
    if state_dict is None:
        base_sd, adapter_sd = None, None
    elif set(state_dict) == set(local_adapter_state_dict(model)):  # already the adapter's (keys only: no gather)
        base_sd, adapter_sd = None, state_dict
    else:
        base_sd, adapter_sd = split_state_dict(model, state_dict)
    if adapter_only:
        if is_main_process:
            save_adapter(model, folder, state_dict=adapter_sd)
        return
    _refuse_torchao_base(model)
    refuse_links(folder, (*BASE_FILES, PRETRAINED_ADAPTER_DIR), "save_pretrained")  # transformers writes in place
    if adapter_sd is None:  # gathered once, before the base is written (a collective: every rank calls)
        adapter_sd = adapter_state_dict(model)
    # what save_adapter refuses, refused before transformers writes the base (a new config.json token would leave
    # the folder's earlier adapter unpaired)
    refuse_non_finite(adapter_sd, f"save_pretrained: refusing to write {folder}")
    with base_view(model), _save_token_in_config(model) as token:  # config.json carries the token
        cls_save(model, save_directory, is_main_process=is_main_process, state_dict=base_sd, **kwargs)
    if is_main_process:  # transformers writes its safetensors 0600 whatever the umask
        set_new_file_modes(folder, tuple(p.name for p in folder.glob("model*.safetensors")))
        save_adapter(model, folder / PRETRAINED_ADAPTER_DIR, state_dict=adapter_sd, readme=True, base_save_token=token)


def _refuse_torchao_base(model: nn.Module) -> None:
    """A base quantized in place by torchao (`quantize_frozen_base(model, "int8")`, no transformers quantizer)
    cannot be written by transformers' `save_pretrained` (it fails after writing config.json): refused first."""
    if getattr(model, "hf_quantizer", None) is not None:
        return
    ao = next((n for n, p in model.named_parameters() if type(p).__module__.split(".")[0] == "torchao"), None)
    if ao is not None:
        raise ValueError(
            f"save_pretrained: the base holds torchao int8 weights (e.g. {ao!r}), which transformers cannot save; "
            "nothing was written. Save the adapter alone (mmpreproj.save_pretrained(model, DIR, adapter_only=True) or "
            "mmpreproj.save_adapter) and keep the float base: quantize it again after loading, then load_adapter"
        )
