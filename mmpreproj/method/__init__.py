"""The method in peft's layout: one folder for everything between the paper's math (`mmpreproj.modules`) and
the hosts (`mmpreproj.hosts`) on one side and the trainer on the other.

    layer.py        PreProjAttention, peft's tuner layer (the wrapper: x~ to the attention, W_skip x~ beside
                    it), and its seam check
    config.py       PreProjConfig (a PeftConfig), PREPROJ in peft's enum, the sizes at a budget
    register.py     peft learns the method at `import mmpreproj`
    state.py        what an injection leaves on a model (`InjectionState`), found through any wrapper
    plan.py         validate and build, the model untouched; `trace_seams`
    apply.py        place, finish, freeze, roll back; `unload`, `adapter_disabled`
    adapters.py     several adapters: add, switch, delete, through peft's record when there is one
    model.py        PreProjModel, the tuner: peft's `inject_adapter` loop driven by the plan
    state_dict.py   the adapter's tensors, keyed as the model keys them without the adapter name
    files.py        the one format (peft's `adapter_config.json` + the `injection` record, the weights file):
                    `save_adapter`, `read_adapter`
    file_check.py   a folder's files checked alone (shapes from the modules' own counts, the digest)
    load_check.py   the `injection` record against the model, and transformers' `load_adapter` before it injects
    convert.py      every older layout -> today's, at read time
    inject.py, load.py, stacked.py, pretrained_save.py, pretrained_load.py, resume.py: the API (`inject`,
                    `load_adapter`, `preproj_lora`'s folder, whole-model folders, the last whole checkpoint)
    estimate.py     `estimate` and `trainable_report`
    model_card.py   the README.md an adapter folder may carry

Nothing here writes a model instance's methods or keeps a global; peft's `peft_config` and each layer's
`active_adapters` are the record of what runs.
"""

from .apply import adapter_disabled as adapter_disabled
from .apply import unload as unload
from .config import PREPROJ as PREPROJ
from .config import PreProjConfig as PreProjConfig
from .model import MERGE_REFUSED as MERGE_REFUSED
from .model import PreProjModel as PreProjModel
from .plan import trace_seams as trace_seams
from .register import register_preproj as register_preproj
from .state import injected_modules as injected_modules
from .state import is_injected as is_injected
from .state_dict import adapter_state_dict as adapter_state_dict
from .state_dict import set_adapter_state_dict as set_adapter_state_dict

register_preproj()
