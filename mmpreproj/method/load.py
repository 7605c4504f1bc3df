"""One loader for a trained folder: `load_adapter(model, path)` returns the model to use, whatever wrote it.

    model = mmpreproj.load_adapter(base, "runs/a")                      # frozen, for inference (as peft)
    model = mmpreproj.load_adapter(base, "runs/a", is_trainable=True)   # to go on training

What a folder holds is read from its files in one place (`detect`), never from who wrote it:

| kind         | ours (PREPROJ)  | peft LoRA | written by                                                             |
|--------------|-----------------|-----------|------------------------------------------------------------------------|
| adapter      | `DIR`           | -         | save_adapter, PeftModel.save_pretrained, a Trainer checkpoint, train() |
| lora         | -               | `DIR`     | peft / train() `lora`, `lora_matched`                                  |
| preproj_lora | `DIR/preproj/`  | `DIR`     | its `save_pretrained` (`stacked.py`): train(), a Trainer, users        |

Older layouts (ours at `DIR`, peft's LoRA in `DIR/lora/`: train() before 0.5) are found by `convert.py`.

`DIR` is the folder given or its `adapter/` subfolder (a train() run folder, a `save_pretrained` folder: its
base and adapter must come from one save, `pretrained_save.check_saved_pair`). A run folder's `train_config.json`,
when there, must name a method the folder holds. Returns a `PeftModel` when the folder holds LoRA weights.
A refused load (missing, corrupt or mismatched files) leaves the model as it was.

Our part goes through `load_injection`: read the folder, check it against the model, inject its modules and copy
its weights; on a model already injected, add it beside the loaded ones (`adapters.plan_addition`, through peft's
loop).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import peft
import torch
from peft.auto import MODEL_TYPE_TO_PEFT_MODEL_MAPPING
from peft.mapping import PEFT_TYPE_TO_PREFIX_MAPPING
from safetensors.torch import load_file
from torch import nn

from ..timm_rope.saved import rope_for_load
from ..util.validate import check_flags
from .adapters import plan_addition
from .config import PreProjConfig
from .convert import OLD_SLOTS, OLD_STACKED_LORA_KEYS, lora_below_ours, today_lora_key
from .files import (
    ADAPTER_CONFIG_NAME,
    ADAPTER_WEIGHTS_NAME,
    BASE_SAVE_TOKEN,
    PRETRAINED_ADAPTER_DIR,
    adapter_folder,
    as_description,
    config_kind,
    read_adapter,
)
from .inject import add_planned, apply_plan
from .load_check import check_added_record, check_record, planned_tensors
from .plan import check_saved_paths, plan_injection, saved_host
from .pretrained_save import check_saved_pair, config_save_token
from .stacked import PREPROJ_SUBDIR, lora_off_on_error, ours_below, stacked_class
from .state import check_adapter_name, injected_modules, injected_owner, is_injected, refuse_meta_parameters
from .state_dict import (
    SLOTS,
    check_tensors_match,
    copy_adapter_weights,
    is_slot_key,
    set_adapter_trainable,
)


def load_injection(
    model: nn.Module,
    path: str | Path,
    *,
    is_trainable: bool = False,
    freeze_base: bool | None = None,
    adapter_name: str | None = None,
) -> nn.Module:
    """Inject the modules described in `path` into `model` and load their weights.

    Like peft, loading is for inference by default: the adapter's weights are frozen; `is_trainable=True`
    leaves them (and its `modules_to_save`) trainable, to go on training.

    `path` is an adapter folder, or a `save_pretrained` folder (its `adapter/` subfolder is read, refused
    when the base beside it comes from another save: `pretrained_save.check_saved_pair`). The
    adapter file carries the host description (parts, paths, call convention), so a user-described host
    reloads with no code. Raises (leaving `model` untouched) on a missing or corrupt file, another host,
    parts the model does not have, another hidden size or block count, or weights that do not match.

    On a model that is already injected, `adapter_name` adds this adapter beside the loaded ones, inactive
    (`set_adapter` switches to it; see `adapters.py`) and frozen unless `is_trainable=True` (then its weights wait
    trainable, as peft's `load_adapter(..., is_trainable=True)` leaves them); on a plain model it names the first
    adapter (default "default").
    Saved `add_rope` positions are restored on a model without them, or the load is refused with the call
    to make (`mmpreproj.timm_rope.saved`).
    """
    refuse_meta_parameters(model, "load_adapter")
    if adapter_name is not None:
        check_adapter_name(adapter_name)
    given, path = Path(path), adapter_folder(path)
    desc, tensors = read_adapter(path)
    check_saved_paths(desc, path)
    if path != given:  # a save_pretrained folder: its base and its adapter must come from one save
        check_saved_pair(config_save_token(given / "config.json"), desc.get(BASE_SAVE_TOKEN), given)
    config = PreProjConfig.from_dict(desc["config"])
    if adapter_name is not None and is_injected(model):  # checked as the first adapter is (by block index)
        check_added_record(model, config, desc, f"adapter at {path}", by_path=False)
        owner, _ = injected_owner(model, "load_adapter")
        add_planned(model, plan_addition(owner, config, adapter_name, str(path), tensors=tensors))
        if is_trainable:  # peft's rule: it waits trainable (inactive until set_adapter)
            for w in injected_modules(owner):
                w.set_requires_grad([adapter_name], requires_grad=True)
        return model
    if freeze_base is not None:
        config.freeze_base = freeze_base
    host = saved_host(model, desc, path)
    restore_rope = rope_for_load(model, desc.get("rope"), f"adapter at {path}")  # checks only; runs after apply_plan
    with torch.random.fork_rng(devices=[]):  # building the modules must not move the caller's RNG
        plan = plan_injection(model, config, host, adapter_name=adapter_name or "default")
    check_record(model, plan, desc, f"adapter at {path}", by_path=False)  # the same sites; no weight moves blocks
    expected, tensors = planned_tensors(model, plan, tensors, desc, by_path=False)  # found by block index
    check_tensors_match(expected, tensors, f"adapter at {path} does not match its config")
    copy_adapter_weights([(dst, tensors[k]) for k, dst in expected.items() if is_slot_key(k)])
    apply_plan(model, plan)
    if restore_rope is not None:
        restore_rope()
    # base modules trained with the adapter: written once the originals are kept
    copy_adapter_weights([(dst, tensors[k]) for k, dst in expected.items() if not is_slot_key(k)])
    if not is_trainable:
        set_adapter_trainable(model, False)
    return model


RUN_CONFIG_NAME = "train_config.json"  # a train() run folder's config (its `method`)
_LORA_METHODS = ("lora", "lora_matched")  # train() methods whose folder holds LoRA alone
_OUR_METHODS = ("preproj", "skip", "preproj_skip")  # the `method` tags of our adapter (PreProjConfig.method)


@dataclass(frozen=True)
class Folder:
    """What a trained folder holds: our adapter's folder, peft's LoRA folder (either may be None), and the
    folder to hand our loader (the `save_pretrained` folder itself, so its pair is checked)."""

    ours: Path | None
    lora: Path | None
    load_ours_from: Path | None

    @property
    def methods(self) -> tuple[str, ...]:
        """The train() methods a run folder of this kind may name (ours-only: read from our config)."""
        if self.ours is not None and self.lora is not None:
            return ("preproj_lora",)
        if self.lora is not None:
            return _LORA_METHODS
        method = _our_method(self.ours) if self.ours is not None else None
        return (method,) if method is not None else ()


def detect(path: str | Path) -> Folder:
    """The kind of trained folder `path` is (the table in the module docstring); FileNotFoundError naming the
    folder and what it may hold when it holds no adapter."""
    given = Path(path)
    top = given
    if (
        not (given / ADAPTER_CONFIG_NAME).is_file()
        and (given / PRETRAINED_ADAPTER_DIR / ADAPTER_CONFIG_NAME).is_file()
    ):
        top = given / PRETRAINED_ADAPTER_DIR
    if not (top / ADAPTER_CONFIG_NAME).is_file():
        raise FileNotFoundError(
            f"adapter file missing: {given / ADAPTER_CONFIG_NAME} (nor in its {PRETRAINED_ADAPTER_DIR}/); pass an "
            "adapter folder, a save_pretrained or train() run folder, or a Trainer checkpoint"
        )
    if config_kind(top / ADAPTER_CONFIG_NAME) == "other":  # an unreadable one: our loader names why
        below = ours_below(top)
        return Folder(below, top, below) if below is not None else Folder(None, top, None)
    lora = lora_below_ours(top)
    return Folder(top, lora if (lora / ADAPTER_CONFIG_NAME).is_file() else None, given)


def load_adapter(
    model: nn.Module,
    path: str | Path,
    *,
    is_trainable: bool = False,
    adapter_name: str | None = None,
    freeze_base: bool | None = None,
) -> nn.Module:
    """Put the trained weights in `path` (any folder `detect` knows) onto `model`; returns the model to use.

    Frozen for inference unless `is_trainable=True` (then our weights, their `modules_to_save` and the LoRA
    weights train). `adapter_name` names the adapter (on an injected model, ours is added beside the loaded
    ones, `method/adapters.py`). `freeze_base` overrides the saved config's. On any refusal `model` is unchanged.
    """
    check_flags("load_adapter", is_trainable=is_trainable, freeze_base=freeze_base)
    folder = detect(path)
    holds = folder.methods  # refuses a `method` tag that is not ours
    _check_run_method(Path(path), holds)
    if folder.lora is not None and (is_injected(model) or isinstance(model, peft.PeftModel)):
        raise ValueError(
            f"load_adapter: {path} holds peft LoRA weights ({folder.lora}), which load onto a base without "
            "adapters; pass the base model (nothing was loaded)"
        )
    if folder.lora is None:
        return load_injection(
            model, folder.load_ours_from, is_trainable=is_trainable, adapter_name=adapter_name, freeze_base=freeze_base
        )
    flags = [(p, p.requires_grad) for p in model.parameters()]
    lora = _load_lora(model, folder.lora, is_trainable, adapter_name or "default", folder.ours is not None)
    if folder.ours is None:
        return lora
    with lora_off_on_error(lora, flags):  # ours around the attention modules that hold LoRA's layers (stacked.py)
        load_injection(
            lora.base_model.model,
            folder.load_ours_from,
            is_trainable=is_trainable,
            adapter_name=adapter_name,
            freeze_base=freeze_base,
        )
    if is_trainable:  # peft froze every non-LoRA weight, ours included
        set_adapter_trainable(model, True)
    return lora


def _load_lora(model: nn.Module, folder: Path, is_trainable: bool, name: str, stacked: bool) -> peft.PeftModel:
    """peft's LoRA (or other method) in `folder` on `model`, as `peft.PeftModel.from_pretrained` does it (in the class
    that saves ours beside it when `stacked`, `stacked.py`), but refused before the weights load unless every weight
    peft expects is in the file and every weight in the file is one it expects; on any failure peft's layers are
    taken off and `requires_grad` put back. A `preproj_lora` file of mmpreproj 0.4/0.5 (LoRA's keys inside our
    wrapper, ours among them) is read as today's (`convert.OLD_STACKED_LORA_KEYS`)."""
    try:
        saved = {today_lora_key(k) for k in load_file(str(folder / ADAPTER_WEIGHTS_NAME))}
    except FileNotFoundError:
        raise FileNotFoundError(f"adapter file missing: {folder / ADAPTER_WEIGHTS_NAME}") from None
    except Exception as e:
        raise ValueError(f"corrupt adapter weights {folder / ADAPTER_WEIGHTS_NAME}: {e}") from None
    try:
        config = peft.PeftConfig.from_pretrained(str(folder))
    except (KeyError, TypeError, ValueError) as e:  # peft's reader: a peft_type it does not know, another form
        raise ValueError(
            f"adapter config {folder / ADAPTER_CONFIG_NAME}: neither an mmpreproj adapter (peft_type 'PREPROJ') nor "
            f"one peft reads ({type(e).__name__}: {str(e)[:80]}); check its peft_type; nothing was loaded"
        ) from None
    config.inference_mode = not is_trainable
    flags = [(p, p.requires_grad) for p in model.parameters()]
    cls = stacked_class(config.task_type) if stacked else MODEL_TYPE_TO_PEFT_MODEL_MAPPING.get(config.task_type)
    lora = (cls or peft.PeftModel)(model, config, name)
    with lora_off_on_error(lora, flags):
        expected = set(peft.get_peft_model_state_dict(lora, adapter_name=name))  # its tuner layers
        prefix = PEFT_TYPE_TO_PREFIX_MAPPING[config.peft_type]
        # ours as an older LoRA file holds them (mmpreproj <= 0.5: `...preproj.up.weight`, `...skip.proj.weight`): read
        # from our own folder next, so not compared here (legacy.OLD_SLOTS)
        old_ours = {k for k in saved - expected if _is_ours(k)} if stacked else set()
        missing = sorted(k for k in expected - saved if prefix in k)[:3]
        unexpected = sorted(saved - expected - old_ours)[:3]
        if missing or unexpected:  # `missing` counts LoRA's own: older files hold LoRA alone, ours in preproj/
            ours = any(f".{slot}." in k for k in saved - expected for slot in (*SLOTS, "base_layer"))
            hint = (
                (
                    f"; it was saved from a model with mmpreproj modules injected (a plain PeftModel writes LoRA's "
                    f"weights from inside our wrapper but not our adapter): save that adapter beside it, "
                    f"mmpreproj.save_adapter(model, DIR / {PREPROJ_SUBDIR!r}), or build the stack with "
                    "mmpreproj.train.apply_method(model, 'preproj_lora'), whose save_pretrained writes both"
                )
                if ours
                else ""
            )
            raise ValueError(
                f"peft adapter at {folder} does not match its config: missing {missing}, unexpected "
                f"{unexpected}{hint} (nothing was loaded)"
            )
        # peft's own load (no injection of ours yet: the stacked class's `load_adapter` is for a stacked model)
        keys = OLD_STACKED_LORA_KEYS
        peft.PeftModel.load_adapter(lora, str(folder), name, is_trainable=is_trainable, key_mapping=keys)
    return lora


def _is_ours(key: str) -> bool:
    """Whether a key of a LoRA file is one of our injected weights (a slot's segment, today's or an older name)."""
    return "lora_" not in key and any(f".{slot}." in key for slot in (*SLOTS, *OLD_SLOTS))


def _our_method(folder: Path) -> str | None:
    """The `method` tag of our adapter in `folder` (files written before the tag: from the config's flags);
    None when the config cannot be read (our loader then names what is wrong with it). ValueError for a tag
    that is not one of ours."""
    cfg_file = folder / ADAPTER_CONFIG_NAME
    try:
        desc = as_description(json.loads(cfg_file.read_text(encoding="utf-8")), f"adapter config {cfg_file}")
        cfg = desc["config"]
        flags = (cfg.get("preproj") is True, cfg.get("skip") is True)
        method = desc.get("method")
    except (OSError, ValueError, RecursionError, KeyError, TypeError, AttributeError):
        return None
    if method is None:  # an adapter saved before the tag
        return {(True, True): "preproj_skip", (True, False): "preproj", (False, True): "skip"}.get(flags)
    if method not in _OUR_METHODS:
        raise ValueError(
            f"corrupt adapter config {cfg_file}: method={method!r} is not an mmpreproj adapter method "
            f"(allowed: {list(_OUR_METHODS)}); nothing was loaded"
        )
    return method


def _check_run_method(given: Path, holds: tuple[str, ...]) -> None:
    """A run folder's `train_config.json` must name a method the folder holds (refused before any load)."""
    cfg_file = given / RUN_CONFIG_NAME
    if not cfg_file.is_file():
        return
    try:
        run = json.loads(cfg_file.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        raise ValueError(f"{cfg_file} is not valid JSON ({e})") from None
    method = run.get("method") if isinstance(run, dict) else None
    if method is None or not holds:  # an unreadable adapter config: our loader names what is wrong with it
        return
    if method not in holds:
        raise ValueError(
            f"{cfg_file} names method {method!r}, but the adapter in {given} holds "
            f"{' / '.join(holds)!r} weights (allowed: {list(holds)}); nothing was loaded"
        )
