"""Several adapters on one base: an added adapter through peft's loop, the switch, the delete, and our API's
calls over them (`mmpreproj.set_adapter`, `delete_adapter`, `adapter_names`, `active_adapter`).

Design: as peft's LoRA, each wrapper keeps every adapter in one `nn.ModuleDict` per slot keyed by adapter name
(`wrapper.preproj[name]`, `wrapper.preproj_skip[name]`; peft's `BaseTunerLayer` methods), the inactive ones
with `requires_grad=False`; `set_adapter` switches which one runs (nothing moves, so an optimizer built before
the switch still holds the old adapter's tensors). The `modules_to_save` values of the inactive adapters live
in the injection state and are copied in and out on a switch.

An added adapter goes in through peft's own injection loop, as the first one does (`PreProjModel.inject_adapter`:
`plan_addition` checks and builds it, peft's loop visits each site, `place_added` puts its modules into that
wrapper with `update_layer`, as LoRA adds a second adapter; a failure takes them out again). It must fit the
injection's sites: the same host row, parts, blocks and widths, the same
preproj/skip presence and the same `modules_to_save` names. Its expansion, activation, init or compute
dtype may differ (its modules are built from its own config). `unload` removes every loaded adapter.

Switch between steps, as for LoRA: nothing here watches for a forward or backward in flight (peft's record of
the active adapter is per layer, and peft's own calls switch it directly). Our API's calls go through peft's
record of the adapters when there is one (a `PeftModel` over the injection, or the tuner itself), so peft and
mmpreproj name the same adapters; on a model `inject` injected, straight through `switch_adapter` and
`remove_adapter` below.

    mmpreproj.load_adapter(model, "runs/b/adapter", adapter_name="b")  # added beside "default", frozen, inactive
    mmpreproj.set_adapter(model, "b")                                  # b now runs (and trains iff "default" did)
    mmpreproj.delete_adapter(model, "default")                         # an inactive one; unload removes them all
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import torch
from peft import PeftModel
from peft import functional as peft_functional
from peft.tuners.tuners_utils import BaseTuner
from torch import nn

from ..modules import ContentSkip, PreProjection
from .config import PreProjConfig
from .convert import model_keys
from .layer import TUNER_PREFIX, PreProjAttention
from .plan import device_of, new_adapter_modules
from .state import (
    STATE_ATTR,
    InjectionState,
    active_name,
    adapter_params,
    adapter_trains,
    attrs_set,
    check_adapter_name,
    injected_modules,
    injected_owner,
    loaded_adapters,
    named_adapter,
)
from .state_dict import (
    SLOTS,
    check_tensors_match,
    copy_adapter_weights,
    injected_paths,
    original_module_tensors,
    restore_saved_modules,
    saved_module_tensors,
    set_adapter_trainable,
)


@dataclass
class Addition:
    """A further adapter on its way through peft's injection loop (`PreProjModel.inject_adapter`): checked and
    built for every site, not yet in any wrapper. `place_added` puts one site's modules in, `finish_addition`
    records it once every site holds them, `undo_addition` takes them out of the wrappers that got them."""

    name: str
    config: PreProjConfig
    owner: nn.Module  # the injected model (its paths are the sites')
    state: InjectionState
    modules: dict[str, tuple[PreProjection | None, ContentSkip | None]]  # by wrapper path in the injected model
    stored: dict[str, torch.Tensor]  # its `modules_to_save` values, kept in the state while it is inactive
    placed: list[PreProjAttention] = field(default_factory=list)


def plan_addition(
    owner: nn.Module,
    config: PreProjConfig,
    name: str,
    where: str,
    *,
    tensors: dict[str, torch.Tensor] | None = None,
) -> Addition:
    """Check and build adapter `name` for the sites of the injected model `owner`: a saved one (`tensors` read by
    `files.read_adapter`, copied into the built modules; its record checked by the caller,
    `load_check.check_added_record`) or, without them, a freshly initialised one (peft's `add_adapter`; its
    `modules_to_save` start from the base's values, kept at inject, as a LoRA adapter's copy does). Nothing is
    changed: the modules go in through peft's loop. ValueError naming the first field that does not fit."""
    state = vars(owner)[STATE_ATTR]
    check_adapter_name(name)
    loaded = loaded_adapters(owner)
    if name in loaded:
        caller = "load_adapter" if tensors is not None else "add_adapter"
        raise ValueError(
            f"{caller}: adapter_name={name!r} is already loaded ({loaded}); "
            "delete_adapter it first or choose another name"
        )
    for field_name in ("parts", "layers", "modules_to_save", "host", "preproj", "skip"):  # fresh or saved: one rule
        have, want = getattr(state.config, field_name), getattr(config, field_name)
        same = want == have or (field_name == "host" and want is None)
        if not same and field_name == "layers":  # another spelling of the same blocks ([0, 1], [-2, -1] for None)
            same = _selects_injected_blocks(config, [p for p in state.parts if p["layers"]])
        if not same:
            raise ValueError(
                f"{where}: config.{field_name}={want!r}, the injection has {have!r}; "
                "an added adapter sits on the same sites (nothing was changed)"
            )
    modules, expected = {}, {}
    pairs = injected_paths(owner)
    # a saved adapter's modules are overwritten: building them must not move the caller's RNG
    rng = torch.random.fork_rng(devices=[]) if tensors is not None else contextlib.nullcontext()
    with rng:
        for path, w in pairs:
            held = adapter_params(w)  # the active adapter's weights: their device and dtype (none: a fresh one's)
            device = held[0].device if held else device_of(w.get_base_layer())
            built = new_adapter_modules(w.adapter_width, config, device)
            for slot, module in zip(SLOTS, built):
                if module is not None:
                    module.to(dtype=held[0].dtype if held else torch.float32).requires_grad_(False)  # inactive, frozen
                    expected.update({f"{path}.{slot}.{k}": v for k, v in module.state_dict().items()})
            modules[path] = built
    live_modules = saved_module_tensors(owner, state.modules_to_save)
    if tensors is None:  # as LoRA's new adapter: a copy of the base's values (kept at inject), not the trained ones
        stored = {k: v.clone() for k, v in original_module_tensors(owner, state).items()}
        return Addition(name, config, owner, state, modules, stored)
    tensors = model_keys(tensors, pairs, state.modules_to_save)  # an older folder's block-index keys
    check_tensors_match({**expected, **live_modules}, tensors, f"adapter at {where} does not match its config")
    copy_adapter_weights([(dst, tensors[k]) for k, dst in expected.items()])
    stored = {k: tensors[k].to(device=v.device, dtype=v.dtype).clone() for k, v in live_modules.items()}
    return Addition(name, config, owner, state, modules, stored)


def _selects_injected_blocks(config: PreProjConfig, parts: list[dict]) -> bool:
    """Whether `config.layers` selects the blocks injected in `parts` (the injection's part rows that hold some:
    each part's block count and its injected blocks), read as `plan._select` reads it."""
    if isinstance(config.layers, dict) and not set(config.layers) <= {p["name"] for p in parts}:
        return False  # a part the injection does not hold
    try:
        if config.layers is None or isinstance(config.layers, dict):
            return all(config.resolve_layers(p["num_blocks"], p["name"]) == sorted(p["layers"]) for p in parts)
        injected, offset = [], 0  # a list indexes the selected parts' blocks in order
        for p in parts:
            injected += [offset + i for i in p["layers"]]
            offset += p["num_blocks"]
        return config.resolve_layers(offset) == sorted(injected)
    except ValueError:  # an index out of range: not these blocks
        return False


def place_added(addition: Addition, path: str, wrapper: PreProjAttention) -> None:
    """Put the added adapter's modules for site `path` into its wrapper (peft's `update_layer`)."""
    wrapper.update_layer(addition.name, *addition.modules[path])
    addition.placed.append(wrapper)


def finish_addition(addition: Addition) -> None:
    """Every site holds the added adapter: record its config and `modules_to_save` values in the state."""
    if len(addition.placed) != len(addition.modules):  # pragma: no cover - peft's loop visits every module
        raise RuntimeError(f"add_adapter({addition.name!r}): peft's loop did not reach every site")
    addition.state.peft_config[addition.name] = addition.config  # peft's record (peft's add_adapter put it there)
    addition.state.stored_modules[addition.name] = addition.stored


def undo_addition(addition: Addition) -> None:
    """Take the added adapter out of every wrapper that got it (a failed addition changes nothing)."""
    for wrapper in reversed(addition.placed):
        wrapper.delete_adapter(addition.name)
    addition.placed.clear()


def switch_adapter(owner: nn.Module, name: str, *, trains: bool | None = None, scope: nn.Module | None = None) -> None:
    """`set_adapter` on the injected model `owner` itself: adapter `name` runs; it and the `modules_to_save` train
    iff `trains` (None: iff the active adapter does now), the others are frozen. With `scope` (the peft tuner's
    model) the switch is peft's own, `peft.functional.set_adapter` over it: every wrapper and peft's head wrappers
    in it, as `BaseTuner.set_adapter`. Without, the wrappers alone (`inject`'s model: its `modules_to_save` are the
    host's own, and a head wrapper in it is another tuner's, a stacked LoRA's). A no-op when `name` already runs
    and trains as asked."""
    _, state = injected_owner(owner, "set_adapter")
    name, _ = named_adapter(owner, check_adapter_name(name))
    wrappers = injected_modules(owner)
    now = adapter_trains(wrappers)
    trains = now if trains is None else trains
    old = active_name(owner)  # None: every adapter was deleted, the host's modules hold the base's values
    if name == old and trains == now and not others_train(wrappers, name):
        return
    if name != old and state.disabled_values is not None:  # adapters off: the active values wait in the state
        kept, state.disabled_values = state.disabled_values, state.stored_modules.pop(name, {})
        if old is not None:
            state.stored_modules[old] = kept
    elif name != old:
        live = saved_module_tensors(owner, state.modules_to_save)
        kept = {k: v.detach().clone() for k, v in live.items()}
        waiting = state.stored_modules.pop(name, {})
        copy_adapter_weights([(dst, waiting[k]) for k, dst in live.items()])
        if old is not None:
            state.stored_modules[old] = kept
    if scope is None:
        for w in wrappers:
            w.activate([name], inference_mode=not trains)
    else:
        # the model's switch has moved the `modules_to_save` values: its layers may follow peft's per-layer
        # `set_adapter` (which each refuses alone while `values_aside`)
        with attrs_set(wrappers, "values_aside", False):
            peft_functional.set_adapter(scope, name, inference_mode=not trains, layer_cls=PreProjAttention)
    if trains != now:
        set_adapter_trainable(owner, trains)


def others_train(wrappers: list[PreProjAttention], name: str) -> bool:
    """Whether an adapter other than `name` has a trainable weight (peft's `set_adapter` freezes them all)."""
    return any(
        p.requires_grad
        for w in wrappers
        for slot in w.adapter_layer_names
        for other, module in getattr(w, slot).items()
        if other != name
        for p in module.parameters()
    )


def remove_adapter(owner: nn.Module, name: str, *, scope: nn.Module | None = None) -> None:
    """`delete_adapter` on the injected model `owner` itself: the inactive adapter `name` goes (the peft tuner's
    `delete_adapter` switches away from an active one first, as peft does), or the last one: the host then runs
    alone, its `modules_to_save` back at the base's values and frozen, as a LoRA model without adapters. With
    `scope` (the peft tuner's model) through `peft.functional.delete_adapter` over it: the wrappers and peft's head
    wrappers, as `BaseTuner.delete_adapter`; without, the wrappers alone (`switch_adapter`)."""
    _, state = injected_owner(owner, "delete_adapter")
    name, _ = named_adapter(owner, check_adapter_name(name))
    refuse_active(owner, name)
    wrappers = injected_modules(owner)
    if loaded_adapters(owner) == [name]:  # the last: the host's modules_to_save hold its values
        set_adapter_trainable(owner, False)
        restore_saved_modules(owner, state)
        if state.disabled_values is not None:  # adapters off: the base's values come back after, too
            state.disabled_values = {k: v.clone() for k, v in original_module_tensors(owner, state).items()}
    with attrs_set(wrappers, "values_aside", False):  # the values are where they belong: the layers may delete
        if scope is not None:
            peft_functional.delete_adapter(scope, name, prefix=TUNER_PREFIX, layer_cls=PreProjAttention)
        for w in wrappers:  # all without `scope`; with it, any whose path holds peft's prefix (peft skips those)
            if name in w.adapter_names():
                w.delete_adapter(name)
    state.peft_config.pop(name, None)
    state.stored_modules.pop(name, None)


def refuse_active(owner: nn.Module, name: str) -> None:
    """ValueError when `name` is the active adapter of the injected model `owner` and others are loaded (switch to
    one of them first); the last one may go (`remove_adapter`)."""
    others = [n for n in loaded_adapters(owner) if n != name]
    if name == active_name(owner) and others:
        raise ValueError(f"delete_adapter: {name!r} is the active adapter; set_adapter to one of {others} first")


def adapter_names(model: nn.Module) -> list[str]:
    """The names of every adapter loaded into the injected model inside `model`, in loading order."""
    return loaded_adapters(injected_owner(model, "adapter_names")[0])


def active_adapter(model: nn.Module) -> str:
    """The name of the adapter that runs (and trains) now."""
    return active_name(injected_owner(model, "active_adapter")[0])


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
    """Make the loaded adapter `name` the one that runs; it trains iff the previous active one did or it waits
    trainable (`load_adapter(..., adapter_name=name, is_trainable=True)`); through the `PeftModel` when `model` is
    one, so peft's `active_adapter` follows (peft's own `PeftModel.set_adapter` follows peft's rule instead:
    trainable unless `inference_mode=True`).

    Switch between steps (after `loss.backward()` and the optimizer step), as for LoRA: a switch between a
    forward and its backward freezes the adapter that ran it, so that backward fills no adapter's gradient.
    """
    record, owner, name = _through_peft(model, name, "set_adapter")
    wrappers = injected_modules(owner)
    trains = adapter_trains(wrappers) or any(p.requires_grad for w in wrappers for p in adapter_params(w, name))
    if record is not None:  # peft's rule (trains unless inference_mode), told what ours is
        record.set_adapter(name, inference_mode=not trains)
    else:
        switch_adapter(owner, name, trains=trains)
    return model


def _through_peft(model: nn.Module, name: str, what: str) -> tuple[nn.Module | None, nn.Module, str]:
    """(peft's record or None, the injected model, the checked name) for a call `what` on adapter `name` made
    through `model`; our refusal of a name not loaded comes first, and an adapter added through the injected model
    itself joins peft's record."""
    owner, _ = injected_owner(model, what)
    name, config = named_adapter(owner, check_adapter_name(name))
    record = peft_record(model, owner)
    if record is not None:
        record.peft_config.setdefault(name, config)
    return record, owner, name


def delete_adapter(model: nn.Module, name: str) -> nn.Module:
    """Remove the loaded, inactive adapter `name` (switch away from the active one first), or the last one (the
    host then runs alone, as a LoRA model without adapters; `unload` takes the wrappers off); through the
    `PeftModel` when `model` is one, so peft's `peft_config` follows."""
    record, owner, name = _through_peft(model, name, "delete_adapter")
    refuse_active(owner, name)
    if record is not None:
        record.delete_adapter(name)
    else:
        remove_adapter(owner, name)
    return model
