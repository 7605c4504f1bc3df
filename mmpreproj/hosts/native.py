"""mmpreproj's own `Block` (modules/block.py): any model built from it, for any modality."""

from __future__ import annotations

from torch import nn

from ..fused.native import native_fused_forward
from ..modules.block import Block
from ..modules.wrapper import AttentionCall
from .registry import HostSpec, register_host

__all__ = ["NATIVE"]


def _blocks(model: nn.Module) -> list[nn.Module]:
    return [m for m in model.modules() if isinstance(m, Block)]


NATIVE = register_host(
    HostSpec(
        name="mmpreproj_block",
        description="models built from mmpreproj.modules.Block (native ViT / video / decoder stacks)",
        matches=lambda model: isinstance(model, Block) or bool(_blocks(model)),
        blocks=_blocks,
        attention="attn",
        hidden_size=lambda model, block: block.attn.qkv.in_features,
        call=AttentionCall(inputs=((0, "x"),), output_index=None),
        input_embeddings=lambda model: None,
        fused_forward=native_fused_forward,
    )
)
