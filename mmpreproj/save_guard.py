"""A removable guard: `save_pretrained` of an injected transformers model refuses instead of writing a
checkpoint that `from_pretrained` would reload as a different model.

Why: the wrappers rename the attention weights (`attention.base_layer.query_key_value...`), so the base's
own `from_pretrained` finds none of them and initialises attention afresh (only a warning table says so).
`inject` patches `save_pretrained` on the instance and `unload` takes the patch off again; the class and
every other model are untouched. A real round trip can replace this module later.
"""

from __future__ import annotations

import types
from typing import Any

from torch import nn

__all__ = ["SAVE_PRETRAINED_MESSAGE", "guard_save_pretrained", "unguard_save_pretrained"]

SAVE_PRETRAINED_MESSAGE = (
    "save_pretrained of a model with mmpreproj modules injected would write a checkpoint that from_pretrained "
    "reloads with freshly initialised attention. Save the adapter with mmpreproj.save_adapter(model, ADAPTER_DIR); "
    "for the base, call mmpreproj.unload(model) and then model.save_pretrained(BASE_DIR). Reload with "
    "mmpreproj.load_adapter(AutoModel....from_pretrained(BASE_DIR), ADAPTER_DIR)."
)


def _refuse_save_pretrained(self: nn.Module, *args: Any, **kwargs: Any) -> None:
    raise RuntimeError(SAVE_PRETRAINED_MESSAGE)


def guard_save_pretrained(model: nn.Module) -> None:
    """Make `model.save_pretrained(...)` raise, if its class has one and the instance does not override it."""
    if callable(getattr(type(model), "save_pretrained", None)) and "save_pretrained" not in vars(model):
        model.save_pretrained = types.MethodType(_refuse_save_pretrained, model)


def unguard_save_pretrained(model: nn.Module) -> None:
    """Take off what `guard_save_pretrained` put on (and nothing else)."""
    patched = vars(model).get("save_pretrained")
    if isinstance(patched, types.MethodType) and patched.__func__ is _refuse_save_pretrained:
        del model.save_pretrained
