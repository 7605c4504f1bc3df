"""What `inject` leaves on a model: the injection state (`model.mmpreproj_state`), the wrappers in it, the
adapter names; and how to find the injected model inside whatever wraps it (a peft `PeftModel`, a container,
DDP / FSDP, or `torch.compile`'s `OptimizedModule`). Weights are keyed as the model's `state_dict()` keys them,
the adapter name removed (peft's file keys, `state_dict.py`).

`inject` keeps its bookkeeping on the model it was given (`model.mmpreproj_state`). Every wrapper above
holds that model as a submodule, so walking `model.named_modules()` finds it. Only an attribute stored on
the module itself counts: peft's `__getattr__` forwards unknown names to the wrapped model, so
`getattr(peft_model, "mmpreproj_state")` answers although the state does not live there.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from ..version import __version__
from .config import PreProjConfig
from .file_check import ADAPTER_TYPE
from .layer import BASE_ADAPTER, PreProjAttention

STATE_ATTR = "mmpreproj_state"


def injected_owners(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """(dotted name, module) of every module inside `model` (itself included, name "") that holds an
    injection state of its own. TypeError for anything but a module."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model={model!r:.60} ({type(model).__name__}); must be a torch.nn.Module")
    return [(name, m) for name, m in model.named_modules(remove_duplicate=True) if STATE_ATTR in vars(m)]


def injected_owner(model: nn.Module, what: str) -> tuple[nn.Module, Any]:
    """The one injected model inside `model` and its state; `what` names the caller in the errors."""
    owners = injected_owners(model)
    if not owners:
        raise RuntimeError(f"{what}: this model has no mmpreproj modules (call mmpreproj.inject first)")
    if len(owners) > 1:
        names = [name or "<the model itself>" for name, _ in owners]
        raise ValueError(f"{what}: this model holds {len(owners)} injected models ({names}); pass one of them")
    _, owner = owners[0]
    return owner, vars(owner)[STATE_ATTR]


def owner_prefix(model: nn.Module, owner: nn.Module) -> str:
    """The key prefix of `owner`'s weights in `model.state_dict()` ("base_model.model." in a PeftModel)."""
    if owner is model:
        return ""
    return next(f"{n}." for n, m in model.named_modules() if m is owner)


def refuse_meta_parameters(model: nn.Module, what: str) -> None:
    """Refuse a model whose weights live on the meta device: weights copied into it would be dropped by
    the `to_empty` that materialises it later."""
    meta = [n for n, t in (*model.named_parameters(), *model.named_buffers()) if t.is_meta]
    if meta:
        raise ValueError(
            f"{what}: the model has {len(meta)} tensor(s) on the meta device (e.g. {meta[0]}); materialise it "
            f"first (model.to_empty(device=...) and load the base weights), then call {what} again"
        )


@dataclass
class InjectionState:
    """What `inject` did to a model, kept on the model as `model.mmpreproj_state`: the sites and what to put back.

    Which adapters exist and which one runs is peft's record, not this: `peft_config` is peft's own dict (the
    tuner's, the same object the model and a `PeftModel` hold), and each wrapper's `active_adapters` and slot
    `ModuleDict`s say what runs (`loaded_adapters`, `active_name`)."""

    config: PreProjConfig  # the first adapter's: the sites' facts every adapter shares (host, parts, layers, ...)
    host: str
    layers: list[int]
    num_blocks: int
    hidden_size: int | list[int]  # one width, or one per injected block when they differ (e.g. CLIP towers)
    host_description: dict = field(default_factory=dict)  # the resolved row (spec.py), so reload needs no code
    parts: list[dict] = field(default_factory=list)  # per part: name, first block index, blocks, injected layers
    modules_to_save: dict[str, str] = field(default_factory=dict)  # name -> attribute path of a trained base module
    base_model_name_or_path: str | None = None  # the host's hub id or folder when it was loaded from one (peft's key)
    modules: list[str] = field(default_factory=list)  # each injected wrapper's path in the model, aligned with layers
    saved_originals: dict[str, torch.Tensor] = field(default_factory=dict, repr=False)  # restored by unload
    # while the adapters are off (peft's `disable_adapter()`, `adapter_disabled`): the active adapter's
    # `modules_to_save` values, the host's modules holding the base's (`state_dict.base_modules_in`)
    disabled_values: dict[str, torch.Tensor] | None = field(default=None, repr=False)
    # by name in the injected model (a parameter replaced since, `load_state_dict(assign=True)`, is found by it)
    frozen: dict[str, nn.Parameter] = field(default_factory=dict, repr=False)  # what inject froze (unload thaws)
    thawed: dict[str, nn.Parameter] = field(default_factory=dict, repr=False)  # frozen before, made trainable
    # hooks put on the model (the reentrant-checkpointing one of `apply._freeze_base`, the mixed-batch pair of
    # `apply.finish`) and attributes set on the instance by the API above the tuner (`mmpreproj.inject`'s
    # `peft_config`, as peft's `inject_adapter_in_model` leaves it: name -> the object set): unload and roll_back
    # take exactly these off
    hooks: list[RemovableHandle] = field(default_factory=list, repr=False)
    # the wrappers' pre-hooks of the mixed batch running now (`apply._take_adapter_names`), removed when it ends
    call_hooks: list[RemovableHandle] = field(default_factory=list, repr=False)
    instance_attrs: dict[str, Any] = field(default_factory=dict, repr=False)
    # peft's record of the adapters (name -> config): the tuner's dict itself, never a copy (`model.PreProjModel`)
    peft_config: dict[str, Any] = field(default_factory=dict, repr=False)
    # the `modules_to_save` values of the adapters that wait (the host's modules hold the active one's), keyed as
    # in the file (`{path}.{param}`); a switch trades them (`adapters.switch_adapter`)
    stored_modules: dict[str, dict[str, torch.Tensor]] = field(default_factory=dict, repr=False)

    def describe(self) -> dict:
        """The JSON-able description saved beside adapter weights."""
        return {
            "adapter_type": ADAPTER_TYPE,  # with `method`: what the folder holds, so nothing guesses from its shape
            "method": self.config.method,
            "base_model_name_or_path": self.base_model_name_or_path,
            "config": self.config.to_dict(),
            "host": self.host,
            "host_description": self.host_description,
            "parts": self.parts,
            "layers": self.layers,
            "modules": self.modules,
            "num_blocks": self.num_blocks,
            "hidden_size": self.hidden_size,
            "modules_to_save": self.modules_to_save,
            "library_version": __version__,
        }


def injected_modules(model: nn.Module) -> list[PreProjAttention]:
    """The wrappers in `model`, in block order."""
    found = [m for m in model.modules() if isinstance(m, PreProjAttention)]
    return sorted(found, key=lambda m: m.block_index)


@contextlib.contextmanager
def attrs_set(objs: list[Any], attr: str, value: Any) -> Iterator[None]:
    """Each of `objs` with `attr` set to `value` inside the block; each one's own value put back afterwards."""
    before = [getattr(o, attr) for o in objs]
    for o in objs:
        setattr(o, attr, value)
    try:
        yield
    finally:
        for o, flag in zip(objs, before):
            setattr(o, attr, flag)


@contextlib.contextmanager
def wrappers_aside(model: nn.Module) -> Iterator[None]:
    """Our wrappers out of `model` and back: each attention module (LoRA's layers inside) in its wrapper's place
    meanwhile, so a caller sees the model the wrappers were put on (its keys, its layers to visit); the wrappers
    are put back afterwards, also on error."""
    swaps = [
        (parent, name, child)
        for parent in model.modules()
        for name, child in parent.named_children()
        if isinstance(child, PreProjAttention)
    ]
    try:
        for parent, name, wrapper in swaps:
            setattr(parent, name, wrapper.base_layer)
        yield
    finally:
        for parent, name, wrapper in swaps:
            setattr(parent, name, wrapper)


def is_injected(model: nn.Module) -> bool:
    """Whether `model` holds an injection (by `inject` or peft's `get_peft_model` with a `PreProjConfig`)."""
    return hasattr(model, "mmpreproj_state") or bool(injected_modules(model))


def adapter_params(wrapper: PreProjAttention, name: str | None = None) -> list[nn.Parameter]:
    """Adapter `name`'s weights in one wrapper (default: the active adapter's)."""
    return [p for m in wrapper.slots(name) if m is not None for p in m.parameters()]


def adapter_trains(wrappers: Iterable[PreProjAttention]) -> bool:
    """Whether the active adapter trains: some of its weights in `wrappers` require grad."""
    return any(p.requires_grad for w in wrappers for p in adapter_params(w))


def check_adapter_name(name: object) -> str:
    """An adapter name: a non-empty string without '.' (it becomes an `nn.ModuleDict` key), and not "__base__"
    (peft's name for the base alone in a mixed batch's `adapter_names`)."""
    if not isinstance(name, str) or not name or "." in name or name == BASE_ADAPTER:
        raise ValueError(
            f"adapter_name={name!r}; must be a non-empty string without '.', and not {BASE_ADAPTER!r} (in a mixed "
            "batch it names the base alone)"
        )
    return name


def _first_wrapper(owner: nn.Module) -> PreProjAttention | None:
    """One wrapper of the injected model `owner`: every wrapper holds the same adapters, the same one active."""
    return next((m for m in owner.modules() if isinstance(m, PreProjAttention)), None)


def loaded_adapters(owner: nn.Module) -> list[str]:
    """The adapters of the injected model `owner`, in loading order: peft's `peft_config` names that the wrappers
    hold (peft's functional `delete_adapter` takes a name out of the layers alone)."""
    wrapper = _first_wrapper(owner)
    held = set(wrapper.adapter_names()) if wrapper is not None else set()
    return [n for n, c in vars(owner)[STATE_ATTR].peft_config.items() if n in held and isinstance(c, PreProjConfig)]


def active_name(owner: nn.Module) -> str | None:
    """The adapter that runs in the injected model `owner`: peft's per-layer record (`active_adapters`); None once
    every adapter is deleted (the host runs alone, as a LoRA model without adapters)."""
    return next(iter(_first_wrapper(owner).active_adapters), None)


def named_adapter(owner: nn.Module, name: str | None) -> tuple[str, PreProjConfig]:
    """(name, config) of an adapter loaded into the injected model `owner`; None means the active one. ValueError
    listing the loaded names."""
    loaded = loaded_adapters(owner)
    name = active_name(owner) if name is None else name
    if name is None:
        raise ValueError(
            "no adapter is loaded: every one was deleted (the host runs alone); add or load one (peft_model."
            "add_adapter, mmpreproj.load_adapter(model, DIR, adapter_name=...)), or mmpreproj.unload(model)"
        )
    if name not in loaded:
        raise ValueError(f"adapter_name={name!r} is not loaded; loaded: {loaded}")
    return name, vars(owner)[STATE_ATTR].peft_config[name]
