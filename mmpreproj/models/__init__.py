"""Native models built from `mmpreproj.modules.Block`: a ViT and a video ViT whose positions are passed in.

    ViT(positions="rope2d")            # images (B, C, H, W) -> logits; any size (rotary positions follow the grid)
    VideoViT(positions="rope3d")       # clips (B, C, T, H, W) -> logits; any length and size

Both are a `PatchEmbed` and a `TokenEncoder` (class token, blocks, norm, pooling, head); only the
`TokenPositions` differ (a learned table, a rotary encoder from `mmpreproj.rope`, both, or none). Every
block is the same `Block` as a native text decoder, so `mmpreproj.inject` (host row "mmpreproj_block")
puts the pre-projection and skip into any of them.
"""

from .encoder import TokenEncoder
from .patch_embed import PatchEmbed
from .positions import LearnedPositions, TokenPositions, parse_positions
from .video_vit import VideoViT
from .vit import ViT

__all__ = ["LearnedPositions", "PatchEmbed", "TokenEncoder", "TokenPositions", "VideoViT", "ViT", "parse_positions"]
