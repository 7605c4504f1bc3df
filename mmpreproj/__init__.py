"""mmpreproj: position-agnostic pre-projection and content skip for transformer attention.

    model = mmpreproj.inject(model, mmpreproj.PreProjConfig())   # arXiv 2604.10791, eq. (1)-(5)
    print(mmpreproj.trainable_report(model))
    print(mmpreproj.estimate(mmpreproj.PreProjConfig(skip_rank=16), "llama-3-8b"))  # cost before loading
    mmpreproj.save_adapter(model, "run/adapter"); mmpreproj.unload(model)
"""

from . import hosts, rope
from .adapter import (
    adapter_disabled,
    adapter_state_dict,
    inject,
    injected_modules,
    is_injected,
    load_adapter,
    save_adapter,
    set_adapter_state_dict,
    unload,
)
from .config import PreProjConfig
from .estimate import Estimate, estimate
from .modules import ContentSkip, PreProjAttention, PreProjection
from .named_adapters import active_adapter, adapter_names, delete_adapter, set_adapter
from .pretrained import from_pretrained
from .report import TrainableReport, trainable_report
from .rope import MultimodalRoPE, RoPE1D, RoPE2D, RoPE3D, RotaryEncoder, grid_positions, multimodal_positions
from .version import __version__

__all__ = [
    "ContentSkip",
    "Estimate",
    "MultimodalRoPE",
    "PreProjAttention",
    "PreProjConfig",
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
    "load_adapter",
    "multimodal_positions",
    "rope",
    "save_adapter",
    "set_adapter",
    "set_adapter_state_dict",
    "trainable_report",
    "unload",
]
