"""The steps of one first injection, as the tuner's peft hooks run them (`model.PreProjModel`): the plan
(`plan_for`, nothing changed), each planned wrapper placed (`place`), the injection finished once every site
holds its wrapper (`finish`), the base frozen (`mark_trainable`), the example forward (`run_example`), and
`roll_back`, which undoes whatever of these ran, so a failed injection leaves the model exactly as it was; and
the way back: `unload` (for good) and `adapter_disabled` (for a block of code). `unload` checks everything before
its first change, so a refused call leaves the model as it was.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cached_property, partial
from typing import Any

import torch
from peft.tuners.tuners_utils import BaseTunerLayer
from torch import nn

from ..hosts import HostSpec
from ..hosts.auto_host import check_forced, one_call_host, split_input
from ..hosts.checkpointing import reentrant_checkpointing
from ..hosts.spec import Site, get_path
from ..util.probing import probing
from .adapters import Addition
from .config import PreProjConfig
from .layer import PreProjAttention, SeamError, hand_adapter_names
from .plan import Plan, check_plain_model, config_host, peft_layers, plan_injection
from .state import (
    STATE_ATTR,
    InjectionState,
    adapter_params,
    adapter_trains,
    attrs_set,
    injected_modules,
    injected_owners,
    is_injected,
)
from .state_dict import base_modules_in, restore_saved_modules


@dataclass
class Request:
    """What `mmpreproj.inject` / `load_adapter` hand the tuner beyond peft's arguments: the host, the example
    input, or a plan already built (and filled with saved weights), or a further adapter to add (`adapters.py`)."""

    host: str | dict | HostSpec | None = None
    example_input: Any = None
    plan: Plan | None = None
    addition: Addition | None = None


@dataclass
class Injection:
    """A first injection on its way through peft's `inject_adapter` loop."""

    config: PreProjConfig
    adapter_name: str
    plan: Plan | None = None
    example_input: Any = None
    placed: list[tuple[Site, PreProjAttention]] = field(default_factory=list)
    finished: bool = False
    flags: list[tuple[nn.Parameter, bool]] = field(default_factory=list)  # every base flag, as the call found it

    @cached_property
    def sites(self) -> dict[str, tuple[Site, PreProjAttention]]:
        """The planned (site, wrapper) by module path (read once the plan is built)."""
        return dict(zip(self.plan.state.modules, self.plan.placements))


def plan_for(
    model: nn.Module, config: PreProjConfig, adapter_name: str, host: Any, example_input: Any
) -> tuple[Plan, Any]:
    """(the plan, the example input to run once injected): the host the call names, else the config's (a saved
    one), else the row that claims the model or the trace (`auto_host.one_call_host`); every check, nothing
    changed."""
    check_plain_model(model)
    if isinstance(host, str):  # a forced row: the trace must not find it post-norm
        check_forced(model, host, example_input)
    host = host if host is not None else config_host(model, config)
    if host is None and not peft_layers(model):  # the one call: a row, or the trace
        host, example_input = one_call_host(model, example_input)
    plan = plan_injection(model, config, host, adapter_name=adapter_name)
    for _, wrapper in plan.placements:  # an inner width of 0 would inject a no-op and save an empty adapter
        if len(wrapper.preproj):
            config.inner_width(wrapper.adapter_width)
    return plan, example_input


def place(injection: Injection, site: Site, wrapper: PreProjAttention) -> None:
    """Put one planned wrapper in its site's place."""
    setattr(site.parent, site.attr, wrapper)
    injection.placed.append((site, wrapper))


def finish(model: nn.Module, plan: Plan) -> None:
    """Every site holds its wrapper: arm the seam checks, tell the wrappers whether the host's `modules_to_save`
    train in place (`PreProjAttention.values_aside`), attach the injection state."""
    plan.arm()
    for _, wrapper in plan.placements:
        wrapper.values_aside = bool(plan.state.modules_to_save)
    model.mmpreproj_state = plan.state
    plan.state.hooks += [
        model.register_forward_pre_hook(_take_adapter_names, with_kwargs=True),
        model.register_forward_hook(_drop_adapter_names, with_kwargs=True, always_call=True),
    ]


def _take_adapter_names(model: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
    """Forward pre-hook of the injected model: a mixed batch's `adapter_names` (peft's forward argument) taken out
    of the call and handed to every wrapper (`layer.hand_adapter_names`), so the names reach each block whether
    or not the host passes its keyword arguments on to the attention (StableLM's and MPT's blocks do not), and a
    host whose forward takes no such argument (a timm ViT) never sees it. A `PeftModel` takes them out first."""
    if "adapter_names" not in kwargs:
        return None
    kwargs = dict(kwargs)
    names = kwargs.pop("adapter_names")
    if names is not None:
        state = getattr(model, STATE_ATTR)
        state.call_hooks = hand_adapter_names(model, injected_modules(model), names, state.peft_config)
    return args, kwargs


def _drop_adapter_names(model: nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
    """Forward hook of the injected model, run even when the forward raises: the mixed batch's pre-hooks go."""
    state = getattr(model, STATE_ATTR, None)
    if state is not None and state.call_hooks:
        for handle in state.call_hooks:
            handle.remove()
        state.call_hooks = []


def mark_trainable(model: nn.Module, plan: Plan) -> None:
    """Freeze the base (`config.freeze_base`) and keep `modules_to_save` trainable iff the adapter trains;
    each flag changed is recorded in the state, so `unload` and `roll_back` put it back."""
    if plan.state.config.freeze_base:
        _freeze_base(model, plan.state, plan.spec)
    trains = adapter_trains(w for _, w in plan.placements)
    _keep_trainable(model, plan.state, thaw=trains)


def run_example(model: nn.Module, example_input: Any) -> None:
    """One forward on `example_input` (None: none), under `torch.no_grad`, in eval mode, on a forked RNG. An error
    of the host's own on that input is a ValueError naming `example_input` (the caller rolls the injection back); a
    seam that does not fit stays a `SeamError`."""
    if example_input is None:
        return
    args, kwargs = split_input(example_input)
    try:
        with probing(model), torch.no_grad():
            model(*args, **kwargs)
    except (SeamError, torch.OutOfMemoryError):
        raise
    except Exception as e:
        raise ValueError(
            f"inject(example_input=...): {type(model).__name__} failed on the example input: {type(e).__name__}: "
            f"{e}; pass a batch its forward takes (a tensor, a tuple of positional arguments, or a dict of keyword "
            "arguments, as model(**batch)); nothing was changed"
        ) from e


def roll_back(model: nn.Module, injection: Injection) -> None:
    """Undo whatever of the injection ran: wrappers, seam checks, flags (each as `injection.flags` found it, so a
    flag peft's loop set after ours, `set_adapter(inference_mode=True)`, is put back too), the hooks, the state."""
    for site, wrapper in reversed(injection.placed):
        setattr(site.parent, site.attr, wrapper.base_layer)
        wrapper.disarm()
    injection.placed.clear()
    if injection.plan is None:
        return
    state = injection.plan.state
    for p in state.frozen.values():
        p.requires_grad_(True)
    for p in state.thawed.values():
        p.requires_grad_(False)
    for hook in state.hooks:
        hook.remove()
    if vars(model).get("mmpreproj_state") is state:
        del model.mmpreproj_state
    for p, flag in injection.flags:
        p.requires_grad_(flag)


def _freeze_base(model: nn.Module, state: InjectionState, spec: HostSpec) -> None:
    injected = {id(p) for w in injected_modules(model) for p in adapter_params(w)} | _other_tuners_weights(model)
    for n, p in model.named_parameters():
        if id(p) not in injected and p.requires_grad:
            p.requires_grad_(False)
            state.frozen[n] = p
    # With every base weight frozen, a block's input does not require grad, and reentrant gradient
    # checkpointing would silently give the injected weights no gradient. The hook makes the embedding output
    # require grad, only while checkpointing that may be reentrant is on (`hosts/checkpointing.py`): otherwise
    # that would cost a backward through the frozen ops ahead of the first injected module for nothing.
    emb = spec.input_embeddings(model)
    if emb is not None:
        # a partial, not a closure: deepcopy and pickle carry it over to the copied model
        hook = partial(_make_output_require_grad, model, checkpointing=spec.checkpointing)
        state.hooks.append(emb.register_forward_hook(hook))


def _other_tuners_weights(model: nn.Module) -> set[int]:
    """ids of another peft tuner's adapter weights inside `model` (LoRA's `lora_A`, ... in the attention ours wraps,
    method 'preproj_lora'): the base freeze leaves their `requires_grad` as that tuner set it."""
    return {
        id(p)
        for m in model.modules()
        if isinstance(m, BaseTunerLayer) and not isinstance(m, PreProjAttention)
        for name in (*m.adapter_layer_names, *m.other_param_names)
        if isinstance(sub := getattr(m, name, None), nn.Module)
        for p in sub.parameters()
    }


def _make_output_require_grad(
    model: nn.Module, module: nn.Module, args: tuple, output: torch.Tensor, *, checkpointing: str = "any"
) -> None:
    """Forward hook: `output.requires_grad_()` when some block of `model` may be checkpointed reentrantly, read
    with the row's switch (`HostSpec.checkpointing`, `hosts/checkpointing.py`)."""
    if not (torch.is_grad_enabled() and isinstance(output, torch.Tensor) and output.is_floating_point()):
        return
    if not output.requires_grad and reentrant_checkpointing(model, checkpointing):
        output.requires_grad_(True)


def _keep_trainable(model: nn.Module, state: InjectionState, *, thaw: bool) -> None:
    """Keep a copy of the config's `modules_to_save` weights for `unload`, and unfreeze them when `thaw`."""
    for name, path in state.modules_to_save.items():
        module = get_path(model, path)
        for k, v in module.state_dict().items():
            state.saved_originals.setdefault(f"{name}.{k}", v.detach().clone())
        if not thaw:
            continue
        keep = {id(p) for p in module.parameters()}
        frozen_here = {id(p) for p in state.frozen.values()}
        for k, p in module.named_parameters():
            if not p.requires_grad and id(p) not in frozen_here:
                state.thawed[f"{path}.{k}"] = p
            p.requires_grad_(True)
        state.frozen = {n: p for n, p in state.frozen.items() if id(p) not in keep}  # identity, not tensor ==


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
        if any(id(p) not in current for p in state.frozen.values()) and any(hasattr(p, "full_tensor") for p in params):
            raise RuntimeError(
                "unload: the model's parameters were replaced by sharded ones after inject (FSDP fully_shard), so "
                "the base's requires_grad flags cannot be restored; nothing was changed. Unload before sharding"
            )
    # each owner's parameters by name, read with the wrappers in place (the names `state.frozen` / `thawed` hold)
    named = {id(o): dict(o.named_parameters(remove_duplicate=False)) for o in owners}
    for parent, name, base in swaps:  # from here on nothing can fail
        getattr(parent, name).disarm()
        setattr(parent, name, base)
    wrapped_by_peft = peft_layers(model)[:1] == [""]
    for owner in owners:
        state: InjectionState = vars(owner)[STATE_ATTR]
        restore_saved_modules(owner, state)
        live = named[id(owner)]  # a parameter replaced since inject (`load_state_dict(assign=True)`): by its name
        if not (wrapped_by_peft or peft_layers(owner)):  # peft froze the base after inject: it stays frozen
            for p in (live.get(n, p) for n, p in state.frozen.items()):
                if not p.requires_grad:
                    p.requires_grad_(True)
        for p in (live.get(n, p) for n, p in state.thawed.items()):
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
    """Run the host without its injected modules inside the block (weights stay in place; our `modules_to_save` at
    the base's values, as peft's `disable_adapter()`); ValueError for a model with none (nothing to disable: as
    `set_adapter` and `unload` refuse it)."""
    wrappers = injected_modules(model)
    if not wrappers:
        raise ValueError(
            f"adapter_disabled: {type(model).__name__} holds no mmpreproj modules (inject or load an adapter first)"
        )
    with attrs_set(wrappers, "adapter_enabled", False):
        # `modules_to_save` at the base's values meanwhile, as peft's `disable_adapter()`; put back by the block that
        # moved them (an inner one inside an outer disable moves nothing)
        moved = [owner for _, owner in injected_owners(model) if base_modules_in(owner, True)]
        try:
            yield model
        finally:
            for owner in moved:
                base_modules_in(owner, False)
