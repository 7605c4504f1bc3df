"""The method as a peft tuner, and the injection it wraps.

peft's layout: `config` (PreProjConfig), `model` (PreProjModel, the tuner), `keys` (the file layout and its
converter), `register` (peft learns PREPROJ at `import mmpreproj`). The layer is the wrapper,
`mmpreproj.modules.PreProjAttention` (its slots: `preproj`, `skip`). The injection, bottom to top (each file
imports only those before it): `state` (what inject leaves on a model, the key format), `in_flight`,
`state_dict`, `files` (save / read an adapter folder), `plan` (validate and build), `pretrained`
(`save_pretrained` of an injected model), `inject` (inject / unload), `named` (several adapters), `load_injection`
(our folder into a model), `load` (`load_adapter`: any trained folder, one place that tells them apart),
`trace` (`trace_seams`), `pretrained_load` (`from_pretrained`), `resume` (`last_whole_checkpoint`); beside them
`unwrap`,
`model_card`, `estimate`, `report`.
"""

from .config import PreProjConfig
from .files import ADAPTER_CONFIG_NAME, ADAPTER_WEIGHTS_NAME, read_adapter, save_adapter
from .inject import adapter_disabled, inject, unload
from .load import load_adapter
from .model import MERGE_REFUSED, PreProjModel
from .peft_type import PREPROJ
from .register import register_preproj
from .resume import last_whole_checkpoint
from .state import injected_modules, is_injected
from .state_dict import adapter_state_dict, set_adapter_state_dict
from .trace import trace_seams

__all__ = [
    "ADAPTER_CONFIG_NAME",
    "ADAPTER_WEIGHTS_NAME",
    "MERGE_REFUSED",
    "PREPROJ",
    "PreProjConfig",
    "PreProjModel",
    "adapter_disabled",
    "adapter_state_dict",
    "inject",
    "injected_modules",
    "is_injected",
    "last_whole_checkpoint",
    "load_adapter",
    "read_adapter",
    "register_preproj",
    "save_adapter",
    "set_adapter_state_dict",
    "trace_seams",
    "unload",
]

register_preproj()
