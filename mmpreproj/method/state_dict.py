"""The adapter's tensors in and out of an injected model, keyed as the model's `state_dict()` keys them with the
adapter name removed (peft's file keys, without peft's `base_model.model.` prefix):

    gpt_neox.layers.3.attention.preproj.up.weight     (model key: ...attention.preproj.default.up.weight)
    multi_modal_projector.linear_1.weight             (a base module of modules_to_save)

The active adapter's (`adapter_state_dict` / `set_adapter_state_dict`, peft's `get/set_peft_model_state_dict`),
a stored one's, and the checks a set of tensors must pass (keys, shapes, dtypes, finite values). Older layouts
(block-index keys) are read by `convert.py`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TypeVar

import torch
from peft.utils.other import AuxiliaryTrainingWrapper
from torch import nn

from ..hosts.spec import get_path
from .convert import OLD_SLOTS, model_keys
from .layer import PreProjAttention
from .state import STATE_ATTR, InjectionState, active_name, adapter_params, injected_owner, named_adapter

V = TypeVar("V")
SLOTS = PreProjAttention.adapter_layer_names  # the adapter slots of a wrapper, named once


def injected_paths(owner: nn.Module) -> list[tuple[str, PreProjAttention]]:
    """(path in `owner`, wrapper) of every wrapper of an injected model, in block order."""
    found = [(n, m) for n, m in owner.named_modules() if isinstance(m, PreProjAttention)]
    return sorted(found, key=lambda nm: nm[1].block_index)


def wrapper_tensors(
    pairs: Iterable[tuple[str, PreProjAttention]], adapter_name: str | None = None
) -> dict[str, torch.Tensor]:
    """Adapter `adapter_name`'s (default: the active one's) weights in the wrappers at (path, wrapper)."""
    return {
        f"{path}.{slot}.{k}": v
        for path, w in pairs
        for slot, module in zip(SLOTS, w.slots(adapter_name))
        if module is not None
        for k, v in module.state_dict().items()
    }


def is_slot_key(key: str) -> bool:
    """Whether an adapter key names an injected weight (`....{slot}.{param}`, today's slot names or the older
    ones, `convert.OLD_SLOTS`), not a `modules_to_save` one."""
    parts = key.split(".")
    return any(p in SLOTS or p in OLD_SLOTS for p in parts[:-1])


def rekeyed_by_block(
    tensors: dict[str, V], layers: object, modules: object, pairs: list[tuple[str, PreProjAttention]]
) -> dict[str, V]:
    """`tensors` saved from a model whose wrappers sat at other paths (`modules`, aligned with the block indices
    `layers`: a `features_only` net, another wrapping) keyed by this model's paths (`pairs`), block by block;
    every other key unchanged. The file's paths are strings compared with strings, never resolved."""
    if not (isinstance(layers, list) and isinstance(modules, list) and len(layers) == len(modules)):
        return tensors
    here = {w.block_index: path for path, w in pairs}
    moved = {f"{old}.": f"{here[i]}." for i, old in zip(layers, modules) if i in here and here[i] != old}
    if not moved:
        return tensors
    out = {}
    for key, value in tensors.items():
        head = next((h for h in moved if key.startswith(h) and is_slot_key(key[len(h) :])), None)
        out[key if head is None else moved[head] + key[len(head) :]] = value
    return out


def saved_module_tensors(model: nn.Module, modules_to_save: dict[str, str]) -> dict[str, torch.Tensor]:
    """The live values of the `modules_to_save` modules, keyed `{path}.{param}`."""
    return {
        f"{path}.{k}": v for path in modules_to_save.values() for k, v in get_path(model, path).state_dict().items()
    }


def original_module_tensors(model: nn.Module, state: InjectionState) -> dict[str, torch.Tensor]:
    """The values the `modules_to_save` modules had at inject (what `unload` puts back), keyed `{path}.{param}` as
    `saved_module_tensors` keys the live ones."""
    return {
        f"{path}.{k}": state.saved_originals[f"{name}.{k}"]
        for name, path in state.modules_to_save.items()
        for k in get_path(model, path).state_dict()
    }


def peft_heads(module: nn.Module) -> dict[str, nn.Module]:
    """{path: wrapper} of the modules peft wraps itself inside `module` (a classification task's heads in its
    `ModulesToSaveWrapper`, one copy per adapter, saved and loaded by peft)."""
    return {n: m for n, m in module.named_modules() if isinstance(m, AuxiliaryTrainingWrapper)}


def refuse_peft_heads(owner: nn.Module, what: str) -> None:
    """ValueError when peft wraps a module of the injected model `owner` itself (`peft_heads`): our writers would
    leave it out, so they refuse instead of writing part of the model."""
    head = next(iter(peft_heads(owner)), None)
    if head is not None:
        raise ValueError(
            f"{what}: {head!r} is a module peft wraps and trains itself (the head of a classification task, peft's "
            f"ModulesToSaveWrapper), which {what} would leave out; save this model with peft, "
            "peft_model.save_pretrained(DIR), which writes the head beside the adapter (refused before any read)"
        )


def adapter_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """Only the active adapter's weights and the config's `modules_to_save`, keyed as the injected model's
    `state_dict()` keys them without the adapter name (`gpt_neox.layers.3.attention.preproj.up.weight`).

    Weights sharded by FSDP2 (DTensors) are gathered into full tensors: a collective, so on a sharded
    model every rank must call this (one rank alone waits forever). To save from one rank, gather the
    model's state dict on every rank and pass it (`adapter_tensors_from_state_dict`, `save_adapter(state_dict=)`).
    """
    return {k: _full(v) for k, v in local_adapter_state_dict(model).items()}


def local_adapter_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """`adapter_state_dict`'s keys and this process's tensors: shards stay shards (no collective)."""
    owner, _ = injected_owner(model, "adapter_state_dict")
    refuse_peft_heads(owner, "adapter_state_dict")
    name, _ = named_adapter(owner, None)  # every adapter deleted: refused, as the save calls refuse
    return named_adapter_tensors(owner, name)


def _full(v: torch.Tensor) -> torch.Tensor:
    """An FSDP2 DTensor's full tensor (a collective: every rank must take part); any other tensor as it is."""
    return v.full_tensor() if hasattr(v, "full_tensor") else v


# what wrappers put in module names (FSDP1, activation checkpointing); gathered state dicts leave them out
_WRAPPER_SEGMENTS = ("_fsdp_wrapped_module.", "_checkpoint_wrapped_module.")


def adapter_tensors_from_state_dict(
    owner: nn.Module, name: str, state_dict: dict[str, torch.Tensor], prefix: str = "", *, gather: bool = True
) -> dict[str, torch.Tensor]:
    """Adapter `name`'s weights keyed as `named_adapter_tensors` keys them, read from `state_dict`, a state dict of
    the model that holds `owner` under `prefix` ("base_model.model." in a PeftModel): the model's key of each
    weight, `{path}.{slot}.{name}.{param}`, without the adapter name.

    What a Trainer or accelerate saves under FSDP2 / ZeRO-3: the full state dict gathered on every rank, then
    written by the main process alone. The live weights are never read (they are shards there) and nothing
    is gathered, unless `state_dict` itself holds FSDP2 shards and `gather` (peft's default `model.state_dict()`,
    when `save_pretrained` runs on every rank): those are gathered, a collective. A stored adapter's
    `modules_to_save` values are not in a model's state dict and come from the injection state. ValueError
    naming the missing keys, or a state dict of empty ZeRO-3 partitions.
    """
    state: InjectionState = vars(owner)[STATE_ATTR]
    active = name == active_name(owner)
    wanted: dict[str, str] = {}  # our key -> the model's key
    for path, w in injected_paths(owner):
        for slot, module in zip(SLOTS, w.slots(name)):
            if module is not None:
                for k in module.state_dict():
                    wanted[f"{path}.{slot}.{k}"] = f"{path}.{slot}.{name}.{k}"
    if active:
        for path in state.modules_to_save.values():
            for k in get_path(owner, path).state_dict():
                wanted[f"{path}.{k}"] = f"{path}.{k}"
    given = {_bare(k, prefix): v for k, v in state_dict.items()}
    missing = [k for k in wanted.values() if k not in given]
    if missing:
        raise ValueError(
            f"the given state_dict lacks {len(missing)} weight(s) of adapter {name!r} (e.g. {prefix}{missing[0]}); "
            "pass the model's full state dict (under FSDP2: get_model_state_dict(model, options=StateDictOptions("
            "full_state_dict=True)) on every rank; under ZeRO-3: the engine's consolidated one)"
        )
    out = {k: _full(given[v]) if gather else given[v] for k, v in wanted.items()}
    if not active:
        out.update(state.stored_modules.get(name, {}))
    elif state.disabled_values is not None:  # the adapters are off: the host's modules hold the base's values
        out.update(state.disabled_values)
    refuse_empty(out, "the given state dict")
    return out


def refuse_empty(tensors: dict[str, torch.Tensor], where: str) -> None:
    """ValueError naming the first empty weight: a DeepSpeed ZeRO-3 partition read outside a gather (an adapter
    weight is never empty: its inner width is at least 1)."""
    empty = next((k for k, v in tensors.items() if v.numel() == 0), None)
    if empty is not None:
        raise ValueError(
            f"adapter weight {empty} is empty in {where} (DeepSpeed ZeRO-3 partitions hold no data outside a "
            "gather): pass the consolidated state dict (accelerator.get_state_dict(engine), on every rank) "
            "as state_dict="
        )


def _bare(key: str, prefix: str) -> str:
    """A state dict key without `prefix` and the names module wrappers insert."""
    for segment in _WRAPPER_SEGMENTS:
        key = key.replace(segment, "")
    return key.removeprefix(prefix) if prefix else key


def check_tensors_match(expected: dict[str, torch.Tensor], tensors: dict[str, torch.Tensor], what: str) -> None:
    """ValueError starting with `what` unless `tensors` has exactly the keys and shapes of `expected`."""
    missing, unexpected = sorted(set(expected) - set(tensors)), sorted(set(tensors) - set(expected))
    if missing or unexpected:
        raise ValueError(f"{what}: missing {missing[:4]}, unexpected {unexpected[:4]}")
    for k, dst in expected.items():
        got = tensors[k]
        if tuple(got.shape) != tuple(dst.shape):
            raise ValueError(f"{what}: {k} has shape {tuple(got.shape)}, expected {tuple(dst.shape)}")
        # a float weight may come in another float dtype (cast on copy); integers, bools or complex values never
        if got.is_floating_point() != dst.is_floating_point() or (
            not dst.is_floating_point() and got.dtype != dst.dtype
        ):
            expect = f"a floating-point tensor ({dst.dtype})" if dst.is_floating_point() else str(dst.dtype)
            raise ValueError(f"{what}: {k} has dtype {got.dtype}, expected {expect}")


def refuse_non_finite(tensors: dict[str, torch.Tensor], what: str) -> None:
    """ValueError naming the first tensor with NaN/inf values, or an injected weight (`is_slot_key`) that is not
    floating point (integers, bools, complex: finite garbage where float weights are expected)."""
    for k, v in tensors.items():
        if not v.is_floating_point() and is_slot_key(k):
            raise ValueError(f"{what}: tensor {k} has dtype {v.dtype}; injected weights are floating point (float32)")
        if v.is_floating_point() and not bool(torch.isfinite(v).all()):
            bad = int((~torch.isfinite(v)).sum())
            raise ValueError(f"{what}: tensor {k} holds {bad} non-finite value(s) (nan/inf) of {v.numel()}")


def set_adapter_state_dict(
    model: nn.Module, tensors: dict[str, torch.Tensor], *, adapter_name: str | None = None
) -> nn.Module:
    """Copy adapter weights (keyed as `adapter_state_dict` keys them, or in the older block-index keys,
    `convert.py`) into an already injected `model`.

    The in-place counterpart of `load_adapter` (peft's `set_peft_model_state_dict`): the injection stays,
    only its weights change, so optimizer references and hooks survive (a Trainer's resume). Every key and
    shape is checked, and non-finite values refused, before the first copy: on error nothing changed.
    `adapter_name` writes a stored (inactive) adapter instead of the active one.
    Not for FSDP2-sharded models (their weights are DTensors).
    """
    copy_adapter_weights(checked_adapter_copies(model, tensors, adapter_name, "set_adapter_state_dict"))
    return model


def checked_adapter_copies(
    model: nn.Module, tensors: dict[str, torch.Tensor], adapter_name: str | None, what: str
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(live weight, given tensor) of every weight of adapter `adapter_name` (default: the active one) in the
    injected `model`, once every key, shape, dtype and value of `tensors` has passed (ValueError starting with
    `what` otherwise); nothing is copied here, so a caller may check before it changes anything else."""
    owner, state = injected_owner(model, what)
    name, _ = named_adapter(owner, adapter_name)
    tensors = model_keys(tensors, injected_paths(owner), state.modules_to_save)
    expected = named_adapter_tensors(owner, name)
    check_tensors_match(expected, tensors, f"{what}: the weights do not match this injection")
    refuse_non_finite(tensors, what)
    return [(dst, tensors[k]) for k, dst in expected.items()]


def copy_adapter_weights(copies: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    """Copy each checked tensor into its live weight (`checked_adapter_copies`)."""
    with torch.no_grad():
        for dst, src in copies:
            dst.copy_(src)


def named_adapter_tensors(owner: nn.Module, name: str) -> dict[str, torch.Tensor]:
    """Adapter `name`'s weights (the live tensors, not gathered): the active one's or a stored one's, whose
    `modules_to_save` values wait in the injection state."""
    state: InjectionState = vars(owner)[STATE_ATTR]
    out = wrapper_tensors(injected_paths(owner), name)
    if name == active_name(owner):
        out.update(state.disabled_values or saved_module_tensors(owner, state.modules_to_save))
    else:
        out.update(state.stored_modules.get(name, {}))
    return out


def trainable_adapter_params(owner: nn.Module) -> list[nn.Parameter]:
    """The active adapter's weights and its `modules_to_save` weights (what trains with the adapter)."""
    state: InjectionState = vars(owner)[STATE_ATTR]
    params = [p for _, w in injected_paths(owner) for p in adapter_params(w)]
    params += [p for path in state.modules_to_save.values() for p in get_path(owner, path).parameters()]
    return params


def set_adapter_trainable(owner: nn.Module, trains: bool) -> None:
    """Set `requires_grad` of the active adapter's weights and its `modules_to_save` (`trainable_adapter_params`)."""
    for p in trainable_adapter_params(owner):
        p.requires_grad_(trains)


def restore_saved_modules(model: nn.Module, state: InjectionState) -> None:
    """Put back the weights `modules_to_save` had at inject time (they trained with the adapter)."""
    live = saved_module_tensors(model, state.modules_to_save)
    copy_adapter_weights([(live[k], v) for k, v in original_module_tensors(model, state).items()])


def base_modules_in(owner: nn.Module, on: bool) -> bool:
    """While the adapters are off (`on`: peft's `disable_adapter()`, `adapter_disabled`), the `modules_to_save`
    modules, which train in place, hold the base's values, as LoRA's wrapper runs its original module; the active
    adapter's wait in `state.disabled_values` (a switch meanwhile trades them there, `adapters.switch_adapter`) and
    come back exactly when the adapters are on again (`on=False`). Copied through `.data`: a graph recorded before (a
    DPO policy forward, whose backward runs after its reference forward) finds its own values back and its version
    counters as they were. Whether it moved anything (False when already so)."""
    state: InjectionState = vars(owner)[STATE_ATTR]
    if not state.modules_to_save or on == (state.disabled_values is not None):
        return False
    live = saved_module_tensors(owner, state.modules_to_save)
    if on:
        state.disabled_values = {k: v.detach().clone() for k, v in live.items()}
        values = original_module_tensors(owner, state)
    else:
        values, state.disabled_values = state.disabled_values, None
    with torch.no_grad():
        for k, dst in live.items():
            dst.data.copy_(values[k])
    return True
