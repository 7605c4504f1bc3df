"""Take a peft adapter off an injected model without taking ours with it.

    model = mmpreproj.train.apply_method(base, "preproj_lora")      # inject, then peft LoRA on top
    merged = unload_peft(model, merge=True)   # LoRA merged into the base weights; the injection stays
    plain = mmpreproj.unload(unload_peft(model))   # both parts off: the base as it was

Why not peft's own `model.unload()` / `merge_and_unload()`: its loop treats every module with a
`base_layer` attribute as one of its tuner layers, and our wrapper keeps the attention as `base_layer`
(peft's own convention). So `unload()` swaps our wrapper for the bare attention (leaving the injection's
bookkeeping behind and the LoRA layers, now out of its reach, in place), and `merge_and_unload()` fails
on our wrapper's missing `merge`. `unload_peft` walks peft's tuner layers only.
"""

from __future__ import annotations

import sys

from torch import nn

__all__ = ["unload_peft"]


def _tuner_layers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """(name, module) of the outermost peft layers in `model`: LoRA-style tuner layers and peft's
    modules_to_save / trainable-token wrappers (those have `unload_and_optionally_merge_module`)."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    found: list[tuple[str, nn.Module]] = []
    for name, module in model.named_modules():
        if any(name.startswith(f"{outer}.") for outer, _ in found):
            continue
        if isinstance(module, BaseTunerLayer) or hasattr(type(module), "unload_and_optionally_merge_module"):
            found.append((name, module))
    return found


def unload_peft(model: nn.Module, *, merge: bool = False) -> nn.Module:
    """Remove every peft layer of the `PeftModel` `model` (merging it into the base weights if `merge`);
    return the model peft wrapped, with our injection (if any) untouched.

    Every layer is checked before the first change: a refused call leaves `model` as it was.
    """
    peft = sys.modules.get("peft")
    if peft is None or not isinstance(model, peft.PeftModel):
        raise TypeError(f"unload_peft: expected a peft PeftModel, got {type(model).__name__}")
    base = model.get_base_model()
    layers = _tuner_layers(base)
    for name, layer in layers:
        special = hasattr(type(layer), "unload_and_optionally_merge_module")
        if not special and not callable(getattr(layer, "get_base_layer", None)):
            raise TypeError(
                f"unload_peft: peft layer {name} ({type(layer).__name__}) cannot give its base layer back"
            )
        if merge and not special and not callable(getattr(layer, "merge", None)):
            raise TypeError(f"unload_peft: peft layer {name} ({type(layer).__name__}) cannot merge")
    for name, layer in layers:
        parent_name, _, attr = name.rpartition(".")
        parent = base.get_submodule(parent_name)
        if hasattr(type(layer), "unload_and_optionally_merge_module"):
            plain = layer.unload_and_optionally_merge_module(
                merge=merge, safe_merge=False, adapter_names=None
            )
        else:
            if merge:
                layer.merge()
            plain = layer.get_base_layer()
        setattr(parent, attr, plain)
    if "peft_config" in vars(base):
        del base.peft_config
    return base
