"""`PreProjModel`: the peft tuner of the method (peft_type "PREPROJ"), so `peft.get_peft_model(model,
PreProjConfig())` returns a `PeftModel` with the same modules, weights and outputs as `mmpreproj.inject`.

The first injection is peft's own loop, `BaseTuner.inject_adapter`, driven by the host plan rather than by module
names (`mmpreproj.hosts`: parts of a VLM, the norm -> attention seam, described hosts), each step in `apply.py`:
`_prepare_model` builds the plan (every check, nothing changed), `_check_target_module_exists` answers whether a
module is a planned site, `_create_and_replace` puts the planned wrapper there (the last one finishes the
injection: seam checks, state), `_mark_only_adapters_as_trainable` freezes the base and keeps
our `modules_to_save` trainable, recording each flag it changes. `inject_adapter` wraps that loop: any error
rolls the model back as it was. `mmpreproj.inject`, `peft.inject_adapter_in_model` and `peft.get_peft_model` all
build this tuner, and a further adapter (peft's `add_adapter`, `mmpreproj.load_adapter(adapter_name=)`) goes
through the same loop into the wrappers already there (`adapters.py`, as LoRA's `update_layer`).
What peft reads back is peft's: `peft_config`, `active_adapter`, `targeted_module_names`, and a state dict in
peft's keys: the model's own `state_dict()` keys, the adapter name removed on save and put back on load
(`_remove_adapter_name_from_key`), no converter between.
"""

from __future__ import annotations

import contextlib
import copy
import warnings
from collections.abc import Iterable, Iterator, Sequence
from functools import partial
from typing import Any

import torch
from peft.tuners.tuners_utils import BaseTuner, set_requires_grad
from torch import nn

from .adapters import (
    Addition,
    finish_addition,
    place_added,
    plan_addition,
    remove_adapter,
    switch_adapter,
    undo_addition,
)
from .apply import Injection, Request, finish, mark_trainable, place, plan_for, roll_back, run_example, unload
from .config import ADAPTER_FORMAT, PreProjConfig
from .convert import model_keys
from .file_check import DIGEST_KEY, HEAD_SHAPES_KEY, PEFT_PREFIX, peft_head_names, weights_digest
from .files import describe_for_save, injection_of
from .layer import (
    MERGE_REFUSED,
    ONE_ADAPTER_PER_FORWARD,
    TUNER_PREFIX,
    PreProjAttention,
    beam_copies,
    hand_mixed_names,
)
from .load_check import check_added_record, check_record_fits, check_transformers_load
from .state import (
    active_name,
    check_adapter_name,
    injected_modules,
    injected_owner,
    injected_owners,
    is_injected,
    loaded_adapters,
    named_adapter,
    owner_prefix,
)
from .state_dict import (
    SLOTS,
    adapter_tensors_from_state_dict,
    base_modules_in,
    check_tensors_match,
    injected_paths,
    is_slot_key,
    named_adapter_tensors,
    peft_heads,
    refuse_non_finite,
    set_adapter_trainable,
)

FREEZE_BASE_REFUSED = (
    "PreProjConfig.freeze_base=False under peft: peft saves only the adapter (and modules_to_save), so the base "
    "weights that would train are lost at every save; keep freeze_base=True and name the base modules to train "
    "in modules_to_save, or use mmpreproj.inject + mmpreproj.save_pretrained, which saves the whole model"
)


LOW_CPU_MODULES_TO_SAVE_REFUSED = (
    "low_cpu_mem_usage=True with PreProjConfig.modules_to_save: peft's low-memory load puts the file's tensors in "
    "place of the parameters, and ours are the host's own modules (trained in place, not copies), so a weight they "
    "share (an lm_head tied to the embeddings) would come apart and what unload puts back would be lost. Load "
    "without low_cpu_mem_usage (the adapter's weights are small); nothing was changed"
)


class PreProjModel(BaseTuner):
    """peft tuner: pre-projection + content skip at every selected attention block (arXiv 2604.10791)."""

    prefix: str = TUNER_PREFIX  # every slot name starts with it (peft's and transformers' key handling)
    tuner_layer_cls = PreProjAttention
    target_module_mapping: dict[str, list[str]] = {}

    def __init__(
        self,
        model: nn.Module,
        peft_config: PreProjConfig | dict[str, PreProjConfig],
        adapter_name: str,
        low_cpu_mem_usage: bool = False,
        state_dict: dict | None = None,
        *,
        request: Request | None = None,
    ) -> None:
        """peft's constructor; `request` is set by `mmpreproj.inject` / `load_adapter` (None: peft built it)."""
        # plain attributes, so nn.Module takes them before its __init__ (BaseTuner's runs the injection)
        self._request = request
        self._fresh = True  # peft's `__init__` runs the injection: a new tuner (`inject_adapter_in_model`)
        self._injection: Injection | None = None
        self._addition: Addition | None = None
        # peft's __init__ writes the config into the `peft_config` dict a model already injected holds (the record
        # of its adapters) before any check: a refused injection puts that record back as it was
        record = vars(model).get("peft_config")
        kept = dict(record) if isinstance(record, dict) else None
        try:
            super().__init__(
                model, peft_config, adapter_name, low_cpu_mem_usage=low_cpu_mem_usage, state_dict=state_dict
            )
        except BaseException:
            if kept is not None:
                record.clear()
                record.update(kept)
            raise
        self._fresh = False

    # -- injection: peft's loop (BaseTuner.inject_adapter), driven by the host plan ------------------------
    def inject_adapter(
        self,
        model: nn.Module,
        adapter_name: str,
        autocast_adapter_dtype: bool = True,
        low_cpu_mem_usage: bool = False,
        state_dict: dict | None = None,
        **_: Any,
    ) -> None:
        """First adapter: peft's `BaseTuner.inject_adapter` loop, whose hooks below plan, place and freeze; on any
        error the model is put back as it was. The sites come from the host plan, not from `state_dict` keys, and
        the wrappers are built by the plan, so `state_dict` and `low_cpu_mem_usage` are not passed on. A further
        adapter (peft's `add_adapter`: a fresh one; `mmpreproj.load_adapter(adapter_name=)`: a saved one) goes
        through the same loop onto the injected sites (`adapters.plan_addition`), inactive and frozen; on any error
        no wrapper keeps it."""
        config = self.peft_config[adapter_name]
        if not isinstance(config, PreProjConfig):
            raise TypeError(
                f"PreProjModel: peft_config[{adapter_name!r}] is a {type(config).__name__}, expected a PreProjConfig"
            )
        by_peft = self._request is None
        if by_peft and not config.freeze_base and not config.inference_mode:
            raise ValueError(FREEZE_BASE_REFUSED)
        own = _without_peft_heads(config) if by_peft else config  # the part of the config this tuner injects
        if low_cpu_mem_usage and own.modules_to_save:
            raise ValueError(LOW_CPU_MODULES_TO_SAVE_REFUSED)
        addition = None if by_peft else self._request.addition
        if addition is None and by_peft and is_injected(model):  # peft's add_adapter: a fresh one, same sites
            if config.injection is not None:  # a saved adapter beside a loaded one: checked as the first is
                check_added_record(model, own, config.injection, "adapter config", by_path=True)
            owner, _ = injected_owner(model, "add_adapter")
            addition = plan_addition(owner, own, adapter_name, f"add_adapter({adapter_name!r})")
        if addition is not None:
            self._addition = addition
            runs = by_peft and self._fresh  # a new tuner runs its adapter, as LoRA's `inject_adapter_in_model`,
            existing = [(p, p.requires_grad) for p in addition.owner.parameters()] if runs else []
            try:  # over the injected model itself: its paths are the sites'
                super().inject_adapter(addition.owner, adapter_name, autocast_adapter_dtype=autocast_adapter_dtype)
                finish_addition(addition)
                if runs:
                    switch_adapter(addition.owner, adapter_name, trains=not config.inference_mode)
                    for p, flag in existing:  # and leaves the flags of what was there (peft's rule for an addition)
                        p.requires_grad_(flag)
            except BaseException:
                undo_addition(addition)
                raise
            finally:
                self._addition = None
        else:
            self._injection = Injection(own, adapter_name, flags=[(p, p.requires_grad) for p in model.parameters()])
            try:
                super().inject_adapter(model, adapter_name, autocast_adapter_dtype=autocast_adapter_dtype)
                if not self._injection.finished:  # pragma: no cover - peft's loop visits every module
                    raise RuntimeError("PreProjModel: peft's inject_adapter did not reach every planned site")
                run_example(model, self._injection.example_input)
            except BaseException:
                roll_back(model, self._injection)
                raise
            finally:
                self._injection = None
        if by_peft:
            owner, _ = injected_owner(model, "PreProjModel")
            config.injection = injection_of(describe_for_save(owner, adapter_name))  # what it resolved

    def _pre_injection_hook(self, model: nn.Module, config: PreProjConfig, adapter_name: str) -> None:
        """A new tuner over a model that already holds a PREPROJ adapter, for a config read from a folder: that is
        transformers' `model.load_adapter(DIR, adapter_name=...)` (peft's `inject_adapter_in_model`), which then
        loads the file by its keys, and those keys are the active adapter's: its weights would overwrite the
        loaded adapter and leave the new one at its init. Refused before anything changes (peft's `__init__`
        already put the config into the model's `peft_config`: `__init__` puts that record back)."""
        if (
            self._request is None
            and isinstance(config, PreProjConfig)
            and config.injection is not None
            and is_injected(model)
        ):
            raise ValueError(
                f"loading a saved PREPROJ adapter as {adapter_name!r} onto a model that already holds one, through "
                "a new tuner (transformers' model.load_adapter, peft's inject_adapter_in_model): the caller then "
                "loads the file by its keys, over the adapter already there. Load it with peft's "
                "PeftModel.load_adapter(DIR, adapter_name=...) or mmpreproj.load_adapter(model, DIR, "
                "adapter_name=...); nothing was changed"
            )

    def _cast_adapter_dtype(self, adapter_name: str, autocast_adapter_dtype: bool = True) -> None:
        """peft's cast after building an adapter (`get_peft_model`, `add_adapter`, `load_adapter`): the weights stay
        float32 (`autocast_adapter_dtype=True`, peft's default), or with `False` take the floating dtype of the
        attention they sit on (a bfloat16 base: bfloat16 weights), as LoRA's do."""
        if autocast_adapter_dtype:
            return
        for w in injected_modules(self.model):
            dtype = next((p.dtype for p in w.base_layer.parameters() if p.is_floating_point()), None)
            for m in w.slots(adapter_name):
                if m is not None and dtype is not None:
                    m.to(dtype=dtype)

    def _check_tied_modules(self, model: nn.Module, peft_config: PreProjConfig) -> None:
        """peft's check of tied embeddings among `modules_to_save` is about the copy its `ModulesToSaveWrapper`
        trains; ours train the module in place, so a tied weight stays one Parameter: nothing to check."""

    def _prepare_adapter_config(self, peft_config: PreProjConfig, model_config: dict) -> PreProjConfig:
        """The config peft's loop reads from here on: a copy without `modules_to_save` (peft would wrap each
        module whose name ends so in its `ModulesToSaveWrapper`; ours are the host's modules, trained in place:
        `_mark_only_adapters_as_trainable`), except the heads of a classification task that peft's task class
        wraps itself (`PEFT_HEAD_TASKS`: peft's loop wraps them first, as for LoRA), and, for `mmpreproj.inject`,
        without `inference_mode` (`inject` freezes after the loop, `load_adapter` by its `is_trainable`). The hooks
        read the config itself."""
        view = copy.copy(peft_config)
        view.modules_to_save = None if self._request is not None else peft_head_names(peft_config) or None
        if self._request is not None:
            view.inference_mode = False
        return view

    def _prepare_model(self, peft_config: PreProjConfig, model: nn.Module) -> None:
        """peft's first step on the model: the plan (host, sites, wrappers, every check; nothing changed). An
        addition was planned before the loop."""
        if self._addition is not None:
            return
        injection, request = self._injection, self._request or Request()
        if request.plan is not None:
            injection.plan = request.plan
        else:
            if self._request is None:  # under transformers' load_adapter: the weights it will load, any config
                check_transformers_load(self.peft_config[injection.adapter_name], model)
            if self._request is None and injection.config.injection is not None:  # a config read from a file
                check_record_fits(model, injection.config)
            injection.plan, injection.example_input = plan_for(
                model, injection.config, injection.adapter_name, request.host, request.example_input
            )
            if injection.config.modules_to_save and _built_on_meta(w for _, w in injection.plan.placements):
                raise ValueError(LOW_CPU_MODULES_TO_SAVE_REFUSED)  # peft's from_pretrained(low_cpu_mem_usage=True)
        injection.plan.state.peft_config = self.peft_config  # peft's record, the one the model and a PeftModel hold

    def _check_target_module_exists(self, peft_config: PreProjConfig, key: str) -> bool:
        """Whether module `key` is a site of the injection: planned (in peft's loop) or injected."""
        if self._addition is not None:
            return key in self._addition.modules
        if self._injection is not None:
            return key in self._injection.sites
        return is_injected(self.model) and key in injected_owner(self.model, "PreProjModel")[1].modules

    def _create_and_replace(
        self,
        peft_config: PreProjConfig,
        adapter_name: str,
        target: nn.Module,
        target_name: str,
        parent: nn.Module,
        current_key: str,
        parameter_name: str | None = None,
    ) -> None:
        """Put the planned wrapper of site `current_key` in place of `target`; once every planned site holds
        its wrapper, finish the injection (seam checks, the state). An addition puts its
        modules into the wrapper already there (`update_layer`)."""
        if self._addition is not None:
            if not isinstance(target, PreProjAttention):  # pragma: no cover - the sites are the wrappers
                raise RuntimeError(f"PreProjModel: module {current_key!r} is not an injected attention")
            place_added(self._addition, current_key, target)
            return
        injection = self._injection
        site, wrapper = injection.sites[current_key]
        if target is not site.attention or parent is not site.parent or target_name != site.attr:
            raise RuntimeError(f"PreProjModel: module {current_key!r} is not the attention the plan wraps there")
        place(injection, site, wrapper)
        if len(injection.placed) == len(injection.plan.placements):
            finish(self.model, injection.plan)
            injection.finished = True

    def _mark_only_adapters_as_trainable(self, model: nn.Module) -> None:
        """peft's freeze after the loop: the base frozen (`config.freeze_base`), the adapter and the config's
        `modules_to_save` left trainable (frozen where peft's `inference_mode` froze the adapter); each flag
        changed is recorded, so `unload` puts it back. Outside a first injection there is nothing to do: an
        added adapter is built frozen (`adapters.plan_addition`)."""
        if self._injection is not None:
            mark_trainable(model, self._injection.plan)

    # -- adapters ------------------------------------------------------------------------------------
    def set_adapter(self, adapter_name: str | list[str], inference_mode: bool = False) -> None:
        """Make one loaded adapter the one that runs: `peft.functional.set_adapter` over the model (every wrapper
        and peft's head wrappers, as `BaseTuner.set_adapter`), after our checks and the `modules_to_save` values'
        swap (`adapters.switch_adapter`); it trains unless `inference_mode`, and the others are frozen (peft's rule,
        as for LoRA). peft's loop calls it at its end with the adapters already active: in a first injection the
        flags are then the plan's (`_mark_only_adapters_as_trainable`), after an addition nothing changes (the
        added one waits, frozen)."""
        if self._addition is not None:
            return
        names = [adapter_name] if isinstance(adapter_name, str) else list(adapter_name)
        if len(names) != 1:
            raise ValueError(f"set_adapter({names}): {ONE_ADAPTER_PER_FORWARD}")
        trains = None if self._injection is not None else not inference_mode
        switch_adapter(self.model, names[0], trains=trains, scope=self.model)
        self.active_adapter = names[0]
        if inference_mode:
            self.set_requires_grad(names[0], requires_grad=False)

    def set_requires_grad(self, adapter_names: str | Sequence[str], requires_grad: bool = True) -> None:
        """Make the named adapters' weights trainable or frozen, active or not (peft's rule, as for LoRA: a loaded
        adapter with `is_trainable=True` waits trainable); the active one's `modules_to_save` and peft's head
        wrappers follow. ValueError for a name not loaded (nothing changed)."""
        names = [adapter_names] if isinstance(adapter_names, str) else list(adapter_names)
        owner, state = injected_owner(self.model, "set_requires_grad")
        loaded = loaded_adapters(owner)
        unknown = sorted(set(names) - set(loaded))
        if unknown:
            raise ValueError(
                f"set_requires_grad({names}): {unknown} are not loaded adapters ({loaded}); nothing was changed"
            )
        for w in injected_modules(owner):
            w.set_requires_grad(names, requires_grad=requires_grad)
        if active_name(owner) in names:
            set_adapter_trainable(owner, requires_grad)
        set_requires_grad(self.model, names, requires_grad=requires_grad)  # peft's head wrappers (ours: no-ops)

    def delete_adapter(self, adapter_name: str) -> None:
        """peft's `delete_adapter`, through `peft.functional.delete_adapter` over the model (the wrappers and peft's
        head wrappers, `adapters.remove_adapter`): the active adapter hands over to the first of the others by
        name, which then trains (peft's rule, with peft's warning); after the last one the host runs alone, as a
        LoRA model without adapters (`unload` takes the wrappers off). A name not loaded is refused before anything
        changes."""
        owner, _ = injected_owner(self.model, "delete_adapter")
        name, _ = named_adapter(owner, check_adapter_name(adapter_name))
        others = sorted(n for n in loaded_adapters(owner) if n != name)
        if name == active_name(owner) and others:
            warnings.warn(
                f"Adapter {name} was active which is now deleted. Setting active adapter to {others[0]}.",
                stacklevel=2,
            )
            self.set_adapter(others[0])
        remove_adapter(self.model, name, scope=self.model)
        self.peft_config.pop(name, None)
        # peft's `BaseTuner.delete_adapter`: the record follows the layers (they may run another adapter than the
        # record says after a per-layer `peft.functional.set_adapter`); none left: no active adapter
        self.active_adapter = active_name(owner) or []

    def disable_adapter_layers(self) -> None:
        self._enable_adapter_layers(False)

    def enable_adapter_layers(self) -> None:
        self._enable_adapter_layers(True)

    def _enable_adapter_layers(self, enabled: bool = True) -> None:
        """peft's switch of every layer (`disable_adapter()`); off, our `modules_to_save` hold the base's values, as
        LoRA's wrapper runs its original module (`state_dict.base_modules_in`)."""
        for w in (*injected_modules(self.model), *peft_heads(self.model).values()):
            w.enable_adapters(enabled)
        for _, owner in injected_owners(self.model):
            base_modules_in(owner, not enabled)

    @contextlib.contextmanager
    def _enable_peft_forward_hooks(self, *args: Any, **kwargs: Any) -> Iterator[None]:
        """`forward(adapter_names=[...])` and `generate(adapter_names=[...])` (peft's mixed batches): each row runs
        through its own adapter ("__base__": none); every wrapper gets the names through a forward pre-hook, as LoRA's
        layers do; under beam search each name covers its prompt's beams, and an encoder-decoder's encoder gets the
        names as passed, as peft does for LoRA (`layer.hand_mixed_names`)."""
        names = kwargs.pop("adapter_names", None)
        if names is None:
            yield
            return
        wrappers = (*injected_modules(self.model), *peft_heads(self.model).values())
        rows, handles = hand_mixed_names(self.model, wrappers, names, self.peft_config, kwargs)
        # the count is checked where the batch is seen (peft's task classes keep input_ids out of these kwargs)
        check = partial(_check_batch, rows, beam_copies(kwargs))
        handles.append(self.model.register_forward_pre_hook(check, with_kwargs=True))
        try:
            yield
        finally:
            for h in handles:
                h.remove()

    def add_weighted_adapter(self, *args: Any, **kwargs: Any) -> None:
        """peft's weighted combination of adapters (LoRA's): refused with the reason."""
        raise ValueError(
            "add_weighted_adapter: a weighted sum of PREPROJ adapters' weights is no weighted combination of what "
            "they do (the pre-projection x^ + W_down SiLU(W_up x^) is nonlinear, and it feeds the attention that the "
            "skip reads). Run the adapters one at a time (set_adapter) or per row (forward(adapter_names=[...]))"
        )

    # -- merge / unload ------------------------------------------------------------------------------
    def merge_adapter(self, *args: Any, **kwargs: Any) -> None:
        raise ValueError(f"merge_adapter: {MERGE_REFUSED}")

    def merge_and_unload(self, *args: Any, **kwargs: Any) -> nn.Module:
        raise ValueError(f"merge_and_unload: {MERGE_REFUSED}")

    def _check_merge_allowed(self) -> None:
        raise ValueError(MERGE_REFUSED)

    def unload(self) -> nn.Module:
        """Remove the modules and return the base model as it was before injection (a head peft wrapped for a
        classification task gets its original module back, and peft's `peft_config` record comes off the model, as
        peft's `unload` gives the base)."""
        model = unload(self.model)
        for path, wrapper in peft_heads(model).items():
            parent, _, attr = path.rpartition(".")
            setattr(model.get_submodule(parent), attr, wrapper.original_module)
        if "peft_config" in vars(model):  # peft's BaseTuner._unload_and_optionally_merge does the same
            del model.peft_config
        return model

    # -- state dict (peft's hooks, called by get/set_peft_model_state_dict) ----------------------------
    @classmethod
    def _get_adapter_state_dict(
        cls,
        model: nn.Module,
        config: PreProjConfig,
        adapter_name: str,
        state_dict: dict[str, torch.Tensor],
        unwanted_adapter_names: list[str],
    ) -> dict[str, torch.Tensor]:
        """Adapter `adapter_name`'s weights taken from `state_dict` (the caller's: a Trainer's gathered full state
        dict under FSDP2 / ZeRO-3, saved by the main process alone; or peft's `model.state_dict()`), keyed as the
        model keys them, the adapter name still in (peft removes it, `_remove_adapter_name_from_key`); an inactive
        adapter's `modules_to_save` values come from the injection state. The live weights are never read
        (sharded, they would need a collective on one rank: a deadlock); only FSDP2 shards in `state_dict`
        itself are gathered (`state_dict.adapter_tensors_from_state_dict`)."""
        owner, state = injected_owner(model, "get_peft_model_state_dict")
        prefix = owner_prefix(model, owner)
        try:
            tensors = adapter_tensors_from_state_dict(owner, adapter_name, state_dict, prefix)
        except ValueError as e:
            raise ValueError(f"get_peft_model_state_dict({adapter_name!r}): {e}") from None
        desc = describe_for_save(owner, adapter_name, tensors)
        # fresh facts for the config file peft writes next (after the weights: the digest pairs the two), with the
        # shapes of the heads peft saves beside them (`file_check.HEAD_SHAPES_KEY`), checked on load before it injects
        config.injection = {**injection_of(desc), DIGEST_KEY: weights_digest(tensors)}
        heads = _head_shapes(model, adapter_name)
        if heads:
            config.injection[HEAD_SHAPES_KEY] = heads
        config.format_version = ADAPTER_FORMAT  # the keys are written as today
        return {f"{prefix}{_named_key(k, state.modules, adapter_name)}": v for k, v in tensors.items()}

    @classmethod
    def _remove_adapter_name_from_key(cls, key: str, adapter_name: str) -> str:
        """`...attention.preproj.{adapter}.up.weight` -> `...attention.preproj.up.weight` (peft's default removes
        the name only where LoRA has it, second to last)."""
        for slot in SLOTS:
            head = f".{slot}.{adapter_name}."
            at = key.rfind(head)
            if at >= 0:
                return f"{key[:at]}.{slot}.{key[at + len(head) :]}"
        return key

    @classmethod
    def _remap_adapter_state_dict_for_load(
        cls, model: nn.Module, config: PreProjConfig, adapter_name: str, state_dict: dict[str, torch.Tensor]
    ) -> dict[str, torch.Tensor]:
        """File keys -> the model's keys (peft's: the adapter name put back), after checking every key, shape,
        dtype and value (nothing is copied from a state dict with one wrong). An inactive adapter's
        `modules_to_save` values go to the injection state, not the model."""
        owner, state = injected_owner(model, "set_peft_model_state_dict")
        where = f"set_peft_model_state_dict({adapter_name!r})"
        heads = tuple(f"{path}." for path in peft_heads(model))
        passed = {k: v for k, v in state_dict.items() if k.startswith(heads)}  # peft's head wrappers: peft loads them
        state_dict = {k: v for k, v in state_dict.items() if k not in passed}
        tensors = {k.removeprefix(PEFT_PREFIX): v for k, v in state_dict.items()}
        tensors = model_keys(tensors, injected_paths(owner), state.modules_to_save)  # older files: convert.py
        # every key, shape, dtype and value before peft copies any (a Trainer's resume reads no config)
        check_tensors_match(
            named_adapter_tensors(owner, adapter_name),
            tensors,
            f"{where}: the weights do not match this adapter (another method's or another size's checkpoint?)",
        )
        refuse_non_finite(tensors, where)
        prefix = owner_prefix(model, owner)
        out = {}
        for key, value in tensors.items():
            if is_slot_key(key):
                out[f"{prefix}{_named_key(key, state.modules, adapter_name)}"] = value
            elif adapter_name == active_name(owner):
                out[f"{prefix}{key}"] = value
            else:
                stored = state.stored_modules[adapter_name]
                stored[key] = value.to(device=stored[key].device, dtype=stored[key].dtype).clone()
        return {**out, **passed}


def _without_peft_heads(config: PreProjConfig) -> PreProjConfig:
    """`config` as this tuner injects it under peft: without the heads peft wraps itself (`peft_head_names`)."""
    if not peft_head_names(config):
        return config
    own = copy.copy(config)
    own.modules_to_save = None
    return own


def _head_shapes(model: nn.Module, adapter_name: str) -> dict[str, list[int]]:
    """{file key less `PEFT_PREFIX`: shape} of adapter `adapter_name`'s copy of each head peft wraps in `model`
    (`peft_heads`), as peft writes them (`score.modules_to_save.{name}.weight` -> `score.weight`); shapes only, so
    a sharded copy is never gathered."""
    out = {}
    for path, wrapper in peft_heads(model).items():
        copies = getattr(wrapper, "modules_to_save", None)
        if isinstance(copies, nn.ModuleDict) and adapter_name in copies:
            for k, v in copies[adapter_name].state_dict().items():
                out[f"{path}.{k}".removeprefix(PEFT_PREFIX)] = list(v.shape)
    return dict(sorted(out.items()))


def _built_on_meta(wrappers: Iterable[PreProjAttention]) -> bool:
    """Whether the planned wrappers' weights were made on the meta device: peft builds the tuner under accelerate's
    `init_empty_weights` for a `low_cpu_mem_usage=True` load, whose file tensors then take the weights' place;
    seen on the plan, before any wrapper is placed."""
    return any(p.is_meta for w in wrappers for m in w.slots() if m is not None for p in m.parameters())


def _check_batch(names: list[str], repeat: int, module: nn.Module, args: tuple, kwargs: dict) -> None:
    """Forward pre-hook of the tuned model: a mixed batch names one adapter per row of its input."""
    batch = next((kwargs[k] for k in ("input_ids", "inputs_embeds") if kwargs.get(k) is not None), None)
    if batch is None and args and isinstance(args[0], torch.Tensor):
        batch = args[0]
    if batch is not None and batch.dim() >= 2 and batch.shape[0] != len(names):
        each = f" (each repeated {repeat}x for generate)" if repeat > 1 else ""
        raise ValueError(
            f"forward(adapter_names=...): {len(names) // repeat} names{each} for a batch of "
            f"{batch.shape[0] // repeat} rows; pass one adapter name per row"
        )


def _named_key(key: str, paths: list[str], adapter_name: str) -> str:
    """A checked slot key `{path}.{slot}.{param}` as peft keys it, `{path}.{slot}.{adapter_name}.{param}`; any
    other key (a `modules_to_save` one) as it is."""
    if not is_slot_key(key):
        return key
    path = max((p for p in paths if key.startswith(f"{p}.")), key=len)
    slot, _, param = key[len(path) + 1 :].partition(".")
    return f"{path}.{slot}.{adapter_name}.{param}"
