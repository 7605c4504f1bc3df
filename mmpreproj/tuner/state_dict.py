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
    "check_tensors_match",
    "named_adapter_tensors",
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
    model every rank must call this.
    """
    out = wrapper_tensors(injected_modules(model))
    state: InjectionState | None = getattr(model, "mmpreproj_state", None)
    if state is not None:
        out.update(saved_module_tensors(model, state.modules_to_save))
    # FSDP2 DTensor -> full tensor
    return {k: v.full_tensor() if hasattr(v, "full_tensor") else v for k, v in out.items()}


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
