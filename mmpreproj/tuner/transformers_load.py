"""What transformers' `model.load_adapter(DIR)` is about to load, checked before it injects.

transformers builds the config with peft's generic `PeftConfig.from_pretrained` (no folder reaches
`PreProjConfig.from_pretrained`), injects through our tuner, and only then reads the weights by their keys, with
no hook of ours after it. So the tuner, planning the injection, finds that call on the stack (by its code object,
never by a name) and reads its arguments, the folder or the state dict given, to run the checks
`PreProjConfig.from_pretrained` runs on a folder (`config.check_folder_weights`): a bad folder is refused before
anything changes. A hub id is not checked here (transformers downloads the weights after injecting), as peft's.

    check_transformers_load(config)   # in the tuner's `_prepare_model`, for a config read from a file
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from .config import PreProjConfig, check_folder_weights, check_saved_weights


def check_transformers_load(config: PreProjConfig) -> None:
    """When this injection runs inside transformers' `load_adapter`: ValueError naming the file unless the weights
    it will load (the local folder's, or `adapter_state_dict`) are the ones `config` was saved with."""
    call = _load_adapter_call()
    if call is None:
        return
    state_dict, folder, load_config = (
        call.get("adapter_state_dict"),
        call.get("peft_model_id"),
        call.get("load_config"),
    )
    if state_dict is not None:
        check_saved_weights(config, dict(state_dict), "adapter_state_dict")
        return
    download = getattr(load_config, "download_kwargs", None) or {}
    path = Path(str(folder), download.get("subfolder") or "") if folder is not None else None
    if path is None or not path.is_dir():  # a hub id
        return
    if getattr(load_config, "use_safetensors", None) is False:
        raise ValueError(
            f"load_adapter({str(folder)!r}, use_safetensors=False): a PREPROJ folder's weights are its "
            "adapter_model.safetensors, checked before anything is injected; load without use_safetensors=False "
            "(nothing was loaded)"
        )
    check_folder_weights(config, path)


def _load_adapter_call() -> dict[str, Any] | None:
    """The arguments of the transformers `load_adapter` call on the stack (its `PeftAdapterMixin` method, found by
    its code object; the module looked up in `sys.modules`, never imported), else None."""
    mixin = getattr(sys.modules.get("transformers.integrations.peft"), "PeftAdapterMixin", None)
    code = getattr(getattr(mixin, "load_adapter", None), "__code__", None)
    if code is None:
        return None
    frame = sys._getframe(1)
    try:
        while frame is not None:
            if frame.f_code is code:
                names = ("peft_model_id", "adapter_state_dict", "load_config")
                return {k: frame.f_locals.get(k) for k in names}
            frame = frame.f_back
    finally:
        del frame  # no reference cycle through the frames
    return None
