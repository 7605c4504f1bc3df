"""`preproj_lora`'s model: peft's LoRA and our adapter around the attention that holds it, one folder written and
read by peft's own calls.

    DIR/adapter_config.json, adapter_model.safetensors            peft's LoRA, exactly as peft writes it for the base
    DIR/preproj/adapter_config.json, adapter_model.safetensors    our adapter (`save_adapter`), where peft
                                                                  writes an adapter named "preproj"

LoRA goes in first (`stacked_peft_model`): our wrapper is peft's tuner layer, and peft never injects inside one. peft's
calls that visit LoRA's layers (its save, `load_adapter`, `add_adapter`, `merge_and_unload`) run with our wrappers
set aside (`wrappers_aside`), so they see the LoRA model they built: the file at DIR holds LoRA's keys as on the plain
base, and `peft.PeftModel.from_pretrained(base, DIR)` reads it. `save_pretrained` writes both (train(), a Trainer's
checkpoints, users); `load_adapter` reads both (a Trainer's resume and best-model reload), our weights checked (keys,
shapes, dtypes, finite values) before either part changes; `unload` takes ours off, then LoRA. One class per peft task
class (`peft.auto.MODEL_TYPE_TO_PEFT_MODEL_MAPPING`); `mmpreproj.load_adapter(base, DIR)` reads the folder onto a fresh
base. Older files (LoRA's keys inside our wrapper, ours in LoRA's file too) are read by `method/convert.py`'s rules.
"""

from __future__ import annotations

import contextlib
import os
from collections import namedtuple
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import peft
import torch
from peft.auto import MODEL_TYPE_TO_PEFT_MODEL_MAPPING
from safetensors.torch import load_file
from torch import nn

from .apply import unload as unload_ours
from .config import PreProjConfig
from .convert import OLD_STACKED_LORA_KEYS
from .file_check import PEFT_PREFIX
from .files import ADAPTER_CONFIG_NAME, ADAPTER_WEIGHTS_NAME, config_kind, read_adapter, save_adapter
from .inject import inject
from .layer import BASE_ADAPTER, hand_mixed_names
from .state import active_name, injected_modules, injected_owner, injected_owners, owner_prefix, wrappers_aside
from .state_dict import (
    adapter_state_dict,
    adapter_tensors_from_state_dict,
    checked_adapter_copies,
    copy_adapter_weights,
    is_slot_key,
    refuse_empty,
    refuse_non_finite,
    set_adapter_trainable,
)

# The fields of what torch's `load_state_dict` and peft's `load_adapter` return (torch's own class is private)
IncompatibleKeys = namedtuple("IncompatibleKeys", ["missing_keys", "unexpected_keys"])

PREPROJ_SUBDIR = "preproj"  # our adapter's folder below peft's LoRA (peft's folder for an adapter of that name)


class _Stacked:
    """What the stacked classes add to peft's: our adapter saved and loaded with the LoRA (module docstring)."""

    def save_pretrained(
        self,
        save_directory: str | os.PathLike,
        safe_serialization: bool = True,
        selected_adapters: list[str] | None = None,
        save_embedding_layers: str | bool = "auto",
        is_main_process: bool = True,
        path_initial_model_for_weight_conversion: str | None = None,
        **kwargs: Any,
    ) -> None:
        """peft's `save_pretrained` (the LoRA at `save_directory`), then our adapter at `save_directory/preproj`.

        A given `state_dict` (a Trainer's or accelerate's full state dict, gathered under FSDP / ZeRO-3, keys
        `base_model.model.`...) is where our weights are read, on the main process, never the live (sharded)
        ones; without one they are the model's (`adapter_state_dict`: FSDP2 shards gathered, so every rank
        calls, as for peft's own save). Refused before any file is written: a LoRA adapter named "preproj"
        (peft would write it to the same folder), a `state_dict` lacking our weights, non-finite values."""
        if PREPROJ_SUBDIR in self.peft_config:
            raise ValueError(
                f"save_pretrained: a LoRA adapter is named {PREPROJ_SUBDIR!r}, the folder of the mmpreproj adapter "
                f"({Path(save_directory) / PREPROJ_SUBDIR}); rename it (allowed: any other name); nothing was written"
            )
        peft_kwargs = dict(
            safe_serialization=safe_serialization,
            selected_adapters=selected_adapters,
            save_embedding_layers=save_embedding_layers,
            is_main_process=is_main_process,
            path_initial_model_for_weight_conversion=path_initial_model_for_weight_conversion,
        )
        if not injected_owners(self):  # ours taken off (`mmpreproj.unload(model)`): a LoRA model, saved as peft does
            return super().save_pretrained(save_directory, **peft_kwargs, **kwargs)
        owner, state = injected_owner(self, "save_pretrained")
        given = kwargs.get("state_dict")
        ours = None
        if given is None:
            _refuse_sharded_lora(self, save_directory)
            ours = adapter_state_dict(owner)  # a collective on FSDP2 shards: every rank is here
        elif is_main_process:
            ours = adapter_tensors_from_state_dict(
                owner, active_name(owner), given, owner_prefix(self, owner), gather=False
            )
        if ours is not None:  # what save_adapter refuses, refused before peft writes the LoRA
            refuse_non_finite(ours, f"save_pretrained: refusing to write {save_directory}")
            try:
                refuse_empty(ours, "the weights to save")
            except ValueError as e:
                raise ValueError(
                    f"save_pretrained: refusing to write {save_directory}: {e}; nothing was written"
                ) from None
        if given is not None:  # LoRA's keys as on the model LoRA was built on (`wrappers_aside`)
            kwargs["state_dict"] = lora_view(given, state.modules, owner_prefix(self, owner))
        with wrappers_aside(self):  # peft sees the LoRA model it built: LoRA's keys only, no segment of ours
            super().save_pretrained(save_directory, **peft_kwargs, **kwargs)
        if is_main_process:
            save_adapter(owner, Path(save_directory) / PREPROJ_SUBDIR, state_dict=ours)

    def load_adapter(
        self, model_id: str | os.PathLike, adapter_name: str, is_trainable: bool = False, *args: Any, **kwargs: Any
    ) -> Any:
        """peft's `load_adapter` of the LoRA in `model_id`, with our weights from `model_id/preproj` when there
        (checked before either part loads); `is_trainable=True` leaves ours trainable too.

        Our folder itself (a Trainer's resume loads each subfolder as an adapter of its name, "preproj") is
        copied into the injection's active adapter. A folder holding ours is read only into a loaded LoRA name
        (peft's resume and best-model reload): a new name would replace the weights of the one injection."""
        folder = Path(model_id)
        if _holds_ours(folder):
            if adapter_name != PREPROJ_SUBDIR:
                raise ValueError(
                    f"load_adapter({str(folder)!r}, {adapter_name!r}): a PREPROJ adapter loads into this model's "
                    f"injection under the name {PREPROJ_SUBDIR!r} (allowed: [{PREPROJ_SUBDIR!r}]); to add it as a "
                    "second PREPROJ adapter call mmpreproj.load_adapter(model, DIR, adapter_name=...); nothing was "
                    "loaded"
                )
            copy_adapter_weights(_checked_ours(self, folder))
            return IncompatibleKeys([], [])  # what peft's load_adapter returns: nothing missing
        below = ours_below(folder)
        copies = None
        if below is not None:
            if adapter_name not in self.peft_config:
                raise ValueError(
                    f"load_adapter({str(folder)!r}, {adapter_name!r}): the folder holds an mmpreproj adapter too "
                    f"({below}), whose weights would replace this model's; load it into a loaded LoRA name "
                    f"(allowed: {sorted(self.peft_config)}) or onto a fresh base with mmpreproj.load_adapter(base, "
                    "DIR); nothing was loaded"
                )
            copies = _checked_ours(self, below)
        elif adapter_name in self.peft_config and (old := _ours_in_old_lora_file(folder)):
            what = f"load_adapter: the mmpreproj weights in {folder / ADAPTER_WEIGHTS_NAME}"
            copies = checked_adapter_copies(self, old, None, what)  # mmpreproj <= 0.5's checkpoint, no preproj/
        kwargs.setdefault("key_mapping", OLD_STACKED_LORA_KEYS)  # an older file's LoRA keys, read as today's
        with wrappers_aside(self):
            result = super().load_adapter(model_id, adapter_name, is_trainable, *args, **kwargs)
        if copies is not None:
            copy_adapter_weights(copies)
            if is_trainable:
                set_adapter_trainable(injected_owner(self, "load_adapter")[0], True)
        return result

    @contextlib.contextmanager
    def _enable_peft_forward_hooks(self, *args: Any, **kwargs: Any) -> Iterator[None]:
        """peft's mixed batch (`adapter_names=[...]`: LoRA's layers get the names), and ours the same rows: a
        `"__base__"` row runs neither, every other row the one PREPROJ adapter, which this model's LoRA adapters
        share (it trains with whichever is active)."""
        names = kwargs.get("adapter_names")
        with super()._enable_peft_forward_hooks(*args, **kwargs):
            handles = []
            if names is not None and injected_owners(self):  # ours may be off already (`mmpreproj.unload(model)`)
                owner, state = injected_owner(self, "forward(adapter_names=...)")
                ours = active_name(owner)
                rows = [BASE_ADAPTER if n == BASE_ADAPTER else ours for n in names]
                _, handles = hand_mixed_names(owner, injected_modules(owner), rows, state.peft_config, kwargs)
            try:
                yield
            finally:
                for handle in handles:
                    handle.remove()

    def set_adapter(self, adapter_name: str, inference_mode: bool = False) -> None:
        """peft's switch of the active LoRA adapter. Ours, the model's one PREPROJ adapter (named as the LoRA
        adapter it was built with), keeps running under every LoRA adapter but trains only while that name is
        active (and not `inference_mode`), as peft trains the active adapter alone."""
        super().set_adapter(adapter_name, inference_mode=inference_mode)
        if injected_owners(self):  # ours may be off already (`mmpreproj.unload(model)`)
            owner, _ = injected_owner(self, "set_adapter")
            set_adapter_trainable(owner, adapter_name == active_name(owner) and not inference_mode)

    def add_adapter(self, adapter_name: str, peft_config: peft.PeftConfig, *args: Any, **kwargs: Any) -> None:
        """peft's `add_adapter` of a further LoRA, into the attention modules ours wraps (`wrappers_aside`)."""
        with wrappers_aside(self):
            super().add_adapter(adapter_name, peft_config, *args, **kwargs)

    def unload(self, *args: Any, **kwargs: Any) -> nn.Module:
        """The base as it was: ours off first (our layer holds LoRA's, and peft's unload visits nothing inside a
        tuner layer), then peft's LoRA unload."""
        if injected_owners(self):  # ours may be off already (`mmpreproj.unload(model)`)
            unload_ours(self)
        return self.base_model.unload(*args, **kwargs)

    def merge_and_unload(self, *args: Any, **kwargs: Any) -> nn.Module:
        """peft's LoRA merged into the projections; ours stays around each attention (nonlinear: nothing to merge),
        so the model returned is the injected base with the same outputs."""
        with wrappers_aside(self):  # out of the way of peft's visit (each keeps its base layer, merged in place)
            return self.base_model.merge_and_unload(*args, **kwargs)


def _refuse_sharded_lora(model: nn.Module, save_directory: str | os.PathLike) -> None:
    """Without `state_dict=`, peft's own save writes the LoRA from the live weights, which it cannot do from FSDP2
    shards (it fails on their storage, for a LoRA model alone too): refused first, naming the way."""
    if any(hasattr(p, "full_tensor") for n, p in model.named_parameters() if ".lora_" in n):
        raise ValueError(
            f"save_pretrained: refusing to write {save_directory}: the LoRA weights are FSDP2 shards, which peft's "
            "save cannot write; pass the full state dict gathered on every rank as state_dict= "
            "(torch.distributed.checkpoint.state_dict.get_model_state_dict(model, options=StateDictOptions("
            "full_state_dict=True, cpu_offload=True))); nothing was written"
        )


def lora_view(state_dict: dict[str, torch.Tensor], paths: list[str], prefix: str) -> dict[str, torch.Tensor]:
    """A stacked model's state dict as the LoRA model without ours keys it: `{path}.base_layer.` of each of our
    wrappers is `{path}.`, and our own weights are left out."""
    heads = sorted((f"{prefix}{p}." for p in paths), key=len, reverse=True)
    out = {}
    for key, value in state_dict.items():
        head = next((h for h in heads if key.startswith(h)), None)
        if head is None:
            out[key] = value
        elif key.startswith(f"{head}base_layer."):
            out[f"{head}{key[len(head) + len('base_layer.') :]}"] = value
    return out


def _ours_in_old_lora_file(folder: Path) -> dict[str, torch.Tensor]:
    """Our weights as mmpreproj <= 0.5 also wrote them into `preproj_lora`'s LoRA file (keyed as our file keys them,
    older slot names included: `checked_adapter_copies` reads those); {} for today's files or an unreadable one
    (peft's own load then says what is wrong with it)."""
    try:
        tensors = load_file(str(folder / ADAPTER_WEIGHTS_NAME))
    except Exception:  # noqa: BLE001 - peft's load reports it
        return {}
    return {k.removeprefix(PEFT_PREFIX): v for k, v in tensors.items() if "lora_" not in k and is_slot_key(k)}


def _holds_ours(folder: Path) -> bool:
    """Whether `folder` holds an adapter config that is ours (not another peft method's)."""
    return config_kind(folder / ADAPTER_CONFIG_NAME) == "ours"


def ours_below(folder: Path) -> Path | None:
    """`folder/preproj` when it holds our adapter, None when there is no such folder (LoRA alone, or our weights in
    an mmpreproj <= 0.5 LoRA file); refused when it is there without our config (deleted, or another method's), so
    the LoRA beside it never loads alone."""
    below = folder / PREPROJ_SUBDIR
    if not below.exists():
        return None
    if _holds_ours(below):
        return below
    cfg = below / ADAPTER_CONFIG_NAME
    what = "is missing" if not cfg.is_file() else "is not an mmpreproj adapter config"
    raise FileNotFoundError(
        f"adapter file missing: {cfg} {what}, though {folder} holds a {PREPROJ_SUBDIR}/ folder, where a preproj_lora "
        "save keeps the mmpreproj adapter beside the LoRA; restore it from the same save (nothing was loaded)"
    )


def _checked_ours(model: nn.Module, folder: Path) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Our weights in `folder`, read and checked against the injection in `model` (nothing copied yet)."""
    _, tensors = read_adapter(folder)
    return checked_adapter_copies(model, tensors, None, f"load_adapter: the mmpreproj adapter at {folder}")


class PreProjLoraModel(_Stacked, peft.PeftModel):
    """peft's `PeftModel` (no task type) with our adapter beside its LoRA."""


class PreProjLoraModelForCausalLM(_Stacked, peft.PeftModelForCausalLM):
    """peft's `PeftModelForCausalLM` with our adapter beside its LoRA."""


class PreProjLoraModelForSeq2SeqLM(_Stacked, peft.PeftModelForSeq2SeqLM):
    """peft's `PeftModelForSeq2SeqLM` with our adapter beside its LoRA."""


class PreProjLoraModelForSequenceClassification(_Stacked, peft.PeftModelForSequenceClassification):
    """peft's `PeftModelForSequenceClassification` with our adapter beside its LoRA."""


class PreProjLoraModelForTokenClassification(_Stacked, peft.PeftModelForTokenClassification):
    """peft's `PeftModelForTokenClassification` with our adapter beside its LoRA."""


class PreProjLoraModelForQuestionAnswering(_Stacked, peft.PeftModelForQuestionAnswering):
    """peft's `PeftModelForQuestionAnswering` with our adapter beside its LoRA."""


class PreProjLoraModelForFeatureExtraction(_Stacked, peft.PeftModelForFeatureExtraction):
    """peft's `PeftModelForFeatureExtraction` with our adapter beside its LoRA."""


_BY_PEFT_CLASS: dict[type[peft.PeftModel], type[peft.PeftModel]] = {
    peft.PeftModel: PreProjLoraModel,
    peft.PeftModelForCausalLM: PreProjLoraModelForCausalLM,
    peft.PeftModelForSeq2SeqLM: PreProjLoraModelForSeq2SeqLM,
    peft.PeftModelForSequenceClassification: PreProjLoraModelForSequenceClassification,
    peft.PeftModelForTokenClassification: PreProjLoraModelForTokenClassification,
    peft.PeftModelForQuestionAnswering: PreProjLoraModelForQuestionAnswering,
    peft.PeftModelForFeatureExtraction: PreProjLoraModelForFeatureExtraction,
}


def stacked_class(task_type: str | None) -> type[peft.PeftModel]:
    """The stacked class of peft's class for `task_type` (peft's `PeftModel` for None or a type peft maps to none)."""
    return _BY_PEFT_CLASS[MODEL_TYPE_TO_PEFT_MODEL_MAPPING.get(task_type, peft.PeftModel)]


def stacked_peft_model(
    model: nn.Module, config: peft.PeftConfig, ours: PreProjConfig, adapter_name: str = "default"
) -> peft.PeftModel:
    """peft's LoRA (`config`) on `model`, as `peft.get_peft_model` builds it, in the stacked class; then our adapter
    (`ours`) around the attention modules that now hold LoRA's layers. LoRA goes in first: peft skips every module
    inside a tuner layer, and our wrapper is one (ARCHITECTURE.md). Every weight there before keeps its
    `requires_grad` (LoRA's train, the base stays frozen); on any error the model is put back as it was."""
    config.base_model_name_or_path = model.__dict__.get("name_or_path") or None  # as get_peft_model records it
    flags = [(p, p.requires_grad) for p in model.parameters()]
    stacked = stacked_class(config.task_type)(model, config, adapter_name)
    with lora_off_on_error(stacked, flags):
        inject(stacked.base_model.model, ours)  # the base freeze leaves LoRA's weights as peft set them
    return stacked


@contextlib.contextmanager
def lora_off_on_error(lora: peft.PeftModel, flags: list[tuple[nn.Parameter, bool]]) -> Iterator[None]:
    """On any error inside: peft's layers taken off `lora`'s model and every `requires_grad` put back as `flags`
    recorded it before they went in (ours, when the error came from ours, was rolled back by its own loader)."""
    try:
        yield
    except BaseException:
        lora.base_model.unload()
        for p, flag in flags:
            p.requires_grad_(flag)
        raise
