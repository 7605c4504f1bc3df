"""`PreProjModel`: the peft tuner of the method (peft_type "PREPROJ"), so `peft.get_peft_model(model,
PreProjConfig())` returns a `PeftModel` with the same modules, weights and outputs as `mmpreproj.inject`.

peft's generic tuner finds target modules by name and swaps each for a layer; this method instead finds its
sites through the host table (`mmpreproj.hosts`: parts of a VLM, the norm -> attention seam, described hosts),
so `inject_adapter` hands the model to `inject.inject` (peft's `inject_adapter_in_model` counterpart), and
the multi-adapter calls go to `named.py`. What peft reads back is peft's: `peft_config`,
`active_adapter`, `targeted_module_names`, and a state dict in peft's keys (`tuner/keys.py`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from peft.tuners.tuners_utils import BaseTuner
from torch import nn

from ..modules.wrapper import PreProjAttention
from .config import PreProjConfig
from .digest import DIGEST_KEY, weights_digest
from .files import describe_for_save
from .inject import inject, unload
from .keys import PEFT_PREFIX, block_keys_from_peft, block_keys_to_peft, injection_of
from .load_check import check_added_record, check_record_fits
from .named import add_fresh_adapter, delete_adapter, set_adapter
from .state import injected_modules, is_injected
from .state_dict import (
    adapter_tensors_from_state_dict,
    check_tensors_match,
    named_adapter_tensors,
    refuse_non_finite,
    set_adapter_state_dict,
    trainable_adapter_params,
)
from .unwrap import injected_owner

__all__ = ["FREEZE_BASE_REFUSED", "MERGE_REFUSED", "PreProjModel"]

MERGE_REFUSED = (
    "the pre-projection x~ = x^ + W_down SiLU(W_up x^) is nonlinear, so it cannot be folded into the host's "
    "Q/K/V weights, and the content skip adds a term beside attention: there is nothing to merge. Keep the "
    "adapter at inference (no K/V-cache cost), or use unload() to get the base model back"
)


FREEZE_BASE_REFUSED = (
    "PreProjConfig.freeze_base=False under peft: peft saves only the adapter (and modules_to_save), so the base "
    "weights that would train are lost at every save; keep freeze_base=True and name the base modules to train "
    "in modules_to_save, or use mmpreproj.inject + save_pretrained, which saves the whole model"
)


class PreProjModel(BaseTuner):
    """peft tuner: pre-projection + content skip at every selected attention block (arXiv 2604.10791)."""

    prefix: str = "preproj_"
    tuner_layer_cls = PreProjAttention
    target_module_mapping: dict[str, list[str]] = {}

    # -- injection -------------------------------------------------------------------------------------
    def inject_adapter(
        self,
        model: nn.Module,
        adapter_name: str,
        autocast_adapter_dtype: bool = True,
        low_cpu_mem_usage: bool = False,
        state_dict: dict | None = None,
        **_: Any,
    ) -> None:
        """First adapter: `inject.inject`; a further name (peft's `add_adapter`): a fresh adapter on the same
        sites (`named.add_fresh_adapter`), inactive, as peft leaves an added adapter."""
        config = self.peft_config[adapter_name]
        if not isinstance(config, PreProjConfig):
            raise TypeError(
                f"PreProjModel: peft_config[{adapter_name!r}] is a {type(config).__name__}, expected a PreProjConfig"
            )
        if not config.freeze_base and not config.inference_mode:
            raise ValueError(FREEZE_BASE_REFUSED)
        if is_injected(model):
            if config.injection is not None:  # a saved adapter added beside a loaded one: checked as the first is
                check_added_record(model, config, config.injection, "adapter config", by_path=True)
            add_fresh_adapter(model, adapter_name, config)
        else:
            if config.injection is not None:  # a config read from a file: its record must fit this model
                check_record_fits(model, config)
            inject(model, config, adapter_name=adapter_name)
            if config.inference_mode:
                self.set_requires_grad(adapter_name, requires_grad=False)
        owner, state = injected_owner(model, "PreProjModel")
        self.targeted_module_names = list(state.modules)
        config.injection = injection_of(describe_for_save(owner, adapter_name))  # what it resolved

    def _pre_injection_hook(self, model: nn.Module, config: PreProjConfig, adapter_name: str) -> None:
        """A new tuner over a model that already holds a PREPROJ adapter, for a config read from a folder: that is
        transformers' `model.load_adapter(DIR, adapter_name=...)` (peft's `inject_adapter_in_model`), which then
        loads the file by its keys, and those keys are the active adapter's: its weights would overwrite the
        loaded adapter and leave the new one at its init. Refused before anything changes (peft's `__init__`
        already put the config into the model's `peft_config`; it is taken out again)."""
        if isinstance(config, PreProjConfig) and config.injection is not None and is_injected(model):
            if self.peft_config.get(adapter_name) is config:
                del self.peft_config[adapter_name]
            raise ValueError(
                f"loading a saved PREPROJ adapter as {adapter_name!r} onto a model that already holds one, through "
                "a new tuner (transformers' model.load_adapter, peft's inject_adapter_in_model): the caller then "
                "loads the file by its keys, over the adapter already there. Load it with peft's "
                "PeftModel.load_adapter(DIR, adapter_name=...) or mmpreproj.load_adapter(model, DIR, "
                "adapter_name=...); nothing was changed"
            )

    def _prepare_adapter_config(self, peft_config: PreProjConfig, model_config: dict) -> PreProjConfig:
        return peft_config

    def _create_and_replace(self, *args: Any, **kwargs: Any) -> None:  # pragma: no cover - inject_adapter owns it
        raise NotImplementedError("PreProjModel injects through the host table (inject_adapter), not per name")

    @staticmethod
    def _check_target_module_exists(peft_config: PreProjConfig, key: str) -> bool:  # pragma: no cover
        return False

    def _mark_only_adapters_as_trainable(self, model: nn.Module) -> None:
        """`inject` already froze the base (`freeze_base`) and left the adapter and `modules_to_save` trainable."""

    # -- adapters ------------------------------------------------------------------------------------
    def set_adapter(self, adapter_name: str | list[str], inference_mode: bool = False) -> None:
        names = [adapter_name] if isinstance(adapter_name, str) else list(adapter_name)
        if len(names) != 1:
            raise ValueError(f"set_adapter: one active PREPROJ adapter at a time, got {names}")
        set_adapter(self.model, names[0])
        self.active_adapter = names[0]
        if inference_mode:
            self.set_requires_grad(names[0], requires_grad=False)

    def set_requires_grad(self, adapter_names: str | Sequence[str], requires_grad: bool = True) -> None:
        """Make the active adapter's weights (and `modules_to_save`) trainable or frozen; a stored adapter
        takes the active one's flag when `set_adapter` makes it active."""
        names = [adapter_names] if isinstance(adapter_names, str) else list(adapter_names)
        owner, state = injected_owner(self.model, "set_requires_grad")
        if state.active_adapter in names:
            for p in trainable_adapter_params(owner):
                p.requires_grad_(requires_grad)

    def delete_adapter(self, adapter_name: str) -> None:
        delete_adapter(self.model, adapter_name)
        del self.peft_config[adapter_name]

    def disable_adapter_layers(self) -> None:
        self._enable_adapter_layers(False)

    def enable_adapter_layers(self) -> None:
        self._enable_adapter_layers(True)

    def _enable_adapter_layers(self, enabled: bool = True) -> None:
        for w in injected_modules(self.model):
            w.adapter_enabled = enabled
            for slot in (w.preproj, w.skip):
                if slot is not None:
                    slot._disable_adapters = not enabled  # what peft's model status reads

    @contextlib.contextmanager
    def _enable_peft_forward_hooks(self, *args: Any, **kwargs: Any) -> Iterator[None]:
        """`forward(adapter_names=[...])` (peft's mixed batches): one adapter runs per forward here, so a list
        naming any other adapter than the active one is refused, never ignored."""
        names = kwargs.get("adapter_names")
        if names is not None:
            active = self.active_adapter
            other = sorted({n for n in names if n != active})
            if other:
                raise ValueError(
                    f"forward(adapter_names=...): PREPROJ runs one adapter per forward (the active one, "
                    f"{active!r}); the batch names {other}. Split the batch by adapter and call set_adapter "
                    "between the forwards"
                )
        yield

    # -- merge / unload ------------------------------------------------------------------------------
    def merge_adapter(self, *args: Any, **kwargs: Any) -> None:
        raise ValueError(f"merge_adapter: {MERGE_REFUSED}")

    def merge_and_unload(self, *args: Any, **kwargs: Any) -> nn.Module:
        raise ValueError(f"merge_and_unload: {MERGE_REFUSED}")

    def _check_merge_allowed(self) -> None:
        raise ValueError(MERGE_REFUSED)

    def unload(self) -> nn.Module:
        """Remove the modules and return the base model as it was before injection."""
        return unload(self.model)

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
        """The adapter `adapter_name`'s weights (stored ones too), keyed like the model keys them, taken from
        `state_dict`: the caller's (a Trainer's gathered full state dict under FSDP2 / ZeRO-3, saved by the main
        process alone) or peft's `model.state_dict()`. The live weights are never read (sharded, they would need
        a collective on one rank: a deadlock); only FSDP2 shards in `state_dict` itself are gathered."""
        owner, state = injected_owner(model, "get_peft_model_state_dict")
        prefix = _owner_prefix(model, owner)
        try:
            tensors = adapter_tensors_from_state_dict(owner, adapter_name, state_dict, prefix)
        except ValueError as e:
            raise ValueError(f"get_peft_model_state_dict({adapter_name!r}): {e}") from None
        desc = describe_for_save(owner, adapter_name, tensors)
        # fresh facts for the config file peft writes next (after the weights: the digest pairs the two)
        config.injection = {**injection_of(desc), DIGEST_KEY: weights_digest(block_keys_to_peft(tensors, desc))}
        return block_keys_to_peft(tensors, desc, prefix=prefix)

    @classmethod
    def _remove_adapter_name_from_key(cls, key: str, adapter_name: str) -> str:
        return key  # the adapter name is not in the model's keys: one adapter runs per wrapper

    @classmethod
    def _remap_adapter_state_dict_for_load(
        cls, model: nn.Module, config: PreProjConfig, adapter_name: str, state_dict: dict[str, torch.Tensor]
    ) -> dict[str, torch.Tensor]:
        """peft keys -> the model's keys, after checking every key, shape, dtype and value (nothing is copied
        from a state dict with one wrong). The active adapter loads through peft's `load_state_dict`; a stored
        (inactive) one is written here and nothing is left for peft to load."""
        owner, state = injected_owner(model, "set_peft_model_state_dict")
        desc = describe_for_save(owner, adapter_name)
        where = f"set_peft_model_state_dict({adapter_name!r})"
        tensors = block_keys_from_peft(state_dict, desc, where)
        # every key, shape, dtype and value before peft copies any (a Trainer's resume reads no config)
        check_tensors_match(
            named_adapter_tensors(owner, adapter_name),
            tensors,
            f"{where}: the weights do not match this adapter (another method's or another size's checkpoint?)",
        )
        refuse_non_finite(tensors, where)
        if adapter_name != state.active_adapter:
            set_adapter_state_dict(owner, tensors, adapter_name=adapter_name)
            return {}
        return block_keys_to_peft(tensors, desc, prefix=_owner_prefix(model, owner))


def _owner_prefix(model: nn.Module, owner: nn.Module) -> str:
    """The key prefix of the injected model's weights in `model.state_dict()` ("base_model.model." in a PeftModel)."""
    if owner is model:
        return ""
    name = next(n for n, m in model.named_modules() if m is owner)
    return f"{name}." if name != PEFT_PREFIX.rstrip(".") else PEFT_PREFIX
