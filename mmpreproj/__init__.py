"""mmpreproj: position-agnostic pre-projection and content skip for transformer attention, as a peft method.

    model = peft.get_peft_model(model, mmpreproj.PreProjConfig())   # arXiv 2604.10791, eq. (1)-(5)
    model.print_trainable_parameters(); model.save_pretrained("run/adapter")
    mmpreproj.inject(model, mmpreproj.PreProjConfig())              # the same, in place (no PeftModel)
    mmpreproj.save_pretrained(model, "run/full")                    # the base + adapter/ (whole-model folder)
    print(mmpreproj.estimate(mmpreproj.PreProjConfig(skip_rank=16), "llama-3-8b"))  # cost before loading

Importing mmpreproj registers peft_type "PREPROJ" with peft (`tuner.register`), so peft's loaders
(`PeftModel.from_pretrained`, `AutoPeftModelForCausalLM`, transformers' `load_adapter`) read its adapters.

Importing it also drops two known messages of its dependencies' loggers by their exact text (`util.quiet`).
"""

from .util import quiet as _quiet

_quiet.install()  # before peft imports torchao / bitsandbytes, which log them

from . import hosts, rope
from .folders.adapters import active_adapter, adapter_names, delete_adapter, set_adapter
from .folders.files import save_adapter
from .folders.inject import inject
from .folders.load import load_adapter
from .folders.pretrained_load import from_pretrained
from .folders.pretrained_save import save_pretrained
from .folders.resume import last_whole_checkpoint
from .modules import ContentSkip, PreProjAttention, PreProjection
from .rope import MultimodalRoPE, RoPE1D, RoPE2D, RoPE3D, RotaryEncoder, grid_positions, multimodal_positions
from .sizing.report import TrainableReport, trainable_report
from .tuner import PreProjModel
from .tuner.config import PreProjConfig
from .tuner.estimate import Estimate, estimate
from .tuner.state import injected_modules, is_injected
from .tuner.state_dict import adapter_state_dict, set_adapter_state_dict
from .tuner.unload import adapter_disabled, unload
from .version import __version__

__all__ = [
    "ContentSkip",
    "Estimate",
    "MultimodalRoPE",
    "PreProjAttention",
    "PreProjConfig",
    "PreProjModel",
    "PreProjection",
    "RoPE1D",
    "RoPE2D",
    "RoPE3D",
    "RotaryEncoder",
    "TrainableReport",
    "__version__",
    "active_adapter",
    "adapter_disabled",
    "adapter_names",
    "adapter_state_dict",
    "delete_adapter",
    "estimate",
    "from_pretrained",
    "grid_positions",
    "hosts",
    "inject",
    "injected_modules",
    "is_injected",
    "last_whole_checkpoint",
    "load_adapter",
    "multimodal_positions",
    "rope",
    "save_adapter",
    "save_pretrained",
    "set_adapter",
    "set_adapter_state_dict",
    "trainable_report",
    "unload",
]
