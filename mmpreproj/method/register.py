"""`register_preproj()`: make peft know the method, so peft's loaders read PREPROJ adapters.

Called once by `import mmpreproj`. peft resolves `peft_type` through tables filled at import
(`PEFT_TYPE_TO_CONFIG_MAPPING`, `..._TUNER_MAPPING`, `..._PREFIX_MAPPING`), so a process must import
mmpreproj before peft reads a PREPROJ adapter; otherwise `PeftConfig.from_pretrained` fails with peft's
`KeyError: 'PREPROJ'` (or "Unknown PEFT type"). The tables are peft's public extension point
(`peft.utils.register_peft_method`); the only change beyond it is the enum member (`config.py`, `add_peft_type`).
"""

from __future__ import annotations

from peft.mapping import PEFT_TYPE_TO_CONFIG_MAPPING, PEFT_TYPE_TO_TUNER_MAPPING
from peft.utils import register_peft_method

from .config import PREPROJ, PreProjConfig
from .model import PreProjModel


def register_preproj() -> None:
    """Register PREPROJ with peft (config class, tuner, prefix); a no-op when it already is."""
    if (
        PEFT_TYPE_TO_CONFIG_MAPPING.get(PREPROJ) is PreProjConfig
        and PEFT_TYPE_TO_TUNER_MAPPING.get(PREPROJ) is PreProjModel
    ):
        return
    register_peft_method(name="preproj", config_cls=PreProjConfig, model_cls=PreProjModel, prefix=PreProjModel.prefix)
