"""Our API's calls on several adapters (`mmpreproj.set_adapter`, `delete_adapter`, `adapter_names`,
`active_adapter`): made through peft's record of the adapters when there is one (a `PeftModel` over the injection,
or the tuner itself), so peft and mmpreproj name the same adapters; on a model `inject` injected (no record),
straight through the tuner's own steps (`tuner/named.py`: `switch_adapter`, `remove_adapter`).

    mmpreproj.load_adapter(model, "runs/b/adapter", adapter_name="b")  # added beside "default", frozen, inactive
    mmpreproj.set_adapter(model, "b")                                  # b now runs (and trains iff "default" did)
    mmpreproj.delete_adapter(model, "default")                         # an inactive one; unload removes them all
"""

from __future__ import annotations

from peft import PeftModel
from peft.tuners.tuners_utils import BaseTuner
from torch import nn

from ..modules import PreProjAttention
from ..tuner.named import refuse_active, remove_adapter, switch_adapter
from ..tuner.state import adapter_trains, check_adapter_name, injected_modules, named_adapter
from ..tuner.unwrap import STATE_ATTR, injected_owner


def adapter_names(model: nn.Module) -> list[str]:
    """The names of every adapter loaded into the injected model inside `model`, in loading order."""
    return list(injected_owner(model, "adapter_names")[1].adapter_configs)


def active_adapter(model: nn.Module) -> str:
    """The name of the adapter that runs (and trains) now."""
    return injected_owner(model, "active_adapter")[1].active_adapter


def peft_record(model: nn.Module, owner: nn.Module) -> nn.Module | None:
    """What keeps peft's record of the adapters of the injected model `owner` inside `model`: the `PeftModel` over
    it (its `active_adapter`, and its tuner's `peft_config`), else the PREPROJ tuner itself, else None (`inject`
    keeps none). Every add, switch and delete made through `model` goes through it, so peft and mmpreproj name
    the same adapters."""
    tuner = next(
        (
            m
            for m in model.modules()
            if isinstance(m, BaseTuner)
            and m.model is owner
            and getattr(m, "tuner_layer_cls", None) is PreProjAttention
        ),
        None,
    )
    if tuner is None:
        return None
    return next((m for m in model.modules() if isinstance(m, PeftModel) and m.base_model is tuner), tuner)


def set_adapter(model: nn.Module, name: str) -> nn.Module:
    """Make the loaded adapter `name` the one that runs; it trains iff the previous active one did (through the
    `PeftModel` when `model` is one, so peft's `active_adapter` follows; peft's own `PeftModel.set_adapter` follows
    peft's rule instead: trainable unless `inference_mode=True`).

    Switch between steps (after `loss.backward()` and the optimizer step), as for LoRA: a switch between a
    forward and its backward leaves that backward filling the gradients of the adapter switched away from.
    """
    record, owner, name = _through_peft(model, name, "set_adapter")
    if record is not None:  # peft's rule (trains unless inference_mode), told what ours is
        record.set_adapter(name, inference_mode=not adapter_trains(injected_modules(owner)))
    else:
        switch_adapter(owner, name)
    return model


def _through_peft(model: nn.Module, name: str, what: str) -> tuple[nn.Module | None, nn.Module, str]:
    """(peft's record or None, the injected model, the checked name) for a call `what` on adapter `name` made
    through `model`; our refusal of a name not loaded comes first, and an adapter added through the injected model
    itself joins peft's record."""
    owner, state = injected_owner(model, what)
    name, config = named_adapter(state, check_adapter_name(name))
    record = peft_record(model, owner)
    if record is not None:
        record.peft_config.setdefault(name, config)
    return record, owner, name


def delete_adapter(model: nn.Module, name: str) -> nn.Module:
    """Remove the loaded, inactive adapter `name` (switch away from the active one first; `unload`
    removes them all); through the `PeftModel` when `model` is one, so peft's `peft_config` follows."""
    record, owner, name = _through_peft(model, name, "delete_adapter")
    refuse_active(vars(owner)[STATE_ATTR], name)
    if record is not None:
        record.delete_adapter(name)
    else:
        remove_adapter(owner, name)
    return model
