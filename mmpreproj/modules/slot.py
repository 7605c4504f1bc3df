"""`TunerSlot`: peft's tuner-layer interface on the two adapter modules, `PreProjection` and `ContentSkip`.

peft finds a method's layers by `isinstance(module, BaseTunerLayer)` (its model status, `disable_adapter`,
dtype casts) and treats everything inside such a layer as adapter internals that no other tuner may target.
So the tuner layers of PREPROJ are the slot modules, not the wrapper around the host attention: a LoRA on top
(method "preproj_lora") must still reach the attention's projections inside the wrapper's `base_layer`.

peft's per-layer switches (`set_adapter`, `enable_adapters`, `delete_adapter`, `merge`) are no-ops here: another
tuner on top makes them for its own layers, and the PREPROJ tuner (`tuner.PreProjModel`) switches adapters
through `mmpreproj.tuner.named` and disables them on the wrapper (`PreProjAttention.adapter_enabled`).
"""

from __future__ import annotations

from collections.abc import Sequence

from peft.tuners.tuners_utils import BaseTunerLayer

__all__ = ["TunerSlot"]


class TunerSlot(BaseTunerLayer):
    """Mixin: the slot belongs to adapter `adapter_name`; nothing in it merges (the method is nonlinear)."""

    adapter_layer_names: tuple[str, ...] = ()
    adapter_name: str = "default"

    @property
    def active_adapter(self) -> str:
        return self.adapter_name

    def _get_available_adapters(self) -> set[str]:
        return {self.adapter_name}

    def enable_adapters(self, enabled: bool) -> None:
        pass

    def set_adapter(self, adapter_names: str | list[str], inference_mode: bool = False) -> None:
        pass

    def delete_adapter(self, adapter_name: str) -> None:
        pass

    def set_requires_grad(self, adapter_names: str | Sequence[str], requires_grad: bool = True) -> None:
        pass

    def merge(self, safe_merge: bool = False, adapter_names: list[str] | None = None) -> None:
        pass

    def unmerge(self) -> None:
        pass
