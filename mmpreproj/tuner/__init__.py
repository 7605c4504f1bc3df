"""The method as a peft tuner, and the injection it drives.

peft's layout: `config` (PreProjConfig), `model` (PreProjModel, the tuner), `keys` (the adapter config's file
layout), `legacy` (the one reader of older layouts), `register` (peft learns PREPROJ at `import mmpreproj`). The
layer is the wrapper, `mmpreproj.modules.PreProjAttention`: one `nn.ModuleDict` per slot keyed by adapter name
(`adapter_layer_names`: `preproj`, `preproj_skip`); the model's `state_dict()` keys, without the adapter name,
are the file keys. One injection path: peft's `BaseTuner.inject_adapter` loop, whose hooks in `PreProjModel` take
the steps of `apply` from the host plan; `inject` (and `peft.inject_adapter_in_model`, `get_peft_model`) builds
that tuner. Bottom to top (each file imports only those before it): `state` (what inject leaves on a model),
`in_flight`, `state_dict`, `files` (save / read an adapter folder), `plan` (validate and build), `pretrained`
(`save_pretrained`: an injected model's whole folder), `trace` (`trace_seams`: the host trace checked by an
identity injection), `apply` (plan, place, finish, freeze, roll back), `unload` (unload, `adapter_disabled`),
`named` (several adapters), `model` (the tuner), `inject`; beside them `unwrap`, `estimate` and the
check `load_check`. Above the tuner, the trained folders (`mmpreproj.folders`: which loader a folder needs, our
folder into a model, `preproj_lora`'s one folder, `from_pretrained`, the newest Trainer checkpoint). Below it:
the checks of a folder's files alone (`digest`, `file_check`) and its model card in `mmpreproj.adapter_files`,
the counts `budget` and `report` in `mmpreproj.sizing`, the trace itself, its input builder and the one call's
host in `mmpreproj.hosts` (`trace`, `example_input`, `auto_host`).
"""

from .config import PreProjConfig as PreProjConfig
from .files import (
    ADAPTER_CONFIG_NAME as ADAPTER_CONFIG_NAME,
)
from .files import (
    ADAPTER_WEIGHTS_NAME as ADAPTER_WEIGHTS_NAME,
)
from .files import (
    read_adapter as read_adapter,
)
from .files import (
    save_adapter as save_adapter,
)
from .inject import adapter_disabled as adapter_disabled
from .inject import inject as inject
from .inject import unload as unload
from .model import MERGE_REFUSED as MERGE_REFUSED
from .model import PreProjModel as PreProjModel
from .peft_type import PREPROJ as PREPROJ
from .register import register_preproj as register_preproj
from .state import injected_modules as injected_modules
from .state import is_injected as is_injected
from .state_dict import adapter_state_dict as adapter_state_dict
from .state_dict import set_adapter_state_dict as set_adapter_state_dict
from .trace import trace_seams as trace_seams

register_preproj()
