"""The adapter's tensors in and out of an injected model, keyed by block index (`state.adapter_key`): the active
adapter's (`adapter_state_dict` / `set_adapter_state_dict`, peft's `get/set_peft_model_state_dict`), a stored
one's, and the checks a set of tensors must pass (keys, shapes, dtypes, finite values)."""

from __future__ import annotations

import torch
from torch import nn

from ..hosts.spec import get_path
from ..modules import PreProjAttention
from .in_flight import refuse_in_flight
from .state import InjectionState, adapter_key, adapter_params, injected_modules, named_adapter
from .unwrap import STATE_ATTR, injected_owner

__all__ = [
    "adapter_state_dict",
    "adapter_tensors_from_state_dict",
    "check_tensors_match",
    "local_adapter_state_dict",
    "named_adapter_tensors",
    "refuse_empty",
    "refuse_non_finite",
    "saved_module_tensors",
    "set_adapter_state_dict",
    "trainable_adapter_params",
    "wrapper_tensors",
]


def wrapper_tensors(wrappers: list[PreProjAttention]) -> dict[str, torch.Tensor]:
    return {
        adapter_key(w.block_index, part, k): v
        for w in wrappers
        for part in ("preproj", "skip")
        if getattr(w, part) is not None
        for k, v in getattr(w, part).state_dict().items()
    }


def saved_module_tensors(model: nn.Module, modules_to_save: dict[str, str]) -> dict[str, torch.Tensor]:
    return {
        adapter_key(None, name, k): v
        for name, path in modules_to_save.items()
        for k, v in get_path(model, path).state_dict().items()
    }


def adapter_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """Only the injected weights, keyed `blocks.{i}.preproj.up.weight` etc. by host block index, plus
    `modules.{name}.{param}` for the config's `modules_to_save`.

    Weights sharded by FSDP2 (DTensors) are gathered into full tensors: a collective, so on a sharded
    model every rank must call this (one rank alone waits forever). To save from one rank, gather the
    model's state dict on every rank and pass it (`adapter_tensors_from_state_dict`, `save_adapter(state_dict=)`).
    """
    return {k: _full(v) for k, v in local_adapter_state_dict(model).items()}


def local_adapter_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """`adapter_state_dict`'s keys and this process's tensors: shards stay shards (no collective)."""
    out = wrapper_tensors(injected_modules(model))
    state: InjectionState | None = getattr(model, "mmpreproj_state", None)
    if state is not None:
        out.update(saved_module_tensors(model, state.modules_to_save))
    return out


def _full(v: torch.Tensor) -> torch.Tensor:
    """An FSDP2 DTensor's full tensor (a collective: every rank must take part); any other tensor as it is."""
    return v.full_tensor() if hasattr(v, "full_tensor") else v


# what wrappers put in module names (FSDP1, activation checkpointing); gathered state dicts leave them out
_WRAPPER_SEGMENTS = ("_fsdp_wrapped_module.", "_checkpoint_wrapped_module.")


def adapter_tensors_from_state_dict(
    owner: nn.Module, name: str, state_dict: dict[str, torch.Tensor], prefix: str = ""
) -> dict[str, torch.Tensor]:
    """Adapter `name`'s weights in block-index keys (`named_adapter_tensors`' keys), read from `state_dict`, a
    state dict of the model that holds `owner` under `prefix` ("base_model.model." in a PeftModel).

    What a Trainer or accelerate saves under FSDP2 / ZeRO-3: the full state dict gathered on every rank, then
    written by the main process alone. The live weights are never read (they are shards there) and nothing
    is gathered, unless `state_dict` itself holds FSDP2 shards (peft's default `model.state_dict()`, when
    `save_pretrained` runs on every rank): those are gathered, a collective. A stored adapter's
    `modules_to_save` values are not in a model's state dict and come from the injection state. ValueError
    naming the missing keys, or a state dict of empty ZeRO-3 partitions.
    """
    state: InjectionState = vars(owner)[STATE_ATTR]
    active = name == state.active_adapter
    paths = dict(zip(state.layers, state.modules))  # block index -> wrapper path
    wanted: dict[str, str] = {}  # block-index key -> the model's key
    for w in injected_modules(owner):
        slots = {p: getattr(w, p) for p in ("preproj", "skip") if getattr(w, p) is not None}
        where = paths[w.block_index] if active else f"{paths[w.block_index]}.stored_adapters.{name}"
        for part, module in slots.items() if active else w.stored_adapters[name].items():
            for k in module.state_dict():
                wanted[adapter_key(w.block_index, part, k)] = f"{where}.{part}.{k}"
    if active:
        for module_name, path in state.modules_to_save.items():
            for k in get_path(owner, path).state_dict():
                wanted[adapter_key(None, module_name, k)] = f"{path}.{k}"
    given = {_bare(k, prefix): v for k, v in state_dict.items()}
    missing = [k for k in wanted.values() if k not in given]
    if missing:
        raise ValueError(
            f"the given state_dict lacks {len(missing)} weight(s) of adapter {name!r} (e.g. {prefix}{missing[0]}); "
            "pass the model's full state dict (under FSDP2: get_model_state_dict(model, options=StateDictOptions("
            "full_state_dict=True)) on every rank; under ZeRO-3: the engine's consolidated one)"
        )
    out = {k: _full(given[v]) for k, v in wanted.items()}
    if not active:
        out.update(state.stored_modules.get(name, {}))
    refuse_empty(out, "the given state dict")
    return out


def refuse_empty(tensors: dict[str, torch.Tensor], where: str) -> None:
    """ValueError naming the first empty weight: a DeepSpeed ZeRO-3 partition read outside a gather (an adapter
    weight is never empty: its inner width is at least 1)."""
    empty = next((k for k, v in tensors.items() if v.numel() == 0), None)
    if empty is not None:
        raise ValueError(
            f"adapter weight {empty} is empty in {where} (DeepSpeed ZeRO-3 partitions hold no data outside a "
            "gather): pass the consolidated state dict (engine._zero3_consolidated_16bit_state_dict(), or "
            "accelerator.get_state_dict(engine), on every rank) as state_dict="
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
    """ValueError naming the first tensor with NaN/inf values, or an injected weight (`blocks.*`) that is not
    floating point (integers, bools, complex: finite garbage where float weights are expected)."""
    for k, v in tensors.items():
        if not v.is_floating_point() and k.startswith("blocks."):
            raise ValueError(f"{what}: tensor {k} has dtype {v.dtype}; injected weights are floating point (float32)")
        if v.is_floating_point() and not bool(torch.isfinite(v).all()):
            bad = int((~torch.isfinite(v)).sum())
            raise ValueError(f"{what}: tensor {k} holds {bad} non-finite value(s) (nan/inf) of {v.numel()}")


def set_adapter_state_dict(
    model: nn.Module, tensors: dict[str, torch.Tensor], *, adapter_name: str | None = None
) -> nn.Module:
    """Copy adapter weights (keyed as `adapter_state_dict` keys them) into an already injected `model`.

    The in-place counterpart of `load_adapter` (peft's `set_peft_model_state_dict`): the injection stays,
    only its weights change, so optimizer references and hooks survive (a Trainer's resume). Every key and
    shape is checked, and non-finite values refused, before the first copy: on error nothing changed.
    `adapter_name` writes a stored (inactive) adapter instead of the active one.
    Not for FSDP2-sharded models (their weights are DTensors). Refused while a step is in flight (a forward
    running, or a graph through the adapter awaiting backward: `in_flight.refuse_in_flight`).
    """
    owner, state = injected_owner(model, "set_adapter_state_dict")
    name, _ = named_adapter(state, adapter_name)
    refuse_in_flight(owner, "set_adapter_state_dict")
    expected = named_adapter_tensors(owner, name)
    check_tensors_match(expected, tensors, "set_adapter_state_dict: the weights do not match this injection")
    refuse_non_finite(tensors, "set_adapter_state_dict")
    with torch.no_grad():
        for k, dst in expected.items():
            dst.copy_(tensors[k])
    return model


def named_adapter_tensors(owner: nn.Module, name: str) -> dict[str, torch.Tensor]:
    """Adapter `name`'s weights in block-index keys: the active one's (`adapter_state_dict`) or a stored one's."""
    state: InjectionState = vars(owner)[STATE_ATTR]
    return adapter_state_dict(owner) if name == state.active_adapter else _stored_tensors(owner, name)


def _stored_tensors(owner: nn.Module, name: str) -> dict[str, torch.Tensor]:
    """A stored (not active) adapter's weights, keyed as `adapter_state_dict` keys the active one's."""
    state: InjectionState = vars(owner)[STATE_ATTR]
    out = {
        adapter_key(w.block_index, part, k): v
        for w in injected_modules(owner)
        for part, module in w.stored_adapters[name].items()
        for k, v in module.state_dict().items()
    }
    out.update(state.stored_modules.get(name, {}))
    return out


def trainable_adapter_params(owner: nn.Module) -> list[nn.Parameter]:
    """The active adapter's weights and its `modules_to_save` weights (what trains with the adapter)."""
    state: InjectionState = vars(owner)[STATE_ATTR]
    params = [p for w in injected_modules(owner) for p in adapter_params(w)]
    params += [p for path in state.modules_to_save.values() for p in get_path(owner, path).parameters()]
    return params
