"""inject / unload / adapter_disabled: put the modules into a host model and take them out.

Every call validates first (`plan.py`) and mutates last, so a failed call leaves the model exactly as it was.
The injection's bookkeeping lives on the model itself (`model.mmpreproj_state`, `state.py`), never in globals.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from functools import partial
from typing import Any

import torch
from torch import nn

from ..hosts import HostSpec
from ..hosts.checkpointing import reentrant_checkpointing
from ..hosts.spec import get_path
from ..modules import PreProjAttention
from ..modules.seam import SeamCheck
from ..util.probing import probing
from .auto_host import check_forced, one_call_host, split_input
from .config import PreProjConfig
from .plan import Plan, config_host, peft_layers, plan_injection
from .pretrained import install_save_pretrained, remove_save_pretrained
from .state import InjectionState, adapter_params, injected_modules, is_injected
from .unwrap import STATE_ATTR, injected_owners


def _freeze_base(model: nn.Module, state: InjectionState, spec: HostSpec) -> None:
    injected = {id(p) for w in injected_modules(model) for p in adapter_params(w)}
    for p in model.parameters():
        if id(p) not in injected and p.requires_grad:
            p.requires_grad_(False)
            state.frozen.append(p)
    # With every base weight frozen, a block's input does not require grad, and reentrant gradient
    # checkpointing would silently give the injected weights no gradient. The hook makes the embedding output
    # require grad, only while reentrant checkpointing is on: otherwise that would cost a backward through
    # the frozen ops ahead of the first injected module (2.7% of a step) for nothing.
    emb = spec.input_embeddings(model)
    if emb is not None:
        # a partial, not a closure: deepcopy and pickle carry it over to the copied model
        state.input_grad_hook = emb.register_forward_hook(
            partial(_make_output_require_grad, model, checkpointing=spec.checkpointing)
        )


def _make_output_require_grad(
    model: nn.Module, module: nn.Module, args: tuple, output: torch.Tensor, *, checkpointing: str = "any"
) -> None:
    """Forward hook: `output.requires_grad_()` when some block of `model` is checkpointed reentrantly, read
    with the row's switch (`HostSpec.checkpointing`, `hosts/checkpointing.py`)."""
    if not (torch.is_grad_enabled() and isinstance(output, torch.Tensor) and output.is_floating_point()):
        return
    if not output.requires_grad and reentrant_checkpointing(model, checkpointing):
        output.requires_grad_(True)


def apply_plan(model: nn.Module, plan: Plan) -> nn.Module:
    for _, wrapper in plan.placements:  # an inner width of 0 would inject a no-op and save an empty adapter
        if len(wrapper.preproj):
            plan.state.config.inner_width(wrapper.adapter_width)
    done = []
    try:
        for site, wrapper in plan.placements:
            setattr(site.parent, site.attr, wrapper)
            done.append((site, wrapper))
        for wrapper, block, norm, where, norm_path in plan.seams:
            wrapper.seam_check = SeamCheck(block, norm, where, norm_path)
        model.mmpreproj_state = plan.state
        install_save_pretrained(model)
        if plan.state.config.freeze_base:
            _freeze_base(model, plan.state, plan.spec)
        _keep_trainable(model, plan.state)
    except BaseException:
        for site, wrapper in done:
            setattr(site.parent, site.attr, wrapper.base_layer)
            if getattr(wrapper, "seam_check", None) is not None:
                wrapper.seam_check.close()
        for p in plan.state.frozen:
            p.requires_grad_(True)
        for p in plan.state.thawed:
            p.requires_grad_(False)
        if plan.state.input_grad_hook is not None:
            plan.state.input_grad_hook.remove()
        remove_save_pretrained(model)
        if hasattr(model, "mmpreproj_state"):
            del model.mmpreproj_state
        raise
    return model


def _keep_trainable(model: nn.Module, state: InjectionState) -> None:
    """Unfreeze the config's `modules_to_save` and keep a copy of their weights for `unload`."""
    for name, path in state.modules_to_save.items():
        module = get_path(model, path)
        for k, v in module.state_dict().items():
            state.saved_originals[f"{name}.{k}"] = v.detach().clone()
        keep = {id(p) for p in module.parameters()}
        frozen_here = {id(p) for p in state.frozen}
        for p in module.parameters():
            if not p.requires_grad and id(p) not in frozen_here:
                state.thawed.append(p)
            p.requires_grad_(True)
        state.frozen[:] = [p for p in state.frozen if id(p) not in keep]  # identity, not tensor ==


def inject(
    model: nn.Module,
    config: PreProjConfig | None = None,
    *,
    host: str | dict | HostSpec | None = None,
    example_input: Any = None,
    adapter_name: str = "default",
) -> nn.Module:
    """Add the pre-projection and/or content skip to every selected attention block of `model`, in place.

    Args:
        model: a supported host (see `mmpreproj.hosts.HOSTS`), or any model when `host` describes it.
        config: what to inject (default `PreProjConfig()`: pre-projection + skip, paper init, base frozen).
        host: None = the row that claims the model by type; else the seams traced on an example input (a row
            matched by structure is confirmed by that trace; `tuner/auto_host.py`); a row name forces that row; a
            description dict (or `HostSpec`)
            says where the blocks, the pre-attention norm and the attention are (see `mmpreproj.hosts.spec`).
            The description is saved with the adapter, so `load_adapter` needs no code. None reads
            `config.host` (and, on a config read from an adapter file, the host it was saved for).

        example_input: None, or an input to trace the model with (when no row claims it by type; None = one the
            model builds from its config, `tuner/example_input.py`) and to run one forward with right after
            injecting (a tensor, a tuple of
            positional arguments, or a dict of keyword arguments): under `torch.no_grad`, in eval mode (the
            train/eval flags put back) and on a forked RNG. If it raises (a seam error, an attention that
            cannot take `x~`), the model is unloaded and the error re-raised: a wrong description never
            leaves an injected model behind.

        adapter_name: the name of this first adapter (peft's "default"; `tuner.named` adds more).

    Returns the same model object. Injected weights are float32 on the device of their block.
    peft's spelling of the same call: `peft.inject_adapter_in_model(config, model)`; `peft.get_peft_model`
    wraps the result in a `PeftModel` (`mmpreproj.tuner.PreProjModel`).
    """
    config = config or PreProjConfig()
    if isinstance(host, str) and not is_injected(model):  # a forced row: the trace must not find it post-norm
        check_forced(model, host, example_input)
    host = host if host is not None else config_host(model, config)
    if host is None and not is_injected(model) and not peft_layers(model):  # the one call: a row, or the trace
        host, example_input = one_call_host(model, example_input)
    plan = plan_injection(model, config, host, adapter_name=adapter_name)
    apply_plan(model, plan)
    if example_input is not None:
        args, kwargs = split_input(example_input)
        try:
            with probing(model), torch.no_grad():
                model(*args, **kwargs)
        except BaseException:
            unload(model)
            raise
    return model


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
        if state.input_grad_hook is not None:
            state.input_grad_hook.remove()
        delattr(owner, STATE_ATTR)
        remove_save_pretrained(owner)
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
