"""Find the injected model inside whatever wraps it: a peft `PeftModel`, a container (`nn.ModuleDict`,
`nn.Sequential`, any parent module), DDP / FSDP, or `torch.compile`'s `OptimizedModule`.

`inject` keeps its bookkeeping on the model it was given (`model.mmpreproj_state`). Every wrapper above
holds that model as a submodule, so walking `model.named_modules()` finds it. Only an attribute stored on
the module itself counts: peft's `__getattr__` forwards unknown names to the wrapped model, so
`getattr(peft_model, "mmpreproj_state")` answers although the state does not live there.
"""

from __future__ import annotations

from typing import Any

from torch import nn

STATE_ATTR = "mmpreproj_state"


def injected_owners(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """(dotted name, module) of every module inside `model` (itself included, name "") that holds an
    injection state of its own."""
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
    state = vars(owner)[STATE_ATTR]
    follow = getattr(state, "follow_layers", None)  # peft's record is the truth (`InjectionState.follow_layers`)
    if follow is not None:
        follow(owner)
    return owner, state


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
