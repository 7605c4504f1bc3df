"""Vision and video: our rotary positions in timm ViTs, and native ViT / VideoViT built from `Block`.

    add_rope(timm_vit, RoPE2D(head_dim), keep_abs_pos=False); remove_rope(timm_vit)
    rope, positions = rope_from_timm(eva.rope); add_rope(eva, rope, positions=positions)
    ViT(positions="rope2d"); VideoViT(positions="rope3d")
"""

from .data import load_image_zip, read_video
from .encoder import TokenEncoder
from .fit import FitResult, accuracy, fit_classifier
from .grid import GridPositions, rope_from_timm
from .patch_embed import PatchEmbed
from .positions import LearnedPositions, TokenPositions, parse_positions
from .rotary_attention import RotaryAttention
from .timm_rope import EvaPositions, RopeState, add_rope, has_rope, remove_rope
from .video_vit import VideoViT
from .vit import ViT

__all__ = [
    "EvaPositions",
    "FitResult",
    "GridPositions",
    "LearnedPositions",
    "PatchEmbed",
    "RopeState",
    "RotaryAttention",
    "TokenEncoder",
    "TokenPositions",
    "VideoViT",
    "ViT",
    "accuracy",
    "add_rope",
    "fit_classifier",
    "has_rope",
    "load_image_zip",
    "parse_positions",
    "read_video",
    "remove_rope",
    "rope_from_timm",
]
