"""mmpreproj: position-agnostic pre-projection and content skip for transformer attention, as a peft method.

    model = peft.get_peft_model(model, mmpreproj.PreProjConfig())   # arXiv 2604.10791, eq. (1)-(5)
    model.print_trainable_parameters(); model.save_pretrained("run/adapter")
    mmpreproj.inject(model, mmpreproj.PreProjConfig())              # the same, in place (no PeftModel)
    mmpreproj.save_pretrained(model, "run/full")                    # the base + adapter/ (whole-model folder)
    print(mmpreproj.estimate(mmpreproj.PreProjConfig(skip_rank=16), "llama-3-8b"))  # cost before loading

Importing mmpreproj registers peft_type "PREPROJ" with peft (`method/register.py`), so peft's loaders
(`PeftModel.from_pretrained`, `AutoPeftModelForCausalLM`, transformers' `load_adapter`) read its adapters.

Importing it also drops two known messages of its dependencies' loggers by their exact text (`util.quiet`).
"""

from .util import quiet as _quiet

_quiet.install()  # before peft imports torchao / bitsandbytes, which log them

from . import hosts, rope
from .method import PreProjModel
from .method.adapters import active_adapter, adapter_names, delete_adapter, set_adapter
from .method.apply import adapter_disabled, unload
from .method.config import PreProjConfig
from .method.estimate import Estimate, TrainableReport, estimate, trainable_report
from .method.files import save_adapter
from .method.inject import inject
from .method.layer import PreProjAttention
from .method.load import load_adapter
from .method.pretrained_load import from_pretrained
from .method.pretrained_save import save_pretrained
from .method.resume import last_whole_checkpoint
from .method.state import injected_modules, is_injected
from .method.state_dict import adapter_state_dict, set_adapter_state_dict
from .modules import ContentSkip, PreProjection
from .rope import MultimodalRoPE, RoPE1D, RoPE2D, RoPE3D, RotaryEncoder, grid_positions, multimodal_positions
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
