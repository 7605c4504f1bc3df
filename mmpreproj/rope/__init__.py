"""Rotary position encoders sharing one call convention: `q2, k2 = rope(q, k, pos, num_prefix_tokens=0)`.

- `RoPE1D`: token index (GPT-NeoX partial rotary, Llama, GPT-J interleaved).
- `RoPE2D`: image rows and columns (timm axial RoPE).
- `RoPE3D`: video (t, h, w) (diffusers / CogVideoX).
- `MultimodalRoPE`: Qwen2-VL M-RoPE over positions from `multimodal_positions`;
  `InterleavedMultimodalRoPE` / `make_mrope(layout=...)`: Qwen3-VL's interleaved layout.
- `use_multimodal_rope(lm)`: a transformers Llama-family decoder reads Qwen2-VL position ids (3, B, N) through
  `MultimodalRoPE` (its `rotary_emb` swapped; text positions bit-identical); `remove_multimodal_rope` undoes it.
"""

from .apply import PAIRINGS, Pairing, apply_rotary, expand_pairs
from .base import RotaryEncoder, RotaryLike
from .layouts import MROPE_LAYOUTS, InterleavedMultimodalRoPE, default_sections, make_mrope
from .mrope import MultimodalRoPE
from .positions import SEGMENT_KINDS, grid_positions, multimodal_positions
from .rope1d import RoPE1D
from .rope2d import RoPE2D
from .rope3d import RoPE3D
from .transformers_rotary import MultimodalRotaryEmbedding, remove_multimodal_rope, use_multimodal_rope

__all__ = [
    "MROPE_LAYOUTS",
    "InterleavedMultimodalRoPE",
    "default_sections",
    "make_mrope",
    "PAIRINGS",
    "SEGMENT_KINDS",
    "MultimodalRoPE",
    "MultimodalRotaryEmbedding",
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
    "remove_multimodal_rope",
    "use_multimodal_rope",
]
