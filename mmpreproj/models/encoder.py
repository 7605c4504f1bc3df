"""`TokenEncoder`: the modality-free part of the native ViT and VideoViT (and the same `Block` as text).

    tokens (B, N, dim), grid  ->  [cls] + tokens + table(grid)  ->  Block(x, pos=rope positions of grid) x depth
    ->  norm  ->  class token or mean of patch tokens  ->  head

Only the `TokenPositions` differ between images and video; every block is `mmpreproj.modules.Block`, so
`mmpreproj.inject` (host row "mmpreproj_block") puts the same pre-projection and skip into any of them.
"""

from __future__ import annotations

import torch
from torch import nn

from ..modules import Block
from .positions import TokenPositions


def init_vit_weights(module: nn.Module) -> None:
    """timm's ViT init for Linear layers: truncated normal std 0.02, zero bias."""
    if isinstance(module, nn.Linear):
        nn.init.trunc_normal_(module.weight, std=0.02)
        if module.bias is not None:
            nn.init.zeros_(module.bias)


class TokenEncoder(nn.Module):
    """Blocks over a grid of tokens, with the positions passed in.

    Args:
        positions: the learned table and/or rotary encoder (`TokenPositions`).
        dim, depth, num_heads, mlp_ratio: block shape.
        class_token: prepend a learned class token (never rotated) and pool it; else mean-pool the tokens.
        num_classes: head outputs (0 = no head, `forward` returns pooled features).
    """

    def __init__(
        self,
        positions: TokenPositions,
        dim: int,
        depth: int,
        num_heads: int,
        mlp_ratio: float = 4.0,
        class_token: bool = True,
        num_classes: int = 0,
    ) -> None:
        super().__init__()
        self.positions = positions
        self.cls_token = nn.Parameter(torch.randn(1, 1, dim) * 1e-6) if class_token else None
        self.num_prefix_tokens = int(class_token)
        self.blocks = nn.ModuleList(
            Block(dim, num_heads, mlp_ratio=mlp_ratio, rope=positions.rope) for _ in range(depth)
        )
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, num_classes) if num_classes else nn.Identity()
        self.apply(init_vit_weights)

    def features(self, tokens: torch.Tensor, grid: tuple[int, ...]) -> torch.Tensor:
        """tokens (B, N, dim) of a grid -> normed tokens (B, P + N, dim), class token first."""
        x = self.positions.add_table(tokens, grid)
        if self.cls_token is not None:
            x = torch.cat((self.cls_token.expand(x.shape[0], -1, -1), x), dim=1)
        pos = self.positions.rotary(grid, x.device)  # None without a rope
        for block in self.blocks:
            x = block(x, pos=pos, num_prefix_tokens=self.num_prefix_tokens)
        return self.norm(x)

    def forward(self, tokens: torch.Tensor, grid: tuple[int, ...]) -> torch.Tensor:
        x = self.features(tokens, grid)
        pooled = x[:, 0] if self.cls_token is not None else x.mean(dim=1)  # (B, dim)
        return self.head(pooled)
