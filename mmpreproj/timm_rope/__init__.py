"""Our rotary positions in timm ViTs: `add_rope` rotates the patch tokens' q/k in every block, `remove_rope` undoes it.

    add_rope(timm_vit, RoPE2D(head_dim), keep_abs_pos=False); remove_rope(timm_vit)
    rope, positions = rope_from_timm(eva.rope); add_rope(eva, rope, positions=positions)

`save_adapter` records the positions beside the adapter (`describe_rope`) and `load_adapter` restores the
built-in kinds on a plain model or refuses with the call to make (`rope_for_load`), so a reloaded model
never silently differs from the trained one.
"""

from .add import EvaPositions, RopeState, add_rope, has_rope, remove_rope
from .attention import RotaryAttention, supported_attention
from .grid import GridPositions, rope_from_timm
from .saved import describe_rope, rope_for_load

__all__ = [
    "EvaPositions",
    "GridPositions",
    "RopeState",
    "RotaryAttention",
    "add_rope",
    "describe_rope",
    "has_rope",
    "remove_rope",
    "rope_for_load",
    "rope_from_timm",
    "supported_attention",
]
