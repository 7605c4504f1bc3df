"""The method as a peft tuner.

peft's layout: `config` (PreProjConfig), `model` (PreProjModel, the tuner), `keys` (the adapter config's file
layout and the description saved with the weights), `legacy` (the one reader of older layouts), `register`
(peft learns PREPROJ at `import mmpreproj`). The layer is the wrapper, `mmpreproj.modules.PreProjAttention`: one
`nn.ModuleDict` per slot keyed by adapter name (`adapter_layer_names`: `preproj`, `preproj_skip`); the model's
`state_dict()` keys, without the adapter name, are the file keys. One injection path: peft's
`BaseTuner.inject_adapter` loop, whose hooks in `PreProjModel` take the steps of `apply` from the host plan.
Bottom to top (each file imports only those before it): `state` (what an injection leaves on a model),
`state_dict`, `keys`, `plan` (validate and build), `trace` (`trace_seams`: the host trace checked by
an identity injection), `apply` (plan, place, finish, freeze, roll back), `unload` (unload, `adapter_disabled`),
`named` (several adapters), `model` (the tuner); beside them `unwrap`, `estimate` and the check `load_check`.

Nothing here writes an adapter folder itself (peft does, with `PreProjConfig.save_pretrained` for the config)
or patches a model instance. Above the tuner, our own API over it
(`mmpreproj.folders`): `inject` (peft's `inject_adapter_in_model` with our host plan), the
writers and readers of adapter and whole-model folders, the one loader of any trained folder, `preproj_lora`'s
folder, `from_pretrained`. Below it: the checks of a folder's files alone (`digest`, `file_check`) and its model
card in `mmpreproj.adapter_files`, the counts `budget` and `report` in `mmpreproj.sizing`, the trace itself, its
input builder and the one call's host in `mmpreproj.hosts` (`trace`, `example_input`, `auto_host`).
"""

from .config import PreProjConfig as PreProjConfig
from .model import MERGE_REFUSED as MERGE_REFUSED
from .model import PreProjModel as PreProjModel
from .peft_type import PREPROJ as PREPROJ
from .register import register_preproj as register_preproj
from .state import injected_modules as injected_modules
from .state import is_injected as is_injected
from .state_dict import adapter_state_dict as adapter_state_dict
from .state_dict import set_adapter_state_dict as set_adapter_state_dict
from .trace import trace_seams as trace_seams
from .unload import adapter_disabled as adapter_disabled
from .unload import unload as unload

register_preproj()
