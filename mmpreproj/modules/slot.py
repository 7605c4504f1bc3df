"""peft's tuner-layer interface for the attention wrapper (`PeftLayerMethods`), and its view on the slot modules
(`TunerSlot`).

The wrapper keeps one `nn.ModuleDict` per adapter slot, keyed by adapter name (`adapter_layer_names`, as LoRA's
`lora_A[adapter]`), so peft's own layer methods apply unchanged: `PeftLayerMethods` binds `BaseTunerLayer`'s
functions (set_adapter, set_requires_grad, delete_adapter, active adapters, ...) and refuses a merge.

Why the wrapper is no `BaseTunerLayer` instance: peft treats everything inside a `BaseTunerLayer` as that
layer's internals. A LoRA put on top of an injected model (method "preproj_lora") must reach the attention's
projections inside the wrapper's `base_layer`, but peft's `inject_adapter` skips every module under a tuner
layer, and its `unload()` visits none of them (`peft.tuners.tuners_utils`, `existing_adapter_prefixes`,
`_unload_and_optionally_merge`). The PREPROJ tuner (`tuner.PreProjModel`, `tuner_layer_cls = PreProjAttention`)
finds its layers by their class instead.

What peft reads by `isinstance(module, BaseTunerLayer)` (`get_model_status`, `disable_adapter()`) it finds on the
slot modules (`TunerSlot`): each says which adapter it belongs to, whether that adapter runs and is enabled, as
its wrapper set it. peft's per-layer calls that reach a slot come from another tuner on top (a LoRA switching,
enabling or merging its own adapters): they are not about this adapter, so a slot leaves them to that tuner.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from peft.tuners.tuners_utils import BaseTunerLayer
from torch import nn

MERGE_REFUSED = (
    "the pre-projection x~ = x^ + W_down SiLU(W_up x^) is nonlinear, so it cannot be folded into the host's "
    "Q/K/V weights, and the content skip adds a term beside attention: there is nothing to merge. Keep the "
    "adapter at inference (no K/V-cache cost), or use unload() to get the base model back"
)
ONE_ADAPTER_PER_FORWARD = (
    "PREPROJ runs one adapter per forward: two pre-projections would feed one into the other and two skips would "
    "add up, a model no adapter was trained as. Pass one name, or run a mixed batch (forward(..., "
    "adapter_names=[one name per row]))"
)


class PeftLayerMethods:
    """peft's per-layer adapter bookkeeping, taken from `BaseTunerLayer` as is (merging is refused)."""

    adapter_layer_names: tuple[str, ...] = ()
    other_param_names: tuple[str, ...] = ()
    frozen_peft_weight_names: dict[str, tuple[str, ...]] = {}
    merged_adapters: list[str] = []
    _disable_adapters: bool = False
    _active_adapter: str | list[str] = "default"

    active_adapter = BaseTunerLayer.active_adapter
    active_adapters = BaseTunerLayer.active_adapters
    disable_adapters = BaseTunerLayer.disable_adapters
    merged = BaseTunerLayer.merged
    _get_available_adapters = BaseTunerLayer._get_available_adapters
    _all_available_adapter_names = BaseTunerLayer._all_available_adapter_names
    set_requires_grad = BaseTunerLayer.set_requires_grad
    delete_adapter = BaseTunerLayer.delete_adapter

    def _freeze_non_trainable_peft_weights(self, adapter_names: str | Sequence[str] | None = None) -> None:
        """peft's `set_requires_grad` / `delete_adapter` (borrowed above) call it to re-freeze the weights a layer
        declares frozen (`frozen_peft_weight_names`); this layer declares none, so there is nothing to do (our own
        rather than peft's private method, which peft 0.20 added)."""

    def merge(self, safe_merge: bool = False, adapter_names: list[str] | None = None) -> None:
        raise ValueError(f"merge: {MERGE_REFUSED}")

    def _move_adapter_to_device_of_base_layer(self, adapter_name: str, device: torch.device | None = None) -> None:
        """Move adapter `adapter_name`'s slot modules to `device`, else to the base layer's device; their dtype stays
        (peft would cast them to the base's: ours keep their own). peft calls it after a `low_cpu_mem_usage=True`
        load, which puts the file's tensors in place of the weights, on the device it loaded them to."""
        base = self.get_base_layer()
        target = torch.device(device) if device is not None else next((t.device for t in base.parameters()), None)
        if target is None or target.type == "meta":
            return
        for slot in self.adapter_layer_names:
            modules = getattr(self, slot)
            if adapter_name in modules:
                modules[adapter_name].to(target)

    def unmerge(self) -> None:
        raise ValueError(f"unmerge: nothing is ever merged ({MERGE_REFUSED})")


class TunerSlot(BaseTunerLayer):
    """Mixin of a slot module: peft's status view of the adapter it belongs to (set by its wrapper)."""

    adapter_layer_names: tuple[str, ...] = ("status_view",)  # what peft's status reads (requires_grad, devices)
    adapter_name: str = "default"  # the key of this module in its wrapper's slot dict
    layer_active: tuple[str, ...] = ("default",)  # the wrapper's active adapter(s), as peft's status reads a layer

    @property
    def status_view(self) -> nn.ModuleDict:
        """This slot as peft reads a layer's adapters (`get_layer_status`: each adapter's `requires_grad` and
        devices): {its adapter's name: itself}. A fresh dict each time, registered nowhere: the slot's own modules
        and keys are unchanged."""
        return nn.ModuleDict({self.adapter_name: self})

    @property
    def active_adapter(self) -> str | list[str]:
        return list(self.layer_active)

    def _get_available_adapters(self) -> set[str]:
        return {self.adapter_name}

    # another tuner's layer calls (see the module docstring): the wrapper switches this adapter
    def enable_adapters(self, enabled: bool) -> None:
        pass

    def set_adapter(self, adapter_names: str | list[str], inference_mode: bool = False) -> None:
        pass

    def delete_adapter(self, adapter_name: str) -> None:
        pass

    def set_requires_grad(self, adapter_names: str | Sequence[str], requires_grad: bool = True) -> None:
        pass

    def merge(self, safe_merge: bool = False, adapter_names: list[str] | None = None) -> None:
        pass  # a LoRA on top merges its own layers; nothing of ours merges (MERGE_REFUSED)

    def _move_adapter_to_device_of_base_layer(self, adapter_name: str, device: torch.device | None = None) -> None:
        pass  # a slot has no base layer: its wrapper moves it (`PeftLayerMethods`)

    def unmerge(self) -> None:
        pass
