"""The method as a peft tuner, in peft's layout: `config` (PreProjConfig), `model` (PreProjModel, the tuner),
`keys` (the file layout and its converter), `register` (peft learns PREPROJ at `import mmpreproj`). The layer
is the wrapper, `mmpreproj.modules.PreProjAttention` (its slots: `preproj`, `skip`)."""

from .config import PreProjConfig
from .model import MERGE_REFUSED, PreProjModel
from .peft_type import PREPROJ
from .register import register_preproj
from .trace import trace_seams

__all__ = ["MERGE_REFUSED", "PREPROJ", "PreProjConfig", "PreProjModel", "register_preproj", "trace_seams"]

register_preproj()
