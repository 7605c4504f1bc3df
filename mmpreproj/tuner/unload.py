"""unload / adapter_disabled: take the injected modules out of a model, for good or for a block of code.

`unload` checks everything before its first change, so a refused call leaves the model as it was.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn

from ..hosts.spec import get_path
from ..modules import PreProjAttention
from .plan import peft_layers
from .state import InjectionState, injected_modules, is_injected
from .unwrap import STATE_ATTR, injected_owners


def unload(model: nn.Module) -> nn.Module:
    """Remove every injected module, restoring the original attention modules and `requires_grad` flags.

    `model` may be the injected model or anything that holds it (a peft `PeftModel`, a container module,
    DDP/FSDP, `torch.compile`): every injected model inside is restored. Everything is checked before the
    first change, so a refused call leaves the model as it was.

    Only the flags inject changed are put back: the base weights it froze become trainable again, the
    `modules_to_save` weights it made trainable are frozen again. Under peft (the `preproj_lora` shape: peft
    wrapped the model after inject and froze the base for its own adapter) the base stays frozen, as peft
    wants it: the LoRA model goes on training only its LoRA weights.
    """
    if not is_injected(model):
        raise RuntimeError("this model has no mmpreproj modules to unload")
    swaps = []
    for parent in model.modules():
        for name, child in parent.named_children():
            if isinstance(child, PreProjAttention):
                if not isinstance(child.base_layer, nn.Module):
                    raise RuntimeError(
                        f"unload: the wrapper at .{name} of {type(parent).__name__} lost its base layer"
                    )
                swaps.append((parent, name, child.base_layer))
    owners = [owner for _, owner in injected_owners(model)]
    params = list(model.parameters())
    current = {id(p) for p in params}
    for owner in owners:
        state = vars(owner)[STATE_ATTR]
        if not isinstance(state, InjectionState):
            raise TypeError(
                f"unload: {type(owner).__name__}.{STATE_ATTR} is not an InjectionState; nothing was changed"
            )
        if any(id(p) not in current for p in state.frozen) and any(hasattr(p, "full_tensor") for p in params):
            raise RuntimeError(
                "unload: the model's parameters were replaced by sharded ones after inject (FSDP fully_shard), so "
                "the base's requires_grad flags cannot be restored; nothing was changed. Unload before sharding"
            )
    for parent, name, base in swaps:  # from here on nothing can fail
        wrapper = getattr(parent, name)
        if wrapper.seam_check is not None:
            wrapper.seam_check.close()
        setattr(parent, name, base)
    wrapped_by_peft = peft_layers(model)[:1] == [""]
    for owner in owners:
        state: InjectionState = vars(owner)[STATE_ATTR]
        _restore_saved_modules(owner, state)
        if not (wrapped_by_peft or peft_layers(owner)):  # peft froze the base after inject: it stays frozen
            for p in state.frozen:
                if not p.requires_grad:
                    p.requires_grad_(True)
        for p in state.thawed:
            if p.requires_grad:
                p.requires_grad_(False)
        for hook in state.hooks:
            hook.remove()
        for attr, value in state.instance_attrs.items():  # only what is still the object put there
            if vars(owner).get(attr) is value:
                delattr(owner, attr)
        delattr(owner, STATE_ATTR)
    return model


@contextlib.contextmanager
def adapter_disabled(model: nn.Module) -> Iterator[nn.Module]:
    """Run the host without its injected modules inside the block (weights stay in place)."""
    wrappers = injected_modules(model)
    before = [w.adapter_enabled for w in wrappers]
    for w in wrappers:
        w.adapter_enabled = False
    try:
        yield model
    finally:
        for w, flag in zip(wrappers, before):
            w.adapter_enabled = flag


def _restore_saved_modules(model: nn.Module, state: InjectionState) -> None:
    """Put back the weights `modules_to_save` had at inject time (they trained with the adapter)."""
    with torch.no_grad():
        for name, path in state.modules_to_save.items():
            for k, v in get_path(model, path).state_dict(keep_vars=True).items():
                v.copy_(state.saved_originals[f"{name}.{k}"])
