"""transformers `Trainer` with an injected model: checkpoints hold the adapter, and resume restores it.

    from mmpreproj.integrations.transformers import PreProjTrainer     # instead of transformers.Trainer
    model = mmpreproj.inject(AutoModelForCausalLM.from_pretrained(...))   # the injection line
    PreProjTrainer(model=model, args=TrainingArguments(...), ...).train(resume_from_checkpoint=True)

Why a subclass and not only a callback: `Trainer._save` writes a model through `model.save_pretrained`,
and `Trainer._load_from_checkpoint` resumes only from full weights (`model.safetensors` or an index) or a
peft `PeftModel` (an `isinstance` check). A folder holding only our adapter is accepted by its first
check (`adapter_model.safetensors` is there) and then refused ("Can't find a checkpoint index"), and a
callback runs after both, too late. So `PreProjTrainer` overrides exactly three methods; everything else,
optimizer, scheduler, RNG and data-order state included, is the Trainer's own:

- `_save`: writes `save_checkpoint(model, dir)` (our `adapter_config.json` + `adapter_model.safetensors`,
  no base weights), the tokenizer and `training_args.bin`, as `Trainer._save` does.
- `_load_from_checkpoint` / `_load_best_model`: `load_checkpoint(model, dir)` copies the weights into the
  model in place (`mmpreproj.set_adapter_state_dict`), so the optimizer's references stay valid.

A peft model that is not injected goes to the Trainer's own methods unchanged; a model with neither an
injection nor a peft adapter is refused at construction (it would fine-tune the whole base). With a peft model on top of an
injected one (the `preproj_lora` shape), peft's files stay at the top of the folder, where Trainer and
`PeftModel.from_pretrained` look, and ours go to `dir/preproj/` (`adapter_dir`). `preproj_trainer(cls)`
builds the same subclass of any Trainer subclass (TRL's: `mmpreproj.integrations.trl`).

Not covered: FSDP or DeepSpeed under the Trainer (their `save_model` gathers a state dict collectively;
use our own trainer's `parallel="fsdp"`), and several named peft adapters in one checkpoint.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import torch
from peft import PeftModel
from torch import nn
from transformers import Trainer
from transformers.trainer import TRAINING_ARGS_NAME

from ..tuner.files import ADAPTER_CONFIG_NAME, ADAPTER_WEIGHTS_NAME, read_adapter, save_adapter
from ..tuner.keys import is_other_peft_method
from ..tuner.loading import load_adapter as _inject_from
from ..tuner.plan import peft_layers as _peft_layers
from ..tuner.state import injected_modules, is_injected
from ..tuner.state_dict import adapter_state_dict, set_adapter_state_dict
from ..util.io import set_new_file_modes

__all__ = [
    "PREPROJ_SUBDIR",
    "PreProjTrainer",
    "PreProjTrainerMixin",
    "adapter_dir",
    "has_checkpoint",
    "load_checkpoint",
    "load_trained",
    "preproj_trainer",
    "save_checkpoint",
]

from ..train.adapters import (
    PREPROJ_SUBDIR,  # where our adapter goes when a peft adapter holds the top of the folder
)


def _is_peft(model: nn.Module) -> bool:
    peft = sys.modules.get("peft")  # a PeftModel exists only if peft was imported
    return peft is not None and isinstance(model, (peft.PeftModel, peft.PeftMixedModel))


def adapter_dir(model: nn.Module, folder: str | Path) -> Path:
    """Where `save_checkpoint` puts our adapter: `folder`, or `folder/preproj` under a peft model."""
    return Path(folder) / PREPROJ_SUBDIR if _is_peft(model) else Path(folder)


def has_checkpoint(model: nn.Module, folder: str | Path) -> bool:
    """Whether `folder` holds this model's adapter files where `save_checkpoint` writes them."""
    where = adapter_dir(model, folder)
    return (where / ADAPTER_CONFIG_NAME).is_file() and (where / ADAPTER_WEIGHTS_NAME).is_file()


def save_checkpoint(model: nn.Module, folder: str | Path) -> Path:
    """Write what training changed, no base weights: our adapter and, for a peft model, peft's adapter.

    `model` may be wrapped (DDP, `torch.compile`); call it on the writing rank only. Returns `folder`.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    if _is_peft(model):
        model.save_pretrained(str(folder))  # PeftModel: adapter_config.json + adapter_model.safetensors
        set_new_file_modes(folder, (ADAPTER_WEIGHTS_NAME,))  # peft's safetensors are 0600 whatever the umask
    save_adapter(model, adapter_dir(model, folder))
    return folder


def load_checkpoint(model: nn.Module, folder: str | Path) -> nn.Module:
    """Copy the weights `save_checkpoint` wrote into the already injected `model`, in place.

    Our part is checked in full (keys, shapes, finite values) before the first copy. For a peft model the
    active adapter is reloaded first, trainable, as `Trainer` resumes a `PeftModel`.
    """
    folder = Path(folder)
    if not has_checkpoint(model, folder):
        missing = [n for n in (ADAPTER_CONFIG_NAME, ADAPTER_WEIGHTS_NAME) if not (adapter_dir(model, folder) / n).is_file()]
        raise FileNotFoundError(
            f"cannot resume from checkpoint {folder}: no mmpreproj adapter at {adapter_dir(model, folder)} "
            f"(missing {', '.join(missing)})"
        )
    try:
        _, tensors = read_adapter(adapter_dir(model, folder))
        if _is_peft(model):
            have = {k: tuple(v.shape) for k, v in adapter_state_dict(model).items()}
            if have != {k: tuple(v.shape) for k, v in tensors.items()}:  # refuse before peft's part is loaded
                set_adapter_state_dict(model, tensors)  # raises, naming the keys or the shape
            model.load_adapter(str(folder), model.active_adapters[0], is_trainable=True)
        return set_adapter_state_dict(model, tensors)
    except (ValueError, FileNotFoundError) as err:  # damaged files: said with the checkpoint, nothing was copied
        kind = FileNotFoundError if isinstance(err, FileNotFoundError) else ValueError
        raise kind(f"cannot resume from checkpoint {folder}: {err}") from None


def _holds_our_files(model: nn.Module, folder: str | Path) -> bool:
    """Whether `folder` holds either of our adapter files where `save_checkpoint` writes them (a damaged
    checkpoint missing one of them is then ours to name, not the Trainer's to call "not a checkpoint")."""
    where = adapter_dir(model, folder)
    return any((where / n).is_file() for n in (ADAPTER_CONFIG_NAME, ADAPTER_WEIGHTS_NAME))


def load_trained(model: nn.Module, folder: str | Path, *, is_trainable: bool = False) -> nn.Module:
    """Rebuild a trained model from a fresh base and a folder `save_checkpoint` (or a Trainer) wrote.

    Injects our adapter (`mmpreproj.load_adapter`, from `folder/preproj` when there is a peft adapter at
    the top), then wraps the result with `peft.PeftModel.from_pretrained` if peft's files are there.
    Returns the model to use (a `PeftModel` in the second case).
    """
    folder = Path(folder)
    if not _holds_peft_adapter(folder):
        return _inject_from(model, folder)
    _inject_from(model, folder / PREPROJ_SUBDIR)
    peft_model = PeftModel.from_pretrained(model, str(folder), is_trainable=is_trainable)
    if is_trainable:  # peft froze every non-LoRA weight, ours included
        for p in _injected_params(peft_model):
            p.requires_grad_(True)
    return peft_model


def _holds_peft_adapter(folder: Path) -> bool:
    """Whether `folder/adapter_config.json` is another peft method's (LoRA: a `peft_type` other than PREPROJ)."""
    try:
        desc = json.loads((folder / ADAPTER_CONFIG_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):  # read_adapter then names what is wrong with the file
        return False
    return isinstance(desc, dict) and is_other_peft_method(desc)


def _injected_params(model: nn.Module) -> list[nn.Parameter]:
    return [
        p
        for w in injected_modules(model)
        for m in (w.preproj, w.skip)
        if m is not None
        for p in m.parameters()
    ]


class PreProjTrainerMixin:
    """Put before a `transformers.Trainer` subclass: injected models checkpoint and resume as adapters.

    A model with neither an injection nor a peft adapter is refused at construction (the Trainer would
    otherwise fine-tune every base weight under a name that promises a frozen probe); a peft model without
    an injection trains as the Trainer trains it.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        given = kwargs.get("model", args[0] if args else None)
        if isinstance(given, nn.Module):
            _refuse_full_fine_tune(given, type(self).__name__)  # before the Trainer prepares anything
        super().__init__(*args, **kwargs)
        if not isinstance(given, nn.Module):  # a hub id or folder TRL loaded itself
            _refuse_full_fine_tune(self.model, type(self).__name__)

    def _save(self, output_dir: str | None = None, state_dict: dict | None = None) -> None:
        if not is_injected(self.model):
            return super()._save(output_dir, state_dict)  # type: ignore[misc]
        output_dir = output_dir if output_dir is not None else self.args.output_dir
        if not self.args.should_save:
            return
        # `state_dict` (what FSDP/DeepSpeed gather) is not used: see the module docstring
        save_checkpoint(self.model, output_dir)
        tokenizer = self.processing_class or getattr(self.data_collator, "tokenizer", None)
        if tokenizer is not None:
            tokenizer.save_pretrained(output_dir)
        torch.save(self.args, os.path.join(output_dir, TRAINING_ARGS_NAME))

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model: nn.Module | None = None) -> None:
        model = self.model if model is None else model
        if is_injected(model) and _holds_our_files(model, resume_from_checkpoint):
            load_checkpoint(model, resume_from_checkpoint)
            return
        super()._load_from_checkpoint(resume_from_checkpoint, model)  # type: ignore[misc]

    def _load_best_model(self) -> None:
        best = self.state.best_model_checkpoint
        if is_injected(self.model) and best is not None and _holds_our_files(self.model, best):
            load_checkpoint(self.model, best)
            return
        super()._load_best_model()  # type: ignore[misc]


def _refuse_full_fine_tune(model: nn.Module, trainer: str) -> None:
    """ValueError with the call to make when `model` has no injection and no peft adapter."""
    if is_injected(model) or _peft_layers(model) or not any(p.requires_grad for p in model.parameters()):
        return
    raise ValueError(
        f"{trainer}: the model has no mmpreproj modules injected (nor a peft adapter), so it would fine-tune "
        "every base weight; inject first (`model = mmpreproj.inject(model)`, or "
        "`mmpreproj.train.apply_method(model, 'preproj_lora')`), or use the plain Trainer to fine-tune the whole model"
    )


def preproj_trainer(trainer_cls: type[Trainer]) -> type[Trainer]:
    """`trainer_cls` with `PreProjTrainerMixin` in front (a new subclass; `trainer_cls` is not changed)."""
    if not (isinstance(trainer_cls, type) and issubclass(trainer_cls, Trainer)):
        raise TypeError(f"preproj_trainer: expected a subclass of transformers.Trainer, got {trainer_cls!r}")
    name = f"PreProj{trainer_cls.__name__}"
    doc = f"`{trainer_cls.__module__}.{trainer_cls.__qualname__}` whose checkpoints of an injected model are adapters."
    return type(name, (PreProjTrainerMixin, trainer_cls), {"__module__": __name__, "__doc__": doc})


class PreProjTrainer(PreProjTrainerMixin, Trainer):
    """`transformers.Trainer` whose checkpoints of an injected model are adapters (see the module docstring)."""
