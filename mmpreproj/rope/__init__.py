"""Rotary position encoders sharing one call convention: `q2, k2 = rope(q, k, pos, num_prefix_tokens=0)`.

- `RoPE1D`: token index (GPT-NeoX partial rotary, Llama, GPT-J interleaved).
- `RoPE2D`: image rows and columns (timm axial RoPE).
- `RoPE3D`: video (t, h, w) (diffusers / CogVideoX).
- `MultimodalRoPE`: Qwen2-VL M-RoPE over positions from `multimodal_positions`;
  `InterleavedMultimodalRoPE` / `make_mrope(layout=...)`: Qwen3-VL's interleaved layout.
"""

from .apply import PAIRINGS, Pairing, apply_rotary, expand_pairs
from .base import RotaryEncoder, RotaryLike
from .layouts import MROPE_LAYOUTS, InterleavedMultimodalRoPE, default_sections, make_mrope
from .mrope import MultimodalRoPE
from .positions import SEGMENT_KINDS, grid_positions, multimodal_positions
from .rope1d import RoPE1D
from .rope2d import RoPE2D
from .rope3d import RoPE3D

__all__ = [
    "MROPE_LAYOUTS",
    "InterleavedMultimodalRoPE",
    "default_sections",
    "make_mrope",
    "PAIRINGS",
    "SEGMENT_KINDS",
    "MultimodalRoPE",
    "Pairing",
    "RoPE1D",
    "RoPE2D",
    "RoPE3D",
    "RotaryEncoder",
    "RotaryLike",
    "apply_rotary",
    "expand_pairs",
    "grid_positions",
    "multimodal_positions",
]
